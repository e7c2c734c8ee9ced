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

Each entry's result size comes with it (the record measures the stored text), so a
pointer's savings (``pointer_bytes_saved``) need not read the earlier text again.

After the run's model context was compacted or rewound (``Toolbox.context_reset``,
recorded in the store's context_marks), a read made before that point is not
offered: the model may no longer hold its text, so the next read returns content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, TypeGuard

if TYPE_CHECKING:  # the tool definitions load without the run record's database layer
    from ..record.store import Store


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


@dataclass(frozen=True)
class Ledger:
    """The reads a file_read may point to: ``entries`` as the helper gets them, oldest
    first, and each one's result size (UTF-8 bytes, as the model got it) by seq."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)

    def size_of(self, seq: Any) -> int | None:
        """The size of the result of the entry with this seq (a pointer's repeat_of), or None."""
        return self.sizes.get(seq) if isinstance(seq, int) and not isinstance(seq, bool) else None


async def read_ledger(store: Store, run_id: str, seq: int) -> Ledger:
    """The ledger of a file_read at `seq` (empty for a run's first call)."""
    if seq <= 1:
        return Ledger()
    entries, sizes = [], {}
    for earlier, meta, size in await store.reads_since_reset(run_id, seq):
        entry = ledger_entry(earlier, meta)
        if entry is not None:
            entries.append(entry)
            sizes[earlier] = size
    return Ledger(entries, sizes)
