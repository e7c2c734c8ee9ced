"""The read ledger: which earlier file_read results a new read may point to.

Each file_read is recorded with the call (its metadata holds ``path``, the
resolved absolute path; ``range``, ``[first, last]``; ``content_hash``; and the
call's seq). A new file_read hands the helper every earlier read of its run
that may be pointed to: one that did not fail, was not cut by the pipeline,
and was not itself a pointer (``repeat_of``). The helper resolves the new
path, so it, not the toolbox, picks among them; all eligible reads are passed
(a run makes at most ``max_tool_calls`` calls, so the list stays small, and a
request too large for argv travels as a request file).

The ledger is read from the run record, not kept in memory: a run continued
by another process (``guilds call --run``) or another orchestrator sees the same.

After the run's model context was compacted or rewound (``Toolbox.context_reset``,
recorded in the store's context_marks), a read made before that point is not
offered: the model may no longer hold its text, so the next read returns content.
"""

from __future__ import annotations

from typing import Any, Mapping, TypeGuard

from ..store import Store


def _is_range(value: Any) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in value)
    )


def ledger_entry(seq: int, meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A finished, uncut, successful file_read's ledger entry; None if it may not be pointed to."""
    if not meta or meta.get("repeat_of") is not None:
        return None
    path, span, digest = meta.get("path"), meta.get("range"), meta.get("content_hash")
    if not (isinstance(path, str) and isinstance(digest, str) and _is_range(span)):
        return None
    return {"path": path, "range": list(span), "content_hash": digest, "seq": seq}


async def earlier_reads(store: Store, run_id: str, seq: int) -> list[dict[str, Any]]:
    """The reads a file_read at `seq` may point to, oldest first (none for a run's first call)."""
    if seq <= 1:
        return []
    entries = (ledger_entry(s, meta) for s, meta in await store.reads_since_reset(run_id, seq))
    return [e for e in entries if e is not None]
