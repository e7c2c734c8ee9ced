"""Bring a run record written by an older version up to date, once, at setup.

Older versions kept a call's answer whole (the body with the trailer's
``remaining_tool_calls: N`` line at its end) and repeated the call's fields
(``values.CALL_FIELDS``) inside its metadata. This adds the ``remaining``
column where it is missing, splits each finished call's text into body and
count, and drops the repeated fields from its metadata. A call already split
(``remaining`` set) is left alone, so running it again changes nothing.

Older versions also kept no totals on a run: where its ``runs`` table lacks
them this adds the columns (``schema.SAVINGS_COLUMNS``) and fills them from the
calls recorded so far, in the transaction that adds them, so a second run
finds them and adds nothing.

Tasks made before a command's task kept the call that started it get the
``background_call`` column, empty: such a task cannot name its command, and
reads it ended (guilds/fronts/mcp_tasks.py).

Context marks made before a rewind of a run's files could be recorded get the
``from_seq`` column, empty: each of them is a context reset.

Agents made on demand before their uid was recorded get the ``uid`` column,
filled for those not removed with the uid derived from their id (the one
their sandbox runs as), so a new agent is checked against them too.

Owners registered before a server said where it answers get the ``address``
column, empty: they are found gone by their heartbeat alone.

A PostgreSQL record whose ``calls.duration_ms`` is a 32-bit integer gets a
64-bit one: a call lost after running more than 24.8 days is recorded with its
whole duration (SQLite's integers are 64-bit already).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterator, Sequence

import sqlalchemy as sa

from ..config.uids import agent_uid
from .schema import SAVINGS_COLUMNS, agents, calls
from .statements import add_savings
from .values import CALL_FIELDS, TRAILER, Savings, answer_text, call_savings

_TRAILER_RE = re.compile("\n?" + re.escape(TRAILER).replace(r"\{n\}", r"(\d+)") + r"\n?\Z")
BATCH = 500
"""Calls read and rewritten at a time."""


def split_trailer(text: str) -> tuple[str, str]:
    """(body, trailer): an older answer's ``remaining_tool_calls: N`` last line apart."""
    match = _TRAILER_RE.search(text)
    if not match:
        return text, ""
    return text[: match.start()], match.group().strip("\n")


def split_answer(text: str) -> tuple[str, int | None]:
    """(body, N) of an older answer; (text, None) when it has no trailer."""
    match = _TRAILER_RE.search(text)
    return (text[: match.start()], int(match.group(1))) if match else (text, None)


def migrate(conn: sa.Connection) -> None:
    """Add what the record lacks and split what older versions kept joined (sync, in a transaction)."""
    if conn.dialect.name == "sqlite":
        # A write first: it takes the one writer's lock (a racing process waits here) and opens
        # the transaction, so the ALTERs below are part of it (SQLite's driver runs DDL outside one).
        conn.execute(sa.text("UPDATE runs SET id = id WHERE 0"))
    if "remaining" not in _columns(conn, "calls"):
        conn.execute(sa.text("ALTER TABLE calls ADD COLUMN remaining INTEGER"))
    _split_old_calls(conn)
    if not set(SAVINGS_COLUMNS) & _columns(conn, "runs"):
        for name in SAVINGS_COLUMNS:
            conn.execute(sa.text(f"ALTER TABLE runs ADD COLUMN {name} BIGINT NOT NULL DEFAULT 0"))
        _fill_savings(conn)
    task_columns = _columns(conn, "tasks")
    if "background_call" not in task_columns:
        conn.execute(sa.text("ALTER TABLE tasks ADD COLUMN background_call VARCHAR(128)"))
    if "cancel_asked" not in task_columns:
        kind = "TIMESTAMP WITH TIME ZONE" if conn.dialect.name == "postgresql" else "DATETIME"
        conn.execute(sa.text(f"ALTER TABLE tasks ADD COLUMN cancel_asked {kind}"))
    if "from_seq" not in _columns(conn, "context_marks"):
        conn.execute(sa.text("ALTER TABLE context_marks ADD COLUMN from_seq INTEGER"))
    if "uid" not in _columns(conn, "agents"):
        conn.execute(sa.text("ALTER TABLE agents ADD COLUMN uid BIGINT"))
        _fill_agent_uids(conn)
    if "address" not in _columns(conn, "owners"):
        conn.execute(sa.text("ALTER TABLE owners ADD COLUMN address VARCHAR(255)"))
    _widen_durations(conn)


def durations_are_wide(conn: sa.Connection) -> bool:
    """Does ``calls.duration_ms`` hold 64-bit values (always so on SQLite)?"""
    if conn.dialect.name != "postgresql":
        return True
    kind = next(c["type"] for c in sa.inspect(conn).get_columns("calls") if c["name"] == "duration_ms")
    return isinstance(kind, sa.BigInteger)


def _widen_durations(conn: sa.Connection) -> None:
    if not durations_are_wide(conn):
        conn.execute(sa.text("ALTER TABLE calls ALTER COLUMN duration_ms TYPE BIGINT"))


def _columns(conn: sa.Connection, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(conn).get_columns(table)}


def _finished_calls(conn: sa.Connection, columns: Sequence[Any], *where: Any) -> Iterator[Sequence[Any]]:
    """Batches of (run_id, seq, *columns) of the calls with a result, in (run_id, seq) order."""
    pending = (sa.select(calls.c.run_id, calls.c.seq, *columns)
               .where(calls.c.text.is_not(None), *where,
                      sa.tuple_(calls.c.run_id, calls.c.seq) > sa.tuple_(sa.bindparam("run"), sa.bindparam("seq")))
               .order_by(calls.c.run_id, calls.c.seq).limit(BATCH))
    after = {"run": "", "seq": 0}
    while rows := conn.execute(pending, after).all():
        yield rows
        after = {"run": rows[-1][0], "seq": rows[-1][1]}


def _split_old_calls(conn: sa.Connection) -> None:
    update = sa.update(calls).where(calls.c.run_id == sa.bindparam("k_run"), calls.c.seq == sa.bindparam("k_seq"))
    for rows in _finished_calls(conn, [calls.c.text, calls.c.meta], calls.c.remaining.is_(None)):
        changes = []
        for run_id, seq, text, meta in rows:
            body, remaining = split_answer(text)
            if remaining is not None:
                kept = {k: v for k, v in meta.items() if k not in CALL_FIELDS} if isinstance(meta, dict) else meta
                changes.append({"k_run": run_id, "k_seq": seq, "text": body, "meta": kept, "remaining": remaining})
        if changes:
            conn.execute(update, changes)


def _fill_savings(conn: sa.Connection) -> None:
    """Each run's totals from its calls, as ``store`` adds them at each call's end."""
    for rows in _finished_calls(conn, [calls.c.text, calls.c.remaining, calls.c.meta]):
        per_run: defaultdict[str, Savings] = defaultdict(Savings)
        for run_id, _seq, text, remaining, meta in rows:
            per_run[run_id] += call_savings(answer_text(text, remaining), meta)
        add_savings(conn, per_run)


def _fill_agent_uids(conn: sa.Connection) -> None:
    """The uid of each agent not removed, derived from its id as its sandbox derives it."""
    ids = conn.execute(sa.select(agents.c.id).where(agents.c.status != "removed")).scalars().all()
    if ids:
        update = sa.update(agents).where(agents.c.id == sa.bindparam("k_id"))
        conn.execute(update, [{"k_id": agent_id, "uid": agent_uid(agent_id)} for agent_id in ids])
