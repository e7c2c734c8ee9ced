"""The record's statements, built once, and the steps of a call's record as
functions of a plain synchronous connection (``Store`` runs each in one
transaction).

Seqs and budget slots are given out by one ``INSERT INTO runs ... ON CONFLICT DO
UPDATE ... RETURNING`` (``allocate_statement``) in the transaction that inserts
the call: atomic on PostgreSQL (a row lock) and on SQLite (one writer), so
concurrent calls of one run, from one process or many, never share a seq and
never pass the budget. A call's end adds its amounts to its run's totals in the
same transaction (``finish``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Mapping

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles

from .owners import LOST
from .rows import row_text
from .schema import SAVINGS_COLUMNS, calls, context_marks, owners, runs
from .values import Savings, answer_bytes, answer_text, call_savings

FLOW_PAGE = 200
"""Calls per page of a run's flow: the newest first, then "Load earlier"."""
FLOW_COLUMNS = [c for c in calls.c if c.name != "text"] + [
    sa.case((calls.c.tool == "code_task", calls.c.text), else_=None).label("text")
]
INSERT_CALL = sa.insert(calls)
FINISH_CALL = sa.update(calls).where(
    calls.c.run_id == sa.bindparam("k_run_id"), calls.c.seq == sa.bindparam("k_seq")
)
_FINISH_RUNNING = FINISH_CALL.where(calls.c.status == "running")
_SAVINGS_PARAMS = [f"d_{name}" for name in SAVINGS_COLUMNS]
_ADD_SAVINGS = sa.update(runs).where(runs.c.id == sa.bindparam("k_run_id")).values(
    {name: runs.c[name] + sa.bindparam(param) for name, param in zip(SAVINGS_COLUMNS, _SAVINGS_PARAMS, strict=True)})
CALL_WRITES = (INSERT_CALL, _FINISH_RUNNING, _ADD_SAVINGS)
"""The statements of a call's start (with ``allocate_statement``'s) and of its end
when nothing else ended it first: those a SQLite record prepares (``record.prepared``)."""
ORPHANED = sa.select(calls.c.owner).distinct().where(calls.c.owner.is_not(None),
                                                      calls.c.owner.not_in(sa.select(owners.c.id)))
"""Owners of running calls that are no longer registered (closed while a call ran)."""
RUNNING = sa.select(calls.c.run_id, calls.c.seq, calls.c.tool, calls.c.args, calls.c.started_at)


class _Utf8Bytes(sa.sql.expression.FunctionElement):
    """A text column's size in UTF-8 bytes (SQLite before 3.43 has no octet_length)."""

    type = sa.Integer()
    name = "utf8_bytes"
    inherit_cache = True


@compiles(_Utf8Bytes)
def _octet_length(element: Any, compiler: Any, **kw: Any) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


@compiles(_Utf8Bytes, "sqlite")
def _blob_length(element: Any, compiler: Any, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


_FILE_READS = (
    sa.select(calls.c.seq, calls.c.meta, _Utf8Bytes(calls.c.text),
              sa.func.substr(calls.c.text, sa.func.length(calls.c.text), 1), calls.c.remaining)
    .where(calls.c.run_id == sa.bindparam("run_id"), calls.c.tool == "file_read", calls.c.status == "done",
           calls.c.is_error.is_(False), calls.c.cut.is_(False), calls.c.seq < sa.bindparam("before_seq"))
    .order_by(calls.c.seq)
)
"""Built once: building it per call (and its cache key) was a third of the ledger's query time."""
_RESET_SEQ = sa.select(sa.func.max(context_marks.c.after_seq)).where(
    context_marks.c.run_id == sa.bindparam("run_id"), context_marks.c.from_seq.is_(None))
_REWOUND = sa.select(context_marks.c.from_seq, context_marks.c.after_seq).where(
    context_marks.c.run_id == sa.bindparam("run_id"), context_marks.c.from_seq.is_not(None))


def allocate_statement(dialect: Any) -> Any:
    """Make the run if new and take the next seq and, within the budget, a slot: one statement.

    Under ON CONFLICT ... SET the right-hand sides read the row as it was, so
    admitted_seq == next_seq afterwards exactly when this call got a slot.
    """
    now: Any = sa.bindparam("now")
    budget: Any = sa.bindparam("budget")
    insert = dialect.insert(runs).values(
        id=sa.bindparam("run_id"), agent_id=sa.bindparam("agent_id"), created_at=now,
        updated_at=now, next_seq=1, used_calls=1, admitted_seq=1,
    )
    has_room = runs.c.used_calls < budget
    return insert.on_conflict_do_update(index_elements=["id"], set_={
        "next_seq": runs.c.next_seq + 1,
        "updated_at": insert.excluded.updated_at,
        "used_calls": sa.case((has_room, runs.c.used_calls + 1), else_=runs.c.used_calls),
        "admitted_seq": sa.case((has_room, runs.c.next_seq + 1), else_=runs.c.admitted_seq),
    }).returning(runs.c.agent_id, runs.c.next_seq, runs.c.used_calls, runs.c.admitted_seq)


def utc_now() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """A moment of the record in UTC (SQLite hands it back naive; it was written in UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def utc_row(row: Mapping[Any, Any], *columns: str) -> dict[str, Any]:
    """A row, its moments in columns (an owners row's heartbeat by default) in UTC."""
    return {**row, **{name: as_utc(row[name]) for name in columns or ("heartbeat_at",)}}


def _lost(call: Any, now: datetime) -> dict[str, Any]:
    """The finish of a call whose process is gone: an error, "· lost" on its row."""
    started = call.started_at if call.started_at.tzinfo else call.started_at.replace(tzinfo=UTC)
    return {"k_run_id": call.run_id, "k_seq": call.seq, "text": LOST, "is_error": True, "meta": None,
            "cut": False, "status": "lost", "finished_at": now, "owner": None,
            "row": f"{row_text(call.tool, call.args, {}, False)} · lost",
            "duration_ms": max(0, round((now - started).total_seconds() * 1000))}


def file_reads(conn: sa.Connection, run_id: str, before_seq: int) -> list[tuple[int, dict, int]]:
    rows = conn.execute(_FILE_READS, {"run_id": run_id, "before_seq": before_seq})
    return [(seq, meta, answer_bytes(size or 0, last or "", remaining)) for seq, meta, size, last, remaining in rows]


def reset_seq(conn: sa.Connection, run_id: str) -> int:
    return conn.execute(_RESET_SEQ, {"run_id": run_id}).scalar() or 0


def rewound_spans(conn: sa.Connection, run_id: str) -> list[tuple[int, int]]:
    """(from_seq, after_seq) of each rewind of the run's files: the calls whose reads no longer stand."""
    return [(first, last) for first, last in conn.execute(_REWOUND, {"run_id": run_id})]


def _savings(finish: Mapping[str, Any]) -> Savings:
    """The amounts of a call finished with these FINISH_CALL parameters."""
    return call_savings(answer_text(finish["text"], finish.get("remaining")), finish["meta"])


def add_savings(conn: sa.Connection, per_run: Mapping[str, Savings]) -> None:
    """Add to each run's totals (in run id order: two writers lock runs rows in one order)."""
    changes = [{"k_run_id": run_id, **dict(zip(_SAVINGS_PARAMS, amounts.amounts(), strict=True))}
               for run_id, amounts in sorted(per_run.items()) if amounts != Savings()]
    if changes:
        conn.execute(_ADD_SAVINGS, changes)


def finish(conn: sa.Connection, finish: Mapping[str, Any]) -> None:
    """Record a call's end and add its amounts to its run's totals.

    A call already ended (recorded lost while its process was only slow) has its
    old amounts taken back, so the totals stay the sum over the calls as they are."""
    run_id, seq = finish["k_run_id"], finish["k_seq"]
    if conn.execute(_FINISH_RUNNING, finish).rowcount:
        add_savings(conn, {run_id: _savings(finish)})
        return
    old = conn.execute(sa.select(calls.c.text, calls.c.remaining, calls.c.meta)
                       .where(calls.c.run_id == run_id, calls.c.seq == seq)).first()
    if old is not None:
        conn.execute(FINISH_CALL, finish)
        add_savings(conn, {run_id: _savings(finish) - call_savings(answer_text(old.text, old.remaining), old.meta)})


def finish_lost(conn: sa.Connection, running: Any, now: datetime) -> list[tuple[str, int]]:
    """Record as lost those of these calls that are still running, with their runs' totals; their (run, seq)."""
    lost: list[tuple[str, int]] = []
    per_run: dict[str, Savings] = {}
    for call in sorted(running, key=lambda c: (c.run_id, c.seq)):
        finish = _lost(call, now)
        if conn.execute(_FINISH_RUNNING, finish).rowcount:
            lost.append((call.run_id, call.seq))
            per_run[call.run_id] = per_run.get(call.run_id, Savings()) + _savings(finish)
    add_savings(conn, per_run)
    return lost
