"""A call's result as the run record keeps it: body, trailer count and cut apart;
the call's fields once; no secret value anywhere; older records brought up to date."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from guilds.record import migration
from guilds.record.engine import normalize_url
from guilds.record.migration import split_trailer
from guilds.record.owners import LOST
from guilds.record.schema import SAVINGS_COLUMNS, calls, metadata, owners, runs, tasks
from guilds.record.store import RUN_IDS_PAGE, Store
from guilds.record.values import Savings, decision_rows
from guilds.web.savings_view import run_savings
from toolbox_kit import local_toolbox

SECRET = "sk-live-7f3a9c2e4b1d"


def raw_rows(db: str) -> list[tuple]:
    """Every cell of every table, as SQLite holds them (no code of ours in between)."""
    with sqlite3.connect(db) as conn:
        return [row for table in ("runs", "calls") for row in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608 - two table names


async def test_the_record_never_holds_a_secret_value(tmp_path):
    """A secret in the tool's name, the arguments, the output, the working directory
    (metadata) and the row: the record keeps none of it, the answer neither."""
    async with local_toolbox(tmp_path, secrets={"API_KEY": SECRET}) as box:
        (tmp_path / "home" / f"d-{SECRET}").mkdir(parents=True)
        answers = [
            await box.call("r1", "shell", {"command": f"cd d-{SECRET} && echo {SECRET} && echo $API_KEY"}),
            await box.call("r1", "file_read", {"path": f"d-{SECRET}/none.txt"}),
            await box.call("r1", f"tool-{SECRET}", {"x": SECRET}),
        ]
    cells = repr(raw_rows(f"{tmp_path}/guilds.db"))
    assert "[REDACTED]" in cells
    for value in (SECRET, base64.b64encode(SECRET.encode()).decode().rstrip("=")):
        assert value not in cells
        assert all(value not in answer.text and value not in repr(answer.meta) for answer in answers)


async def test_the_record_keeps_body_trailer_count_and_fields_apart(tmp_path):
    async with local_toolbox(tmp_path) as box:
        answer = await box.call("r1", "shell", {"command": "echo hello"})
        record = await box.store.call("r1", 1)
    assert answer.text == "hello\nremaining_tool_calls: 199"
    with sqlite3.connect(f"{tmp_path}/guilds.db") as conn:
        (text, remaining, meta), = conn.execute("SELECT text, remaining, meta FROM calls").fetchall()
    assert (text, remaining) == ("hello", 199)
    assert not {"call", "tool", "run", "seq", "started_at", "duration_ms", "row"} & set(json.loads(meta))
    assert (record.body, record.remaining, record.trailer) == ("hello", 199, "remaining_tool_calls: 199")
    assert record.text == answer.text and record.meta == answer.meta


@pytest.mark.parametrize("text, split", [
    ("out\nremaining_tool_calls: 3", ("out", "remaining_tool_calls: 3")),
    ("out\nremaining_tool_calls: 0\n", ("out", "remaining_tool_calls: 0")),
    ("remaining_tool_calls: 12", ("", "remaining_tool_calls: 12")),
    ("remaining_tool_calls: 3 and more", ("remaining_tool_calls: 3 and more", "")),
])
def test_the_trailer_is_set_apart(text, split):
    assert split_trailer(text) == split


OLD_SCHEMA = """
CREATE TABLE runs (id VARCHAR(128) PRIMARY KEY, agent_id VARCHAR(128) NOT NULL, created_at DATETIME NOT NULL,
  updated_at DATETIME NOT NULL, next_seq INTEGER NOT NULL, used_calls INTEGER NOT NULL, admitted_seq INTEGER NOT NULL);
CREATE TABLE calls (run_id VARCHAR(128) NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL,
  call_id VARCHAR(128) NOT NULL, tool TEXT NOT NULL, args JSON NOT NULL, text TEXT, is_error BOOLEAN NOT NULL,
  meta JSON, cut BOOLEAN NOT NULL, counted BOOLEAN NOT NULL, status VARCHAR(16) NOT NULL,
  started_at DATETIME NOT NULL, finished_at DATETIME, duration_ms INTEGER, row TEXT, PRIMARY KEY (run_id, seq));
INSERT INTO runs VALUES ('r1', 'a1', '2025-01-02 03:04:05.000000', '2025-01-02 03:04:06.000000', 3, 3, 3);
INSERT INTO calls VALUES ('r1', 1, 'c1', 'shell', '{"command": "echo hi"}', 'hi
remaining_tool_calls: 9', 0, '{"exit_code": 0, "call": "c1", "tool": "shell", "run": "r1", "seq": 1,
  "started_at": "2025-01-02T03:04:05.000+00:00", "duration_ms": 7, "row": "Run echo hi"}', 0, 1, 'done',
  '2025-01-02 03:04:05.000000', '2025-01-02 03:04:05.007000', 7, 'Run echo hi');
INSERT INTO calls VALUES ('r1', 2, 'c2', 'shell', '{"command": "sleep 9"}', NULL, 0, NULL, 0, 1, 'running',
  '2025-01-02 03:04:06.000000', NULL, NULL, NULL);
"""


async def test_an_older_record_is_brought_up_to_date_once(tmp_path):
    db = tmp_path / "guilds.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(OLD_SCHEMA)
    for _ in range(2):  # a second setup finds nothing left to do
        async with Store(f"sqlite:///{db}") as store:
            done, running = await store.calls("r1")
            totals = (await store.get_run("r1")).savings
        assert totals == Savings(len("hi\nremaining_tool_calls: 9") + len(LOST), 0, 0, 0)
    assert (done.body, done.remaining, done.text) == ("hi", 9, "hi\nremaining_tool_calls: 9")
    assert done.meta == {"exit_code": 0, "call": "c1", "tool": "shell", "run": "r1", "seq": 1,
                         "started_at": "2025-01-02T03:04:05.000+00:00", "duration_ms": 7, "row": "Run echo hi"}
    # It was running when the older version stopped: no process can finish it any more.
    assert (running.status, running.remaining, running.meta) == ("lost", None, None)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT meta FROM calls WHERE seq = 1").fetchone() == ('{"exit_code": 0}',)
    assert done.started_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


def _old_metadata(remaining: bool = False) -> sa.MetaData:
    """The run record as older versions made it: no totals on a run, nor (unless remaining) a
    ``remaining`` column."""
    old = sa.MetaData()
    for table in (runs, calls):
        table.to_metadata(old)
    for name in SAVINGS_COLUMNS:
        old.tables["runs"]._columns.remove(old.tables["runs"].c[name])
    if not remaining:
        old.tables["calls"]._columns.remove(old.tables["calls"].c.remaining)
    return old


def _url(backend: str, tmp_path) -> str:
    if backend == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    return normalize_url(PG_URL if backend == "postgresql" else f"sqlite:///{tmp_path}/guilds.db")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_an_older_record_is_brought_up_to_date_on_either_database(tmp_path, backend):
    url = _url(backend, tmp_path)
    engine = create_async_engine(url)
    old, t0 = _old_metadata(), datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(old.tables["runs"]).values(
            id="r1", agent_id="a1", created_at=t0, updated_at=t0, next_seq=2, used_calls=1, admitted_seq=1))
        await conn.execute(sa.insert(old.tables["calls"]).values(
            run_id="r1", seq=1, call_id="c1", tool="shell", args={"command": "echo hi"},
            text="hi\nremaining_tool_calls: 9", is_error=False, cut=False, counted=True, status="done",
            meta={"exit_code": 0, "call": "c1", "tool": "shell", "run": "r1", "seq": 1, "row": "Run echo hi"},
            started_at=t0, finished_at=t0, duration_ms=7, row="Run echo hi"))
    await engine.dispose()
    async with Store(url) as store:
        (done,) = await store.calls("r1")
    assert (done.body, done.remaining, done.text) == ("hi", 9, "hi\nremaining_tool_calls: 9")
    assert done.meta["exit_code"] == 0 and done.meta["row"] == "Run echo hi" and done.meta["seq"] == 1


def _old_call(run_id: str, seq: int, text: str | None, meta: dict | None, remaining: int | None,
              status: str = "done") -> dict:
    t0 = datetime.now(UTC)
    return {"run_id": run_id, "seq": seq, "call_id": f"c{seq}", "tool": "shell", "args": {}, "text": text,
            "is_error": status != "done", "cut": False, "counted": True, "status": status, "meta": meta,
            "started_at": t0, "finished_at": None if text is None else t0, "duration_ms": 7, "row": "Run x",
            "owner": "gone" if text is None else None, "remaining": remaining}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_an_older_record_gets_its_runs_totals_once(tmp_path, backend, monkeypatch):
    """Runs without totals get them from their calls, batch by batch, in the setup that adds the
    columns; a call its gone process left running is then lost, in the totals too; a second setup adds nothing."""
    monkeypatch.setattr(migration, "BATCH", 2)
    url = _url(backend, tmp_path)
    old, t0 = _old_metadata(remaining=True), datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(old.tables["runs"]), [
            {"id": run, "agent_id": "a1", "created_at": t0, "updated_at": t0, "next_seq": 3, "used_calls": 3,
             "admitted_seq": 3} for run in ("r1", "r2")])
        await conn.execute(sa.insert(old.tables["calls"]), [
            _old_call("r1", 1, "a" * 100, {"bytes_elided": 4000, "secrets_redacted": 2}, 9),
            _old_call("r1", 2, "é" * 10, {"pointer_bytes_saved": 300, "bytes_elided": False}, 8),
            _old_call("r1", 3, "stopped", {"secrets_redacted": 1}, None, status="cancelled"),
            _old_call("r2", 1, "b", {}, 7),
            _old_call("r2", 2, None, None, None, status="running"),
        ])
    await engine.dispose()
    for _ in range(2):
        async with Store(url) as store:
            for run in ("r1", "r2"):
                summed = run_savings(await store.calls(run))
                assert (await store.get_run(run)).savings == Savings(
                    summed.returned, summed.elided, summed.pointer_saved, summed.secrets)
            r1, r2 = (await store.get_run("r1")).savings, (await store.get_run("r2")).savings
        assert r1 == Savings(124 + 44 + len("stopped"), 4000, 300, 3)
        assert r2 == Savings(len("b\nremaining_tool_calls: 7") + len(LOST), 0, 0, 0)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_an_older_records_tasks_get_the_starting_call_and_cancel_columns_empty(tmp_path, backend):
    """Tasks made before a command's task kept the call that started it, and before a cancel
    could be asked through another server: the columns are added, empty (such a task reads its
    command ended, and no cancel asked), once; new tasks keep them."""
    url = _url(backend, tmp_path)
    old, t0 = sa.MetaData(), datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    for table in (runs, calls, tasks):
        table.to_metadata(old)
    old.tables["tasks"]._columns.remove(old.tables["tasks"].c.background_call)
    old.tables["tasks"]._columns.remove(old.tables["tasks"].c.cancel_asked)
    row = {"id": "task-old", "run_id": "r1", "agent_id": "a1", "tool": "shell", "background_id": "b1",
           "principal": "", "status": "working", "status_message": "started b1", "result": None,
           "created_at": t0, "updated_at": t0, "owner": None}
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(old.tables["tasks"]).values(**row))
    await engine.dispose()
    for n in range(2):
        async with Store(url) as store:
            assert (await store.get_task("task-old"))["background_call"] is None
            assert await store.cancel_asked("task-old") is (n == 1)
            if n == 0:
                await store.create_task(**{**row, "id": "task-new", "background_call": "c0123456789ab"})
                await store.ask_cancel("task-old")
            assert (await store.get_task("task-new"))["background_call"] == "c0123456789ab"
            assert await store.cancel_asked("task-new") is False


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_an_older_records_owners_get_the_address_column_empty(tmp_path, backend):
    """Owners registered before a server said where it answers: the column is added, empty
    (found gone by their heartbeat alone); a server opening it says its own."""
    url, old = _url(backend, tmp_path), sa.MetaData()
    for table in (runs, calls, owners):
        table.to_metadata(old)
    old.tables["owners"]._columns.remove(old.tables["owners"].c.address)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(old.tables["owners"]).values(
            id="old-owner", machine="elsewhere", pid=1, pid_start=1, heartbeat_at=datetime.now(UTC)))
    await engine.dispose()
    async with Store(url) as store:
        await store.advertise("http://10.0.0.9:8765")
        async with store.engine.connect() as conn:
            found = dict((await conn.execute(sa.select(owners.c.id, owners.c.address))).all())
    assert found == {"old-owner": None, store.owner.id: "http://10.0.0.9:8765"}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_the_runs_of_an_agent_are_found_among_more_ids_than_one_query_asks(tmp_path, backend):
    """Egress rows go only into runs of the proxy's agent: the record names which of the ids
    a command's tags named are that agent's, past a page of ids."""
    async with Store(_url(backend, tmp_path)) as store:
        for run, agent in (("a-mine", "me"), ("z-mine", "me"), ("t-theirs", "them")):
            await store.begin_call(run_id=run, agent_id=agent, tool="shell", args={}, call_id="c",
                                   started_at=datetime.now(UTC), budget=5)
        asked = [f"r{n:04d}" for n in range(RUN_IDS_PAGE - 1)] + ["a-mine", "t-theirs", "z-mine"]
        assert sorted(asked)[RUN_IDS_PAGE:] == ["t-theirs", "z-mine"]  # past the first page
        assert await store.runs_of_agent("me", asked) == {"a-mine", "z-mine"}
        assert await store.runs_of_agent("me", []) == set()
        lines = [{"host": "h", "port": 80, "tag": f"{run}/x"} for run in ("z-mine", "t-theirs", "nowhere")]
        rows = decision_rows(lines, "a-mine", "c", {"a-mine", "z-mine"})
        assert [(r["run_id"], r["call_id"]) for r in rows] == [("z-mine", "x"), ("a-mine", "c"), ("a-mine", "c")]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_an_older_record_gets_the_egress_table_and_keeps_decisions_by_call(tmp_path, backend):
    url = _url(backend, tmp_path)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(_old_metadata(remaining=True).create_all)
    await engine.dispose()
    lines = [{"time": 2.0, "host": "github.com", "port": 443, "allowed": True, "reason": "listed",
              "bytes_up": 10, "bytes_down": 20, "tag": "r1/c1"},
             {"time": 1.0, "host": "evil.example", "port": 443, "allowed": False, "reason": "not listed",
              "tag": "r1/c1"},
             {"time": 3.0, "host": "pkg.example.org", "port": 443, "allowed": True, "reason": "listed", "tag": ""}]
    async with Store(url) as store:
        await store.add_egress(decision_rows(lines, "r1", "c2"))
        first = await store.egress_of_call("r1", "c1")
        assert [(d["host"], d["allowed"]) for d in first] == [("evil.example", False), ("github.com", True)]
        assert [d["host"] for d in await store.egress_of_call("r1", "c2")] == ["pkg.example.org"]  # no tag: the reader
        assert await store.egress_counts("r1") == {"allowed": 2, "refused": 1}
        assert await store.egress_counts("r2") == {"allowed": 0, "refused": 0}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_call_lost_after_a_month_keeps_its_whole_duration_on_an_older_record(tmp_path, backend):
    """An older record's 32-bit ``duration_ms`` is widened once: a call whose process went away
    30 days after it started is recorded lost with its duration, not refused as out of range."""
    url = _url(backend, tmp_path)
    old = sa.MetaData()
    for table in metadata.sorted_tables:
        table.to_metadata(old)
    old.tables["calls"].c.duration_ms.type = sa.Integer()
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(old.create_all)
        await conn.execute(sa.insert(old.tables["runs"]).values(
            id="r1", agent_id="a1", created_at=datetime.now(UTC), updated_at=datetime.now(UTC), next_seq=2,
            used_calls=1, admitted_seq=1))
        await conn.execute(sa.insert(old.tables["calls"]).values(
            _old_call("r1", 1, None, None, None, status="running")
            | {"started_at": datetime.now(UTC) - timedelta(days=30)}))
    await engine.dispose()
    async with Store(url) as store:  # opening it sweeps the calls of processes that are gone
        (lost,) = await store.calls("r1")
    assert lost.status == "lost" and 30 * 86_400_000 <= lost.duration_ms < 31 * 86_400_000
