"""Calls named by a key of the client's choosing: each key names one call, made once.

    CallKey(principal, key)                    a key, as a front passes it to the toolbox
    claim(conn, insert, agent_id, key, run_id, seq, now)   in the call's first transaction
    KeyHeld(run_id, seq)                       raised by claim: the key names a call already
    keyed(conn, agent_id, key) -> Keyed | None  the call a key names, its owner, whether it was sent

A key is its agent's and its principal's (the token of the MCP endpoint): the same
key sent by another token names another call. ``claim`` inserts the key's row in
the transaction that gives the call its seq (``Store.begin_call``); when the row is
there already it raises KeyHeld, which rolls that transaction back, so the call
takes no seq and runs nothing. On PostgreSQL the insert waits for another
transaction inserting the same key, then finds its row: two calls with one key,
at once on two servers, make one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .owners import Owner
from .schema import call_keys, calls, owners
from .statements import utc_row
from .values import CallRecord


@dataclass(frozen=True)
class CallKey:
    principal: str
    """Whose key: the MCP endpoint's token fingerprint, "" where no token is asked."""
    key: str


class KeyHeld(Exception):
    """The key names a call already: run_id and seq."""

    def __init__(self, run_id: str, seq: int):
        super().__init__(f"the key names call {seq} of run {run_id}")
        self.run_id, self.seq = run_id, seq


@dataclass(frozen=True)
class Keyed:
    """The call a key names, as the record holds it now."""

    call: CallRecord
    sent: bool
    """Its request may have reached the sandbox (``Store.mark_key_sent``, just before it was sent)."""
    owner_id: str | None
    """The process running it (None once it ended)."""
    owner: Owner | None
    """That process's entry; None when it ended or is no longer registered."""


def _where(agent_id: str, key: CallKey) -> Any:
    return sa.and_(call_keys.c.agent_id == agent_id, call_keys.c.principal == key.principal,
                   call_keys.c.key == key.key)


def claim(conn: sa.Connection, insert: Any, agent_id: str, key: CallKey, run_id: str, seq: int,
          now: datetime) -> None:
    """Make the key's row for call seq of run_id; KeyHeld naming the key's call when it has one.
    ``insert``: the dialect's (``on_conflict_do_nothing``)."""
    made = conn.execute(insert(call_keys).values(agent_id=agent_id, principal=key.principal, key=key.key,
                                                 run_id=run_id, seq=seq, sent=False, at=now)
                        .on_conflict_do_nothing())
    if made.rowcount == 0:
        held = conn.execute(sa.select(call_keys.c.run_id, call_keys.c.seq).where(_where(agent_id, key))).one()
        raise KeyHeld(held.run_id, held.seq)


def mark_sent(conn: sa.Connection, agent_id: str, key: CallKey) -> None:
    conn.execute(sa.update(call_keys).where(_where(agent_id, key)).values(sent=True))


def keyed(conn: sa.Connection, agent_id: str, key: CallKey) -> Keyed | None:
    query = (sa.select(call_keys.c.sent, calls, *[c.label(f"owner_{c.name}") for c in owners.c])
             .select_from(call_keys.join(calls, sa.and_(calls.c.run_id == call_keys.c.run_id,
                                                         calls.c.seq == call_keys.c.seq))
                          .outerjoin(owners, owners.c.id == calls.c.owner))
             .where(_where(agent_id, key)))
    row = conn.execute(query).mappings().first()
    if row is None:
        return None
    entry = {c.name: row[f"owner_{c.name}"] for c in owners.c}
    owner = Owner(**utc_row(entry)) if entry["id"] is not None else None
    return Keyed(CallRecord.from_row(row), bool(row["sent"]), row["owner"], owner)
