"""The toolbox end to end: the real helper in the local sandbox, real bash, real SQLite.

The fake sandbox (toolbox_kit.FakeSandbox) only serves what the real helper
cannot produce on purpose: an over-cap result, a helper that prints no envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re

import pytest

from guilds.errors import BadInput, SandboxError
from guilds.record.schema import metadata
from guilds.record.store import Store
from guilds.sandbox.base import ExecResult
from guilds.toolbox import Toolbox
from toolbox_kit import FakeSandbox, local_toolbox, make_settings, ok, refused

TRAILER = re.compile(r"\nremaining_tool_calls: (\d+)$")


def remaining(text: str) -> int:
    match = TRAILER.search(text)
    assert match, text
    return int(match.group(1))


async def test_a_shell_call_through_the_whole_pipeline(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        result = await tb.call("run1", "shell", {"command": "echo hello; exit 3"})
        assert result.text == "hello\nexit_code: 3\nremaining_tool_calls: 199"
        assert result.is_error is False
        meta = result.meta
        assert meta["exit_code"] == 3 and meta["timed_out"] is False
        assert meta["cwd"] == str(tmp_path / "home")
        assert (meta["tool"], meta["run"], meta["seq"], meta["row"]) == (
            "shell",
            "run1",
            1,
            "Run echo hello; exit 3 · exit 3",
        )
        assert re.fullmatch(r"c[0-9a-f]{12}", meta["call"])
        assert isinstance(meta["duration_ms"], int) and meta["started_at"].endswith("+00:00")
        record = await tb.store.call("run1", 1)
        assert (record.tool, record.args, record.text, record.is_error) == (
            "shell", {"command": "echo hello; exit 3"}, result.text, False)
        assert (record.meta, record.row, record.call_id, record.status) == (meta, meta["row"], meta["call"], "done")


async def test_the_working_directory_starts_in_the_only_repository(tmp_path):
    (tmp_path / "home/repos/web").mkdir(parents=True)
    async with local_toolbox(tmp_path, repos={"web": {}}) as tb:
        assert (await tb.call("r", "shell", {"command": "pwd"})).text.startswith(f"{tmp_path}/home/repos/web\n")
        await tb.call("r", "shell", {"command": "cd .."})
        assert (await tb.call("r", "shell", {"command": "pwd"})).text.startswith(f"{tmp_path}/home/repos\n")
    async with local_toolbox(tmp_path, repos={"web": {}, "api": {}}) as tb:
        assert tb.default_cwd() == str(tmp_path / "home")


async def test_the_budget_counts_down_then_refuses_and_runs_nothing(tmp_path):
    async with local_toolbox(tmp_path, agent={"max_tool_calls": 2}) as tb:
        first = await tb.call("r", "shell", {"command": "touch one"})
        second = await tb.call("r", "file_read", {"path": "nope"})  # a failed call counts too
        third = await tb.call("r", "shell", {"command": "touch three"})
        assert (remaining(first.text), remaining(second.text), remaining(third.text)) == (1, 0, 0)
        assert second.is_error and third.is_error
        assert third.text.startswith("tool call budget exhausted: this run has made all 2 of its tool calls")
        assert not (tmp_path / "home/three").exists() and (tmp_path / "home/one").exists()
        calls = await tb.store.calls("r")
        assert [(c.seq, c.counted, c.is_error) for c in calls] == [(1, True, False), (2, True, True), (3, False, True)]
        assert remaining((await tb.call("other", "shell", {"command": "true"})).text) == 1  # per run


async def test_a_repeated_read_points_to_the_earlier_result(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        (tmp_path / "home").mkdir()
        (tmp_path / "home/a.txt").write_text("one\ntwo\nthree\n")
        first = await tb.call("r", "file_read", {"path": "a.txt"})
        assert first.text.startswith("a.txt lines 1–3 of 3\n") and first.meta["range"] == [1, 3]
        again = await tb.call("r", "file_read", {"path": "a.txt", "offset": 2})
        assert again.text.startswith("a.txt lines 2–3: unchanged since step 1; read that result.")
        assert again.meta["repeat_of"] == 1 and again.meta["row"] == "Read a.txt from line 2 · unchanged since step 1"
        third = await tb.call("r", "file_read", {"path": "a.txt"})  # the pointer is not pointed to
        assert third.meta["repeat_of"] == 1
        (tmp_path / "home/a.txt").write_text("one\nTWO\nthree\n")
        changed = await tb.call("r", "file_read", {"path": "a.txt"})
        assert "TWO" in changed.text and "repeat_of" not in changed.meta
        other_run = await tb.call("r2", "file_read", {"path": "a.txt"})
        assert "repeat_of" not in other_run.meta


async def test_code_task_unknown_tools_and_bad_arguments_are_error_results(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        task = await tb.call("r", "code_task", {"brief": "fix the build"})
        assert task.is_error and task.text.startswith("repo: the agent has no repository to work in")
        assert task.meta["row"] == "Code task · error"
        no_brief = await tb.call("r", "code_task", {"repo": "web"})
        assert no_brief.is_error and no_brief.text.startswith("brief: required by code_task")
        unknown = await tb.call("r", "browse" * 30, {})
        assert unknown.is_error and unknown.text.startswith("unknown tool 'browsebrowse")
        assert "(known: code_task, shell, shell_status, file_read, code_search)" in unknown.text
        bad = await tb.call("r", "shell", {"command": "ls", "timeout_seconds": 9999})
        assert bad.is_error and bad.text.startswith("timeout_seconds: must be from 1 to 600, got 9999")
        assert [c.tool for c in await tb.store.calls("r")] == ["code_task", "code_task", "browse" * 30, "shell"]


async def test_a_run_id_that_is_not_a_file_name_is_refused_before_anything(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        for bad in ("../x", "a/b", "", ".hidden", "x" * 129, "a\nb"):
            with pytest.raises(BadInput, match="run id"):
                await tb.call(bad, "shell", {"command": "true"})
        assert await tb.store.list_runs() == []


async def test_tools_follow_the_live_coding_flag(tmp_path):
    flag = {"on": True}
    settings = make_settings(tmp_path)
    async with Store(f"sqlite:///{tmp_path}/g.db") as store:
        tb = Toolbox(settings, FakeSandbox(lambda r: ok("")), store, coding=lambda: flag["on"])
        assert [t.name for t in tb.tools()] == ["code_task", "shell", "shell_status", "file_read", "code_search"]
        flag["on"] = False
        assert tb.tools() == []
        assert Toolbox(make_settings(tmp_path, agent={"coding": False}), FakeSandbox(ok), store).tools() == []


@pytest.mark.slow
async def test_logs_are_kept_for_the_20_most_recent_runs_the_record_for_all(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        for i in range(22):
            await tb.call(f"run{i:02d}", "shell", {"command": "seq 3000"})  # elided: its log is kept
        kept = sorted(p.name for p in (tmp_path / "home/.runs").iterdir())
        assert kept == [f"run{i:02d}" for i in range(2, 22)]
        assert len(await tb.store.list_runs()) == 22


async def test_a_cancelled_call_is_recorded_as_cancelled(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        task = asyncio.create_task(tb.call("r", "shell", {"command": "sleep 30"}))
        while not (await tb.store.calls("r")):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        record = await tb.store.call("r", 1)
        assert (record.status, record.is_error) == ("cancelled", True)
        assert record.text.startswith("the call was cancelled before it finished\nremaining_tool_calls: 199")
        after = await tb.call("r", "shell", {"command": "echo next"})
        assert after.text.startswith("next\n") and after.meta["seq"] == 2


async def test_a_call_cancelled_while_its_start_is_written_is_recorded_as_cancelled(tmp_path):
    import sqlite3

    async with local_toolbox(tmp_path) as tb:
        other = sqlite3.connect(tmp_path / "guilds.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock: the start waits
        try:
            task = asyncio.create_task(tb.call("r", "shell", {"command": "echo never"}))
            await asyncio.sleep(0.3)
            task.cancel()
            await asyncio.sleep(0.1)
        finally:
            other.execute("COMMIT")
            other.close()
        with pytest.raises(asyncio.CancelledError):
            await task
        record = await tb.store.call("r", 1)
        assert (record.status, record.is_error) == ("cancelled", True)  # not left running
        assert record.text.startswith("the call was cancelled before it finished")


# --- through the fake sandbox ---------------------------------------------------
@pytest.fixture
async def fake_store(tmp_path):
    async with Store(f"sqlite:///{tmp_path}/g.db") as store:
        yield store


def fake_toolbox(tmp_path, store, answer, **kw):
    sandbox = FakeSandbox(answer)
    return Toolbox(make_settings(tmp_path, **kw), sandbox, store), sandbox


async def test_the_request_carries_what_the_helper_needs(tmp_path, fake_store):
    tb, sb = fake_toolbox(tmp_path, fake_store, lambda r: ok("x"), agent={"result_max_bytes": 2048},
                          secrets={"ZED": "zzzz-secret", "ALPHA": "aaaa-secret"},
                          repos={"web": {"token": "tok-123456"}})
    await tb.call("r", "shell", {"command": "ls"})
    await tb.call("r", "shell", {"command": "ls"})
    first, second = sb.requests
    assert first["op"] == "shell" and first["args"] == {"command": "ls"}  # as the model gave them
    assert (first["run_id"], first["agent_id"], first["seq"], second["seq"]) == ("r", "agent1", 1, 2)
    assert (first["home"], first["cwd"], first["max_bytes"]) == ("/home/agent", "/home/agent/repos/web", 2048)
    assert first["redact_env"] == ["ALPHA", "ZED"]  # names only, never values
    assert "aaaa-secret" not in str(first) and "tok-123456" not in str(first)
    assert first["call_id"] != second["call_id"] and "reads" not in first
    assert sb.started == 1


async def test_a_result_over_64_kib_is_cut_and_never_pointed_to(tmp_path, fake_store):
    big = {"path": "/home/agent/big", "range": [1, 500], "content_hash": "h1", "lines": 500}
    small = {"path": "/home/agent/small", "range": [1, 2], "content_hash": "h2", "lines": 2}
    answers = iter([ok("x" * 70_000, big), ok("a\nb", small), refused("no such file"), ok("y", small)])
    tb, sb = fake_toolbox(tmp_path, fake_store, lambda r: next(answers), agent={"result_max_bytes": 65536})
    cut = await tb.call("r", "file_read", {"path": "big"})
    assert len(cut.text.encode()) <= 65536 + len("\nremaining_tool_calls: 199")
    assert "[cut by the platform at 65536 bytes: " in cut.text and remaining(cut.text) == 199
    await tb.call("r", "file_read", {"path": "small"})
    failed = await tb.call("r", "file_read", {"path": "gone"})
    assert failed.is_error and failed.text == "no such file\nremaining_tool_calls: 197"
    await tb.call("r", "file_read", {"path": "small"})
    assert [len(r["reads"]) for r in sb.requests] == [0, 0, 1, 1]
    assert sb.requests[3]["reads"] == [{"path": "/home/agent/small", "range": [1, 2], "content_hash": "h2", "seq": 2}]
    assert (await tb.store.call("r", 1)).cut is True


async def test_a_helper_that_fails_or_a_sandbox_that_breaks_gives_an_error_result(tmp_path, fake_store):
    def broken(request):
        if request["args"]["command"] == "crash":
            return ExecResult(1, b"Traceback...\n", b"line1\nline2\nboom\n")
        raise SandboxError("the sandbox is gone")

    tb, _ = fake_toolbox(tmp_path, fake_store, broken)
    crash = await tb.call("r", "shell", {"command": "crash"})
    assert crash.is_error and crash.text.startswith("code helper failed\nline1\nline2\nboom\n")
    gone = await tb.call("r", "shell", {"command": "other"})
    assert gone.is_error and gone.text.startswith("sandbox error: the sandbox is gone")
    assert [c.is_error for c in await tb.store.calls("r")] == [True, True]


async def test_an_unexpected_failure_is_recorded_then_raised(tmp_path, fake_store):
    def explode(request):
        raise RuntimeError("bug")

    tb, _ = fake_toolbox(tmp_path, fake_store, explode)
    with pytest.raises(RuntimeError):
        await tb.call("r", "shell", {"command": "x"})
    record = await tb.store.call("r", 1)
    first_line = record.text.split("\n")[0]
    assert (record.status, record.is_error, first_line) == ("done", True, "internal error: RuntimeError")


# --- many agents, many calls ---------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def shared_store(request, tmp_path):
    """One run record for every agent: SQLite, or PostgreSQL at $GUILDS_TEST_POSTGRES_URL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/g.db"
    elif os.environ.get("GUILDS_TEST_POSTGRES_URL"):
        url = os.environ["GUILDS_TEST_POSTGRES_URL"]
    else:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    store = Store(url)
    async with store.engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    async with store:
        yield store


@pytest.mark.slow
async def test_eight_agents_with_25_concurrent_calls_each_stay_correct(tmp_path, shared_store):
    agents, per_agent, store = 8, 25, shared_store
    async with contextlib.AsyncExitStack() as stack:
        boxes = []
        for i in range(agents):
            (tmp_path / f"agent{i}").mkdir()
            boxes.append(await stack.enter_async_context(local_toolbox(
                tmp_path / f"agent{i}", store, agent={"id": f"agent{i}", "max_tool_calls": per_agent},
                secrets={f"SECRET_{i}": f"secret-value-of-agent-{i}"})))

        async def one(i, j):
            return i, j, await boxes[i].call(f"run-{i}", "shell", {"command": f"echo a{i}c{j} $SECRET_{i}"})

        results = await asyncio.gather(*(one(i, j) for i in range(agents) for j in range(per_agent)))
        for i in range(agents):
            mine = {j: r for k, j, r in results if k == i}
            assert all(r.text.startswith(f"a{i}c{j} [REDACTED]\n") and not r.is_error for j, r in mine.items())
            assert sorted(r.meta["seq"] for r in mine.values()) == list(range(1, per_agent + 1))
            assert sorted(remaining(r.text) for r in mine.values()) == list(range(per_agent))
            by_call = {r.meta["call"]: r for r in mine.values()}
            calls = await store.calls(f"run-{i}")
            assert [c.seq for c in calls] == list(range(1, per_agent + 1))
            assert all(c.status == "done" and c.text == by_call[c.call_id].text for c in calls)
        assert len(await store.list_runs()) == agents
