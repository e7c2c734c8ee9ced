"""The read ledger: which earlier reads a file_read may point to."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from guilds.store import Store
from guilds.toolbox.ledger import earlier_reads, ledger_entry

META = {"path": "/home/a/x.py", "range": [1, 20], "content_hash": "ab12", "lines": 20}


@pytest.mark.parametrize(
    ("meta", "entry"),
    [
        (META, {"path": "/home/a/x.py", "range": [1, 20], "content_hash": "ab12", "seq": 4}),
        ({**META, "repeat_of": 2}, None),  # a pointer is never pointed to
        ({**META, "range": None}, None),  # an empty file or an offset past the end
        ({**META, "range": [1, True]}, None),
        ({k: v for k, v in META.items() if k != "content_hash"}, None),  # a binary file
        ({}, None),
        (None, None),
    ],
)
def test_ledger_entry(meta, entry):
    assert ledger_entry(4, meta) == entry


async def test_earlier_reads_skips_failed_cut_and_pointer_reads(tmp_path):
    t = datetime.now(UTC)
    async with Store(f"sqlite:///{tmp_path}/g.db") as store:
        async def read(meta, **kw):
            slot = await store.begin_call(run_id="r", agent_id="a", tool="file_read", args={}, call_id="c",
                                          started_at=t, budget=50)
            await store.finish_call(run_id="r", seq=slot.seq, text="", meta=meta, finished_at=t,
                                    duration_ms=0, row="", **{"is_error": False, "cut": False, **kw})

        await read(META)                       # 1: eligible
        await read(META, is_error=True)        # 2: failed
        await read(META, cut=True)             # 3: cut by the pipeline
        await read({**META, "repeat_of": 1})   # 4: a pointer
        await read({**META, "range": [21, 30]})  # 5: eligible
        reads = await earlier_reads(store, "r", 6)
        assert [(r["seq"], r["range"]) for r in reads] == [(1, [1, 20]), (5, [21, 30])]
        assert await earlier_reads(store, "r", 5) == reads[:1]
        assert await earlier_reads(store, "other", 9) == []
