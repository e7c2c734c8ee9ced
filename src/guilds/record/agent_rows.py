"""The agents made on demand, as the run record keeps them (the ``agents`` table).

    admit(conn, row, caps)       insert a ``making`` agent if the caps allow it, else AgentRefused
    adopt(conn, ids, owner...)   a ``pooled`` agent of ids made ``live``, the owner's, within its cap
    adopt_each(conn, ids, ...)   up to n of them so, in one transaction (a fork's children)
    mark(conn, id, status, at)   making -> live or pooled, live -> removed (only from given statuses)
    expire(conn, id, at)         a live agent's new expiry
    forget(conn, id)             drop the row of a make that failed: nothing of it stays
    read(conn, where...)         AgentRecord rows

A make counts against the caps from its first row (``making``) to its removal,
so makes at once never pass them: on SQLite the one writer orders them, on
PostgreSQL a transaction-level advisory lock does.

The warm pool's agents (``guilds.agents.pool``) are made as ``making`` and held
as ``pooled``, owned by the pool (``pool:<machine>:<pid>:<start>``, the process
holding them). They count against the server's cap, never an owner's. A make
that finds the server at its cap takes the place of one of the pool's agents
its process names (``evictable``: ready ones first, then those being made):
that one becomes ``retiring`` in the same transaction, no longer counted, and
its process removes it (one being made sees it at its end, and undoes itself). An adoption turns a
pooled agent ``live`` for its owner in the transaction that checks the owner's
cap: the server's count does not change.

Each row holds the uid its agent runs as on bwrap under a root orchestrator
(``uid``). A make is admitted only when no other agent of the record that is
being made, live, pooled or retiring holds that uid (``UidTaken`` otherwise),
in the same transaction, so two agents never share one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Mapping, Sequence

import sqlalchemy as sa

from ..errors import BadInput
from .schema import agents

MAKING, LIVE, REMOVED = "making", "live", "removed"
POOLED, RETIRING = "pooled", "retiring"
HELD = (MAKING, LIVE)
"""The statuses that count against an owner's cap."""
ON_SERVER = (MAKING, LIVE, POOLED)
"""The statuses that count against the server's cap."""
RUNNING = (MAKING, LIVE, POOLED, RETIRING)
"""The statuses of an agent whose sandbox may run: its uid is its own."""
AGENTS_LOCK_KEY = 0x6775_696C_6461
"""PostgreSQL's advisory lock around a make's count and insert."""


class AgentRefused(BadInput):
    """A make past a cap: the message names the cap and its setting."""


class UidTaken(AgentRefused):
    """A make whose agent's uid another running agent holds: made again under another id."""


@dataclass(frozen=True, kw_only=True)
class AgentRecord:
    """One agent made on demand, as recorded."""

    id: str
    template: str
    owner: str
    sandbox: str
    home: str
    status: str
    created_at: datetime
    expires_at: datetime | None = None
    removed_at: datetime | None = None
    uid: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> AgentRecord:
        values: dict[str, Any] = {str(key): _utc(value) if isinstance(value, datetime) else value
                                  for key, value in row.items()}
        return cls(**values)

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def _utc(at: datetime) -> datetime:
    """SQLite hands a time back naive; it was written in UTC."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _counted(conn: sa.Connection, statuses: tuple[str, ...], *where: Any) -> int:
    query = sa.select(sa.func.count()).select_from(agents).where(agents.c.status.in_(statuses), *where)
    return int(conn.execute(query).scalar_one())


def _lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AGENTS_LOCK_KEY})


def _owner_within(conn: sa.Connection, owner: str, max_per_owner: int) -> None:
    if _counted(conn, HELD, agents.c.owner == owner) >= max_per_owner:
        raise _owner_full(owner, max_per_owner)


def _owner_full(owner: str, max_per_owner: int) -> AgentRefused:
    return AgentRefused(f"owner {owner!r} holds {max_per_owner} agents, the most one owner may "
                        f"(agents.max_per_owner); remove one first")


def _server_full(max_total: int) -> AgentRefused:
    return AgentRefused(f"this server holds {max_total} agents, its most (agents.max); remove one first")


def _uid_taken(uid: int) -> UidTaken:
    return UidTaken(f"uid {uid}: another agent of this data folder runs as it")


def _uid_free(conn: sa.Connection, uid: int | None) -> None:
    if uid is not None and _counted(conn, RUNNING, agents.c.uid == uid):
        raise _uid_taken(uid)


def _retire_one(conn: sa.Connection, evictable: Sequence[str]) -> str | None:
    """The first of evictable still pooled or being made for a pool made ``retiring``; its id, or None."""
    for agent_id in evictable:
        retire = sa.update(agents).where(agents.c.id == agent_id, agents.c.status.in_((POOLED, MAKING)))
        if conn.execute(retire.values(status=RETIRING)).rowcount:
            return agent_id
    return None


def admit(conn: sa.Connection, row: Mapping[str, Any], max_total: int, max_per_owner: int,
          evictable: Sequence[str] = ()) -> str | None:
    """Insert the agent as ``making`` when the server holds fewer than max_total and its owner
    fewer than max_per_owner (AgentRefused naming the cap otherwise), and no running agent
    holds its uid (UidTaken otherwise). At the server's cap, one
    of the pooled agents ``evictable`` names is retired to make room: its id is returned."""
    _lock(conn)
    retired = None
    if _counted(conn, ON_SERVER) >= max_total:
        retired = _retire_one(conn, evictable)
        if retired is None:
            raise _server_full(max_total)
    _owner_within(conn, row["owner"], max_per_owner)
    _uid_free(conn, row.get("uid"))
    conn.execute(sa.insert(agents).values(**row, status=MAKING))
    return retired


def admit_all(conn: sa.Connection, rows: Sequence[Mapping[str, Any]], max_total: int, max_per_owner: int,
              evictable: Sequence[str] = ()) -> list[str]:
    """``admit`` of every row, in the caller's one transaction, the counts read once (a refusal
    of any raised: the transaction then keeps none); the ids of the pooled agents retired to
    make room, one for each row past the server's cap."""
    _lock(conn)
    on_server, held, retired = _counted(conn, ON_SERVER), {}, []
    uids = set(conn.execute(sa.select(agents.c.uid).where(agents.c.status.in_(RUNNING),
                                                          agents.c.uid.is_not(None))).scalars())
    for row in rows:
        if on_server >= max_total:  # a pooled agent retired leaves the server's count as it was
            gone = _retire_one(conn, evictable)
            if gone is None:
                raise _server_full(max_total)
            retired.append(gone)
        else:
            on_server += 1
        owner, uid = row["owner"], row.get("uid")
        if owner not in held:
            held[owner] = _counted(conn, HELD, agents.c.owner == owner)
        if held[owner] >= max_per_owner:
            raise _owner_full(owner, max_per_owner)
        held[owner] += 1
        if uid is not None and uid in uids:
            raise _uid_taken(uid)
        uids.add(uid)
    conn.execute(sa.insert(agents), [{**row, "status": MAKING} for row in rows])
    return retired


def mark_all(conn: sa.Connection, agent_ids: Sequence[str], status: str) -> int:
    """Set the status of every agent of agent_ids (not ``removed``); the rows changed."""
    return conn.execute(sa.update(agents).where(agents.c.id.in_(list(agent_ids))).values(status=status)).rowcount


def adopt(conn: sa.Connection, candidates: Sequence[str], change: Mapping[str, Any], max_per_owner: int) -> str | None:
    """The first of candidates still ``pooled`` made ``live`` with ``change`` (owner, created_at,
    expires_at), within the owner's cap (AgentRefused past it); its id, None when none is pooled."""
    _lock(conn)
    _owner_within(conn, change["owner"], max_per_owner)
    for agent_id in candidates:
        taken = sa.update(agents).where(agents.c.id == agent_id, agents.c.status == POOLED)
        if conn.execute(taken.values(**change, status=LIVE)).rowcount:
            return agent_id
    return None


def adopt_each(conn: sa.Connection, candidates: Sequence[str], change: Mapping[str, Any], max_per_owner: int,
               n: int) -> tuple[list[str], int]:
    """Up to n of candidates still ``pooled``, in order, each made ``live`` with ``change`` while
    the owner is within its cap (AgentRefused when it is at it already): the ids taken, and how
    many candidates were looked at (one looked at and not taken is no longer pooled)."""
    _lock(conn)
    room = max_per_owner - _counted(conn, HELD, agents.c.owner == change["owner"])
    if room <= 0:
        raise _owner_full(change["owner"], max_per_owner)
    taken: list[str] = []
    looked = 0
    for agent_id in candidates:
        if len(taken) >= min(n, room):
            break
        looked += 1
        adopted = sa.update(agents).where(agents.c.id == agent_id, agents.c.status == POOLED)
        if conn.execute(adopted.values(**change, status=LIVE)).rowcount:
            taken.append(agent_id)
    return taken, looked


def hand_over(conn: sa.Connection, agent_id: str, holder: str, new_holder: str) -> bool:
    """A pooled agent of holder (a process gone) taken by new_holder; False when it was not so."""
    change = sa.update(agents).where(agents.c.id == agent_id, agents.c.owner == holder, agents.c.status == POOLED)
    return bool(conn.execute(change.values(owner=new_holder)).rowcount)


def mark(conn: sa.Connection, agent_id: str, status: str, at: datetime | None = None,
         only_from: Sequence[str] = ()) -> int:
    """Set the agent's status (removed: and when), when it has one of only_from if given; the rows changed."""
    values: dict[str, Any] = {"status": status}
    if status == REMOVED:
        values["removed_at"] = at
    where = [agents.c.id == agent_id, *([agents.c.status.in_(list(only_from))] if only_from else [])]
    return conn.execute(sa.update(agents).where(*where).values(**values)).rowcount


def expire(conn: sa.Connection, agent_id: str, expires_at: datetime | None) -> int:
    """Give a live agent a new expiry (None: never); the rows changed."""
    change = sa.update(agents).where(agents.c.id == agent_id, agents.c.status == LIVE).values(expires_at=expires_at)
    return conn.execute(change).rowcount


def forget(conn: sa.Connection, agent_id: str) -> None:
    """Drop the row of an agent whose make failed."""
    conn.execute(sa.delete(agents).where(agents.c.id == agent_id))


def read(conn: sa.Connection, *where: Any) -> list[AgentRecord]:
    """The agents matching where, oldest first."""
    query = sa.select(agents).where(*where).order_by(agents.c.created_at, agents.c.id)
    return [AgentRecord.from_row(r) for r in conn.execute(query).mappings()]
