"""Checkpoints and rewind through the toolbox's call path, on the real local and bwrap
sandboxes, the real helper, bash and SQLite (PostgreSQL where $GUILDS_TEST_POSTGRES_URL
names one): a checkpoint per shell call recorded under its call, a rewind byte for
byte, a home deleted whole, a background command writing while checkpoints are
taken and stopped by a rewind, the ledger after a rewind, a rewind waiting for a
running call, a full disk refusing the call in one line, and an agent in a bwrap
sandbox that cannot reach its own checkpoints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
from pathlib import Path

import pytest

import guilds
from checkpoint_kit import make_tree, picture
from conftest import sized_tmpfs
from guilds.checkpoints import CheckpointError
from guilds.config.settings import AgentSettings, BwrapSettings, DockerSettings
from guilds.errors import BadInput
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable

NO_BWRAP = unavailable()
NO_DOCKER = docker_unavailable()
BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("bwrap", id="bwrap", marks=[
        pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None or os.geteuid() != 0,
                                              reason=f"bwrap as root: {NO_BWRAP}")]),
]
WITH_DOCKER = [*BACKENDS, pytest.param("docker", id="docker", marks=[
    pytest.mark.docker, pytest.mark.skipif(NO_DOCKER is not None, reason=f"docker: {NO_DOCKER}")])]
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
POINTER = "unchanged since step"
PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


def settings(tmp_path: Path, backend: str, **kw) -> AgentSettings:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    # an id of the test's own: a docker container is named after it, and the tests run beside each other
    return AgentSettings(id=f"ck{secrets.token_hex(3)}", home=home, sandbox=backend, checkpoints=True,
                         bwrap=BwrapSettings(memory=256 << 20, tmp_size=16 << 20),
                         docker=DockerSettings(image=IMAGE, memory="256m"), **kw)


@contextlib.asynccontextmanager
async def opened(tmp_path: Path, backend: str, env: dict | None = None, **kw):
    async with guilds.open(settings(tmp_path, backend, **kw), data_dir=tmp_path / "data", env=env or {}) as agent:
        try:
            yield agent
        finally:
            await agent.toolbox.close()
            await agent.toolbox.sandbox.remove()  # a docker container is named after the agent: none left behind


def give_to_agent(home: Path) -> None:
    """What the test made in the home, made the agent's (the owner the sandbox gave the home)."""
    owner = home.stat()
    for folder, dirs, files in os.walk(home):
        for name in [*dirs, *files]:
            os.lchown(Path(folder, name), owner.st_uid, owner.st_gid)


async def shell(agent, run: str, command: str, **args) -> guilds.toolbox.CallResult:
    result = await agent.call(run, "shell", {"command": command, **args})
    assert not result.is_error, result.text
    return result


@pytest.mark.parametrize("backend", WITH_DOCKER)
async def test_each_shell_call_is_checkpointed_and_a_rewind_gives_back_its_tree(tmp_path, backend):
    async with opened(tmp_path, backend) as agent:
        await shell(agent, "r", "true")  # the sandbox gives the home to its uid first
        make_tree(agent.settings.home)
        give_to_agent(agent.settings.home)
        before = picture(agent.settings.home)
        await shell(agent, "r", "echo changed > src/pkg/mod.py && chmod 644 run.sh && rm doomed.txt "
                                "&& rmdir empty && ln -sfn run.sh link-rel && mkdir -p new/deep && touch new/deep/f")
        assert picture(agent.settings.home) != before
        rows = await agent.toolbox.store.checkpoints_of_run("r")
        assert [(r["seq"], r["moment"], r["status"]) for r in rows] == [(1, "before", "kept"), (2, "before", "kept")]
        calls = await agent.toolbox.store.calls("r")
        assert rows[1]["call_id"] == calls[1].call_id
        done = await agent.rewind("r", 2)
        assert done.changed > 0 and done.stopped == ()
        assert picture(agent.settings.home) == before


@pytest.mark.parametrize("backend", WITH_DOCKER)
async def test_a_call_that_deletes_the_whole_home_is_rewound(tmp_path, backend):
    async with opened(tmp_path, backend) as agent:
        await shell(agent, "r", "mkdir -p a/b && echo x > a/b/c && ln -s a/b/c l && chmod 600 a/b/c")
        before = picture(agent.settings.home)
        await shell(agent, "r", 'find "$HOME" -mindepth 1 -delete')
        assert [p for p in picture(agent.settings.home) if not p.startswith(".runs")] == []  # the call's own
        await agent.rewind("r", 2)
        assert picture(agent.settings.home) == before
        again = await agent.call("r", "shell", {"command": "cat a/b/c"})
        assert again.text.startswith("x")


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_rewind_forgets_the_reads_made_after_its_point(tmp_path, database):
    if database == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    env = {"GUILDS_DATABASE_URL": PG_URL} if database == "postgresql" else {}
    async with opened(tmp_path, "local", env=env) as agent:
        await shell(agent, "r", "seq 1 50 > a.txt")                   # 1
        await agent.call("r", "file_read", {"path": "a.txt"})         # 2: a read before the point
        await shell(agent, "r", "true")                               # 3: the point
        await agent.call("r", "file_read", {"path": "a.txt"})         # 4: a read after it
        assert POINTER in (await agent.call("r", "file_read", {"path": "a.txt"})).text  # 5
        await agent.rewind("r", 3)
        after = await agent.call("r", "file_read", {"path": "a.txt"})  # 6: points to 2, never 4 or 5
        assert after.meta["repeat_of"] == 2
        rows = await agent.toolbox.store.checkpoints_of_run("r")
        assert [(r["seq"], r["moment"]) for r in rows] == [(1, "before"), (3, "before")]


async def test_a_rewind_of_a_call_without_a_checkpoint_is_refused_in_one_line(tmp_path):
    async with opened(tmp_path, "local") as agent:
        await shell(agent, "r", "true")
        await agent.call("r", "file_read", {"path": "nothing"})
        with pytest.raises(CheckpointError, match=r"^no checkpoint before call 2 of run r is kept \(only shell "
                                                  r"and code_task calls take one; calls with one: 1\)$"):
            await agent.rewind("r", 2)
        with pytest.raises(BadInput, match="seq: must be a call's number"):
            await agent.rewind("r", 0)


async def test_checkpoints_off_take_none(tmp_path):
    async with guilds.open(AgentSettings(id="ck0", home=tmp_path / "home", sandbox="local"),
                           data_dir=tmp_path / "data") as agent:
        await shell(agent, "r", "echo hi > f")
        assert await agent.toolbox.store.checkpoints_of_run("r") == []
        assert agent.checkpoints() == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_background_writes_during_checkpoints_and_the_rewind_stops_it(tmp_path, backend):
    async with opened(tmp_path, backend) as agent:
        await shell(agent, "r", "echo stable > stable.txt")
        started = await shell(agent, "r", "i=0; while :; do i=$((i+1)); echo $i >> log.txt; "
                                          "head -c 4096 /dev/urandom > churn.bin; done", background=True)
        bid = started.meta["background_id"]
        for _ in range(3):
            await shell(agent, "r", "sleep 0.05")  # a checkpoint each, while the command writes
        point = agent.toolbox.checkpoints.point_before("r", 4)
        kept = agent.toolbox.checkpoints.files.tree_of(point.id)
        assert {"stable.txt", "log.txt", "churn.bin"} <= set(kept)
        done = await agent.rewind("r", 4)
        assert done.stopped == (bid,)
        home = agent.settings.home
        assert (home / "stable.txt").read_text() == "stable\n"
        objects = agent.toolbox.checkpoints.files.objects
        for name in ("log.txt", "churn.bin"):
            assert (home / name).read_bytes() == (objects / kept[name].ref).read_bytes()
        await asyncio.sleep(0.2)
        assert (home / "log.txt").read_bytes() == (objects / kept["log.txt"].ref).read_bytes()  # nothing writes now
        status = await agent.call("r", "shell_status", {})
        assert f"{bid} stopped (by a rewind to before call 4)" in status.text


async def test_a_rewind_waits_for_the_running_call(tmp_path):
    async with opened(tmp_path, "local") as agent:
        await shell(agent, "r", "echo one > f")
        running = asyncio.ensure_future(agent.call("r", "shell", {"command": "touch started; sleep 1; echo two > f"}))
        while not (agent.settings.home / "started").exists():  # the call holds the gate and runs
            await asyncio.sleep(0.05)
        await agent.rewind("r", 1)
        assert running.done()  # the call ended before the rewind began
        assert not (agent.settings.home / "f").exists()


async def test_a_full_disk_refuses_the_call_in_one_line_and_keeps_the_earlier_checkpoints(tmp_path):
    store = tmp_path / "data" / "checkpoints"
    store.mkdir(parents=True)
    with sized_tmpfs(store, "256k"):
        async with opened(tmp_path, "local") as agent:
            await shell(agent, "r", "echo small > a")
            before = picture(agent.settings.home)
            await shell(agent, "r", "head -c 600000 /dev/urandom > big")
            refused = await agent.call("r", "shell", {"command": "echo ran > ran.txt"})
            assert refused.is_error and not (agent.settings.home / "ran.txt").exists()
            assert refused.text.splitlines()[0] == (f"cannot take a checkpoint of {agent.settings.home}: "
                                                    "No space left on device")
            assert [p.seq for p in agent.checkpoints()] == [1, 2]
            await agent.rewind("r", 2)
            assert picture(agent.settings.home) == before


@pytest.mark.bwrap
@pytest.mark.skipif(NO_BWRAP is not None or os.geteuid() != 0, reason=f"bwrap as root: {NO_BWRAP}")
async def test_an_agent_cannot_reach_its_own_checkpoints_from_its_sandbox(tmp_path):
    async with opened(tmp_path, "bwrap") as agent:
        await shell(agent, "r", "echo mine > f")
        store = agent.toolbox.checkpoints.files.root
        index = store / "index.json"
        assert index.exists()
        tries = await agent.call("r", "shell", {"command": (
            f"ls {store} ; cat {index} ; echo x > {index} ; rm -rf {store} ; "
            f"ls /proc/1/root{store} ; echo end")})
        assert "end" in tries.text and '"id"' not in tries.text
        assert index.exists() and index.read_text().startswith('[{"id"')
        await shell(agent, "r", "rm f")
        await agent.rewind("r", 2)
        assert (agent.settings.home / "f").read_text() == "mine\n"


def test_checkpoint_settings_and_their_limits(tmp_path):
    """Read on every backend (kubernetes refuses them at the agent's start: test_kube_checkpoints.py)."""
    from guilds.config.settings import parse_settings
    from guilds.errors import ConfigError

    parsed = parse_settings({"agent": {"checkpoints": True, "checkpoints_max_count": 1,
                                       "checkpoints_max_size": "1m"}}, tmp_path, env={})
    assert (parsed.checkpoints, parsed.checkpoints_max_count, parsed.checkpoints_max_size) == (True, 1, 1 << 20)
    with pytest.raises(ConfigError, match=r"^agent\.checkpoints_max_count"):
        parse_settings({"agent": {"checkpoints_max_count": 0}}, tmp_path, env={})


async def test_an_mcp_client_rewinds_a_run_of_its_own(tmp_path):
    from guilds.fronts.mcp_server import streamable_http_app
    from mcp_raw import RawClient
    from test_mcp_http import serving

    async with opened(tmp_path, "local") as agent, serving(streamable_http_app(agent.toolbox)) as url:
        client = RawClient(url)
        first = await client.call("shell", {"command": "echo one > f"})
        run = first["_meta"]["guilds/meta"]["run"]
        await client.call("shell", {"command": "echo two > f", "run": run})
        assert (agent.settings.home / "f").read_text() == "two\n"
        done = await client.post("guilds/rewind", {"run": run, "seq": 2})
        assert done["result"]["text"].startswith(f"rewound run {run} to before call 2 (")
        assert (agent.settings.home / "f").read_text() == "one\n"
        refused = await client.post("guilds/rewind", {"run": run, "seq": 9})
        assert refused["error"]["code"] == -32602
        assert refused["error"]["message"].startswith(f"no checkpoint before call 9 of run {run} is kept")
        unknown = await client.post("guilds/rewind", {"run": "someone-else", "seq": 1})
        assert unknown["error"]["message"] == "no run 'someone-else'"


async def test_the_app_shows_each_call_s_checkpoint_on_its_row(tmp_path):
    import re

    import httpx2

    from guilds.fronts.serve import build_app
    from web_kit import AUTH, LOCK

    async with opened(tmp_path, "local") as agent:
        done = await shell(agent, "r", "echo hi > f")
        await agent.call("r", "file_read", {"path": "f"})
        point = agent.toolbox.checkpoints.point_before("r", 1)
        assert done.meta["checkpoint"] == point.id
        app = build_app(agent.settings, agent.toolbox.store, agent.toolbox, lock=LOCK)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1",
                                      headers=AUTH) as client:
            page = (await client.get("/runs/r")).text
        shown = re.findall(r'<li id="call-(\d+)".*?</li>', page, re.S)
        rows = dict(zip(shown, re.findall(r'<li id="call-\d+"(.*?)</li>', page, re.S), strict=True))
        assert '<span class="checkpoint"' in rows["1"] and f"checkpoint {point.id}</span>" in rows["1"]
        assert 'class="checkpoint"' not in rows["2"]  # a file_read takes none


def test_a_record_made_before_rewinds_gets_the_column_and_the_table(tmp_path):
    import sqlite3

    from guilds.record.store import Store

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:  # the context_marks of a record made before rewinds were recorded
        conn.execute("CREATE TABLE context_marks (id INTEGER PRIMARY KEY, run_id VARCHAR(128) NOT NULL, "
                     "after_seq INTEGER NOT NULL, at DATETIME NOT NULL)")
        conn.execute("INSERT INTO context_marks (run_id, after_seq, at) VALUES ('r', 4, '2026-01-01 00:00:00')")

    async def opened_twice() -> int:
        for _ in range(2):
            async with Store(f"sqlite:///{db}") as store:
                seq = await store.context_reset_seq("r")
        return seq
    assert asyncio.run(opened_twice()) == 4  # an old mark is a context reset
    with sqlite3.connect(db) as conn:
        assert "from_seq" in {row[1] for row in conn.execute("PRAGMA table_info(context_marks)")}
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)


async def test_a_code_task_is_checkpointed_at_its_start_and_its_end(tmp_path):
    from guilds.record.store import Store
    from guilds.sandbox.local import LocalSandbox
    from guilds.toolbox import Toolbox
    from guilds.toolbox.checkpointing import AgentCheckpoints
    from test_toolbox_code_task import _git
    from toolbox_kit import make_settings

    folder = tmp_path / "bin"
    folder.mkdir()
    fake = Path(__file__).parent / "fixtures" / "fake_claude.py"
    (folder / "claude").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    (folder / "claude").chmod(0o755)
    repo = tmp_path / "home" / "repos" / "web"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "app.py").write_text("print('hello')\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    before = picture(tmp_path / "home")
    settings = make_settings(tmp_path, agent={"checkpoints": True}, repos={"web": {"path": "repos/web"}})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        tb = Toolbox(settings, LocalSandbox(settings, tmp_path / "data", path=f"{folder}:{os.environ['PATH']}"), store)
        tb.checkpoints = AgentCheckpoints(tb, tmp_path / "data")
        result = await tb.call("r1", "code_task", {"brief": "fake: write notes.md a line\nfake: say wrote it"})
        assert not result.is_error, result.text
        assert (repo / "notes.md").exists()
        rows = await store.checkpoints_of_run("r1")
        assert [(r["seq"], r["moment"]) for r in rows] == [(1, "before"), (1, "after")]
        assert (result.meta["checkpoint"], result.meta["checkpoint_after"]) == (rows[0]["id"], rows[1]["id"])
        end = tb.checkpoints.files.tree_of(rows[1]["id"])
        assert "repos/web/notes.md" in end and "repos/web/notes.md" not in tb.checkpoints.files.tree_of(rows[0]["id"])
        await tb.checkpoints.rewind("r1", 1)
        assert picture(tmp_path / "home") == before
        await tb.close()


def test_the_cli_keeps_lists_and_rewinds(capsys, tmp_path):
    from test_cli import config, run

    settings = str(config(tmp_path, "checkpoints = true\n"))
    assert run(capsys, tmp_path, "call", "shell", '{"command": "echo one > f"}', "--config", settings,
               "--run", "r")[0] == 0
    code, out, _ = run(capsys, tmp_path, "checkpoint", "clean", "--config", settings)
    assert code == 0 and out.startswith("kept k") and "name clean" in out
    assert run(capsys, tmp_path, "call", "shell", '{"command": "echo two > f"}', "--config", settings,
               "--run", "r")[0] == 0
    code, out, _ = run(capsys, tmp_path, "checkpoint", "--list", "--config", settings)
    assert [line.split("  ")[1] for line in out.splitlines()] == [
        "run r call 1 before", "name clean", "run r call 2 before"]
    code, out, _ = run(capsys, tmp_path, "rewind", "--name", "clean", "--config", settings)
    assert code == 0 and out.startswith("rewound to checkpoint clean (")
    assert (tmp_path / "home" / "f").read_text() == "one\n"
    code, out, _ = run(capsys, tmp_path, "rewind", "r", "1", "--config", settings)
    assert code == 0 and out.startswith("rewound run r to before call 1 (") and not (tmp_path / "home" / "f").exists()
    code, _, err = run(capsys, tmp_path, "rewind", "r", "7", "--config", settings)
    assert code == 1 and err.startswith("guilds: no checkpoint before call 7 of run r is kept") and err.count("\n") == 1
    code, _, err = run(capsys, tmp_path, "rewind", "--config", settings)
    assert (code, err) == (2, "guilds: rewind: give RUN and SEQ, or --name NAME\n")
    code, _, err = run(capsys, tmp_path, "checkpoint", "../x", "--config", settings)
    assert code == 2 and err.startswith("guilds: checkpoint name:")
