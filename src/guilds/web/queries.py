"""Read queries the app needs beyond ``Store``'s own, over the store's tables.

The flow is paged by seq on the calls table's primary key ``(run_id, seq)``,
newest page first. A flow row needs a call's tool, row, status, arguments and
metadata, not its result text: the text (up to 64 KiB a call) is selected
only for code_task calls, whose block shows their final message.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..records import CallRecord, RunRecord
from ..store import Store, calls, runs

FLOW_PAGE = 200
"""Calls per page of a run's flow: the newest first, then "Load earlier"."""

_FLOW_COLUMNS = [c for c in calls.c if c.name != "text"] + [
    sa.case((calls.c.tool == "code_task", calls.c.text), else_=None).label("text")
]


async def get_run(store: Store, run_id: str) -> RunRecord | None:
    """One run, or None."""
    async with store.engine.connect() as conn:
        row = (await conn.execute(sa.select(runs).where(runs.c.id == run_id))).mappings().first()
    return RunRecord.from_row(row) if row else None


async def flow_before(store: Store, run_id: str, before_seq: int | None = None,
                      limit: int = FLOW_PAGE) -> list[CallRecord]:
    """The last ``limit`` calls of a run before ``before_seq`` (all when None), in seq order."""
    query = sa.select(*_FLOW_COLUMNS).where(calls.c.run_id == run_id)
    if before_seq is not None:
        query = query.where(calls.c.seq < before_seq)
    query = query.order_by(calls.c.seq.desc()).limit(limit)
    async with store.engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [CallRecord.from_row(r) for r in reversed(rows)]


async def flow_after(store: Store, run_id: str, after_seq: int, limit: int = FLOW_PAGE) -> list[CallRecord]:
    """The first ``limit`` calls of a run after ``after_seq``, in seq order (for live updates)."""
    query = (sa.select(*_FLOW_COLUMNS).where(calls.c.run_id == run_id, calls.c.seq > after_seq)
             .order_by(calls.c.seq).limit(limit))
    async with store.engine.connect() as conn:
        return [CallRecord.from_row(r) for r in (await conn.execute(query)).mappings()]
