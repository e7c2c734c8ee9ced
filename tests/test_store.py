"""The run record on real SQLite (and PostgreSQL where $GUILDS_TEST_POSTGRES_URL names one)."""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timedelta, timezone

import pytest

from guilds.errors import BadInput
from guilds.store import Store, database_url, metadata, normalize_url

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/guilds.db"
    elif PG_URL:
        url = PG_URL
    else:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    st = Store(url)
    if request.param == "postgresql":  # a shared server: start from empty tables of this schema
        async with st.engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
    async with st:
        yield st


async def begin(store, run="r1", agent="a1", budget=10, tool="shell", at=T0):
    return await store.begin_call(run_id=run, agent_id=agent, tool=tool, args={"command": "true"},
                                  call_id="c1", started_at=at, budget=budget)


async def finish(store, slot, run="r1", text="ok", is_error=False, meta=None, cut=False):
    await store.finish_call(run_id=run, seq=slot.seq, text=text, is_error=is_error, meta=meta or {},
                            cut=cut, finished_at=T0 + timedelta(seconds=1), duration_ms=1000,
                            row="Run true")


def test_urls():
    assert database_url("/data", {}) == "sqlite+aiosqlite:////data/guilds.db"
    assert database_url("/data", {"GUILDS_DATABASE_URL": "postgresql://u@h/db"}) == "postgresql+asyncpg://u@h/db"
    assert normalize_url("postgres://h/db") == "postgresql+asyncpg://h/db"
    assert normalize_url("sqlite+aiosqlite:///x") == "sqlite+aiosqlite:///x"


async def test_a_call_is_recorded_then_finished(store):
    slot = await begin(store)
    assert (slot.seq, slot.used, slot.admitted) == (1, 1, True)
    running = await store.call("r1", 1)
    assert running.status == "running" and running.text is None
    await finish(store, slot, meta={"exit_code": 0})
    done = await store.call("r1", 1)
    assert (done.status, done.text, done.meta, done.args) == ("done", "ok", {"exit_code": 0}, {"command": "true"})
    assert done.started_at == T0 and done.finished_at == T0 + timedelta(seconds=1)
    assert (done.duration_ms, done.row, done.counted, done.cut) == (1000, "Run true", True, False)
    assert await store.call("r1", 2) is None


async def test_concurrent_calls_of_one_run_get_distinct_seqs_and_respect_the_budget(store):
    slots = await asyncio.gather(*(begin(store, budget=30) for _ in range(50)))
    assert sorted(s.seq for s in slots) == list(range(1, 51))
    admitted = [s for s in slots if s.admitted]
    assert len(admitted) == 30
    assert sorted(s.used for s in admitted) == list(range(1, 31))
    assert all(s.used == 30 for s in slots if not s.admitted)
    run = (await store.list_runs())[0]
    assert (run.calls, run.used_calls) == (50, 30)


async def test_a_run_belongs_to_one_agent(store):
    await begin(store, agent="a1")
    with pytest.raises(BadInput, match="belongs to agent 'a1'"):
        await begin(store, agent="a2")
    assert [c.seq for c in await store.calls("r1")] == [1]  # the refused one left nothing


async def test_runs_newest_first_and_calls_paged_by_seq(store):
    for i, run in enumerate(["old", "mid", "new"]):
        await begin(store, run=run, agent="a1" if run != "mid" else "a2", at=T0 + timedelta(minutes=i))
    assert [r.id for r in await store.list_runs()] == ["new", "mid", "old"]
    assert [r.id for r in await store.list_runs("a1")] == ["new", "old"]
    assert [r.id for r in await store.list_runs(limit=1, offset=1)] == ["mid"]
    for _ in range(4):
        await begin(store, run="new")
    assert [c.seq for c in await store.calls("new", limit=2)] == [1, 2]
    assert [c.seq for c in await store.calls("new", after_seq=2, limit=2)] == [3, 4]
    assert [c.seq for c in await store.calls("new", after_seq=4)] == [5]


async def test_file_reads_keep_only_finished_successful_uncut_reads(store):
    meta = {"path": "/h/a", "range": [1, 2], "content_hash": "x"}
    ok = await begin(store, tool="file_read")
    failed = await begin(store, tool="file_read")
    cut = await begin(store, tool="file_read")
    await begin(store, tool="file_read")  # still running
    other = await begin(store, tool="shell")
    await finish(store, ok, meta=meta)
    await finish(store, failed, is_error=True, meta=meta)
    await finish(store, cut, meta=meta, cut=True)
    await finish(store, other, meta=meta)
    assert await store.file_reads("r1", 99) == [(1, meta)]
    assert await store.file_reads("r1", 1) == []
