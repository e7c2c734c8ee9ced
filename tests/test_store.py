"""The run record on real SQLite (and PostgreSQL where $GUILDS_TEST_POSTGRES_URL names one)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from guilds.errors import BadInput
from guilds.record.engine import database_url, normalize_url
from guilds.record.owners import LOST
from guilds.record.schema import calls, metadata
from guilds.record.store import Store
from guilds.record.values import Savings
from guilds.web.savings_view import run_savings

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
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


async def totals_and_sum(store, run="r1"):
    """(the run's totals as its row keeps them, run_savings over its calls as recorded)."""
    run_savings_of_calls = run_savings(await store.calls(run, limit=1000))
    return (await store.get_run(run)).savings, Savings(run_savings_of_calls.returned, run_savings_of_calls.elided,
                                                       run_savings_of_calls.pointer_saved, run_savings_of_calls.secrets)


async def test_a_run_keeps_the_totals_of_its_calls(store):
    """Each call's end adds its amounts to its run's row: they stay run_savings over the calls as
    recorded, whatever the end (with a trailer, cancelled, lost, a lost call finished after all)."""
    slots = [await begin(store, at=datetime.now(UTC)) for _ in range(5)]
    other = await begin(store, run="r2")
    assert (await store.get_run("r1")).savings == Savings()
    await store.finish_call(run_id="r1", seq=slots[0].seq, text="a" * 1000, is_error=False, cut=False,
                            meta={"bytes_elided": 3000, "secrets_redacted": 2}, finished_at=T0, duration_ms=1,
                            row="Run a", remaining=7)
    await store.finish_call(run_id="r1", seq=slots[1].seq, text="é" * 50, is_error=False, cut=False,
                            meta={"pointer_bytes_saved": 900, "bytes_elided": True, "secrets_redacted": -1},
                            finished_at=T0, duration_ms=1, row="Read a", remaining=6)
    await store.finish_call(run_id="r1", seq=slots[2].seq, text="stopped", is_error=True, cut=False,
                            meta={"bytes_elided": 5}, finished_at=T0, duration_ms=1, row="Run b", status="cancelled")
    await finish(store, other, run="r2", text="x" * 10, meta={"secrets_redacted": 1})
    totals, expected = await totals_and_sum(store)
    assert totals == expected == Savings(1024 + 124 + len("stopped"), 3005, 900, 2)
    async with store.engine.begin() as conn:  # its process is gone
        await conn.execute(sa.update(calls).where(calls.c.seq == slots[3].seq).values(owner="gone"))
    assert await store.sweep_lost() == [("r1", slots[3].seq)]
    totals, expected = await totals_and_sum(store)
    assert totals == expected and totals.returned == 1024 + 124 + 7 + len(LOST.encode())
    # It was only slow: its end replaces the lost one, in the totals too.
    await store.finish_call(run_id="r1", seq=slots[3].seq, text="late", is_error=False, cut=False,
                            meta={"secrets_redacted": 4}, finished_at=T0, duration_ms=1, row="Run c", remaining=5)
    totals, expected = await totals_and_sum(store)
    late = len("late\nremaining_tool_calls: 5")
    assert totals == expected and (totals.returned, totals.secrets) == (1024 + 124 + 7 + late, 6)
    assert (await store.call("r1", slots[4].seq)).status == "running"  # not counted yet
    assert (await store.get_run("r2")).savings == Savings(10, 0, 0, 1)


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
    assert await store.file_reads("r1", 99) == [(1, meta, len("ok"))]
    assert await store.file_reads("r1", 1) == []


async def test_a_runs_principal_is_its_first_claim(store):
    assert await store.claim_run("r1", "token:aaaa") == "token:aaaa"
    assert await store.claim_run("r1", "token:bbbb") == "token:aaaa"
    assert await asyncio.gather(*(store.claim_run("r2", f"p{i}") for i in range(4))) == ["p0"] * 4


async def test_a_task_row_and_its_owners_life(store):
    row = {"id": "task-1", "run_id": "r1", "agent_id": "a1", "tool": "code_task", "background_id": None,
           "principal": "", "status": "working", "status_message": "running", "result": None,
           "created_at": T0, "updated_at": T0}
    await store.create_task(**row)
    task = await store.get_task("task-1")
    assert task["owner_alive"] and task["owner"] == store.owner.id and task["status"] == "working"
    await store.update_task("task-1", status="completed", result={"content": [], "isError": False}, owner=None)
    done = await store.get_task("task-1")
    assert done["status"] == "completed" and done["result"] == {"content": [], "isError": False}
    assert not done["owner_alive"] and await store.get_task("task-2") is None
    await store.create_task(**{**row, "id": "task-3"})
    await store.update_task("task-3", owner="gone-owner")  # a process that is not registered
    assert (await store.get_task("task-3"))["owner_alive"] is False

async def test_a_write_while_another_connection_holds_the_lock_waits_for_it(tmp_path):
    """The event loop writes at once only when the lock is free; else the record thread waits for it."""
    import sqlite3

    async with Store(f"sqlite:///{tmp_path}/guilds.db") as st:
        await finish(st, await begin(st))  # the loop's own connection is open
        other = sqlite3.connect(tmp_path / "guilds.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock (another process, say)
        try:
            writing = asyncio.ensure_future(begin(st))
            await asyncio.sleep(0.3)
            assert not writing.done()  # waiting, not failed, and the loop runs meanwhile
        finally:
            other.execute("COMMIT")
            other.close()
        slot = await asyncio.wait_for(writing, 10)
        assert slot.seq == 2 and (await st.call("r1", 2)).status == "running"


async def test_writes_on_the_loop_are_checkpointed_so_the_log_stays_bounded(tmp_path):
    from guilds.limits import RECORD_CHECKPOINT_COMMITS

    wal = tmp_path / "guilds.db-wal"
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as st:

        async def calls(n: int) -> None:
            for _ in range(n):
                await finish(st, await begin(st, budget=10**6))

        await calls(RECORD_CHECKPOINT_COMMITS)  # 2 transactions a call: one checkpoint handed over
        await asyncio.sleep(0.5)  # the thread has made it
        one_round = wal.stat().st_size
        await calls(4 * RECORD_CHECKPOINT_COMMITS)
        await asyncio.sleep(0.5)
        assert wal.stat().st_size <= 2 * one_round  # written over from its start, not grown fivefold


async def _raw_rows(path, run: str) -> list[tuple]:
    """The run's calls' rows and its own as SQLite holds them."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        found = conn.execute("SELECT * FROM calls WHERE run_id = ? ORDER BY seq", (run,)).fetchall()
        return found + conn.execute("SELECT * FROM runs WHERE id = ?", (run,)).fetchall()


async def test_a_calls_prepared_writes_store_byte_for_byte_what_sqlalchemy_stores(tmp_path):
    """A call's start and end on the loop's plain connection (record.prepared) against the
    same through SQLAlchemy: the same text in every column, JSON, timestamps and booleans."""
    written = {}
    for way in ("prepared", "sqlalchemy"):
        async with Store(f"sqlite:///{tmp_path}/{way}.db") as st:
            writer = st._record_thread.prepared
            own_write, used = writer.write, []

            def write(work, own=own_write, used=used, way=way):
                outcome = own(work) if way == "prepared" else (False, None)
                used.append(outcome[0])
                return outcome

            writer.write = write
            for text, meta, remaining in (("é" * 3, {"exit_code": 0, "cwd": "/h", "secrets_redacted": 2}, 9),
                                          ("", {"bytes_elided": 40, "nested": [1, None, "x"]}, None)):
                slot = await begin(st, budget=10, at=T0 + timedelta(microseconds=123))
                await st.finish_call(run_id="r1", seq=slot.seq, text=text, is_error=not meta.get("cwd"),
                                     meta=meta, cut=remaining is None, finished_at=T0 + timedelta(seconds=2),
                                     duration_ms=7, row="Run true", remaining=remaining)
            assert used == [way == "prepared"] * 4  # written there, or all through SQLAlchemy
        written[way] = await _raw_rows(tmp_path / f"{way}.db", "r1")
    assert written["prepared"] == written["sqlalchemy"] and len(written["prepared"]) == 3


async def test_a_calls_start_at_once_is_written_now_or_left_to_begin_call(store):
    """On a SQLite file with no other write of the Store under way, the start is written
    now, as begin_call writes it; else (PostgreSQL, the write lock held) nothing is written."""
    start = {"run_id": "r1", "agent_id": "a1", "tool": "shell", "args": {"command": "true"},
             "started_at": T0, "budget": 10}
    slot = store.begin_call_at_once(**start, call_id="c1")
    if not store.sqlite:
        assert slot is None and await store.calls("r1") == []
        return
    assert (slot.seq, slot.used, slot.admitted) == (1, 1, True)
    async with store._write_lock:  # another write of this Store under way
        assert store.begin_call_at_once(**start, call_id="c2") is None
    later = await store.begin_call(**start, call_id="c3")
    assert later.seq == 2 and [(c.call_id, c.status) for c in await store.calls("r1")] == [
        ("c1", "running"), ("c3", "running")]


async def test_a_statement_with_a_column_default_to_fill_is_left_to_sqlalchemy(tmp_path):
    """SQLAlchemy fills a column's Python default when it runs the statement: a prepared
    statement missing a value that has one falls back whole, nothing of it written."""
    from guilds.record.statements import INSERT_CALL

    async with Store(f"sqlite:///{tmp_path}/guilds.db") as st:
        await finish(st, await begin(st))
        writer = st._record_thread.prepared
        row = {"run_id": "r1", "seq": 2, "call_id": "c2", "tool": "shell", "args": {}, "counted": True,
               "status": "running", "started_at": T0}  # no is_error, no cut: their defaults are False

        def insert(conn):
            conn.execute(INSERT_CALL, {**row, "seq": 3, "is_error": True, "cut": True})  # all given: prepared
            conn.execute(INSERT_CALL, row)

        assert writer.write(insert) == (False, None)
        assert [c.seq for c in await st.calls("r1")] == [1]  # rolled back whole: not even call 3
        await st._in_transaction("a test call", insert, prepared=True)
        got = {c.seq: (c.is_error, c.cut) for c in await st.calls("r1")}
        assert got == {1: (False, False), 2: (False, False), 3: (True, True)}
