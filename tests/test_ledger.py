"""The read ledger: which earlier reads a file_read may point to."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from guilds.record.store import Store
from guilds.toolbox.ledger import ledger_entry, read_ledger

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
        ledger = await read_ledger(store, "r", 6)
        assert [(r["seq"], r["range"]) for r in ledger.entries] == [(1, [1, 20]), (5, [21, 30])]
        assert (await read_ledger(store, "r", 5)).entries == ledger.entries[:1]
        assert (await read_ledger(store, "other", 9)).entries == []


@pytest.mark.parametrize(("text", "remaining"), [("é ü\n", 3), ("naïve — 🙂", 12), ("", 1), ("x", None)])
async def test_the_ledger_carries_each_reads_size_as_the_model_got_it(tmp_path, text, remaining):
    """The record measures the stored text in SQL; the size is what the model got (the trailer too)."""
    t = datetime.now(UTC)
    async with Store(f"sqlite:///{tmp_path}/g.db") as store:
        slot = await store.begin_call(run_id="r", agent_id="a", tool="file_read", args={}, call_id="c",
                                      started_at=t, budget=50)
        await store.finish_call(run_id="r", seq=slot.seq, text=text, is_error=False, meta=META, cut=False,
                                finished_at=t, duration_ms=0, row="", remaining=remaining)
        ledger = await read_ledger(store, "r", 2)
        record = await store.call("r", 1)
        assert ledger.sizes == {1: len(record.text.encode())}
        assert ledger.size_of(1) == ledger.sizes[1] and ledger.size_of(True) is None and ledger.size_of(2) is None
