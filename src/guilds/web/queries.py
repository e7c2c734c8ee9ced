"""The app's reads of the run record, each one of ``Store``'s own queries.

The app sees no table and no engine: the store owns every query
(``Store.get_run``, ``flow_before``, ``flow_after``); these name them for the routes.
"""

from __future__ import annotations

from ..record.statements import FLOW_PAGE
from ..record.store import Store
from ..record.values import CallRecord, RunRecord

__all__ = ["FLOW_PAGE", "flow_after", "flow_before", "get_run"]


async def get_run(store: Store, run_id: str) -> RunRecord | None:
    """One run, or None."""
    return await store.get_run(run_id)


async def flow_before(store: Store, run_id: str, before_seq: int | None = None,
                      limit: int = FLOW_PAGE) -> list[CallRecord]:
    """The last ``limit`` calls of a run before ``before_seq`` (all when None), in seq order."""
    return await store.flow_before(run_id, before_seq, limit)


async def flow_after(store: Store, run_id: str, after_seq: int, limit: int = FLOW_PAGE) -> list[CallRecord]:
    """The first ``limit`` calls of a run after ``after_seq``, in seq order (for live updates)."""
    return await store.flow_after(run_id, after_seq, limit)
