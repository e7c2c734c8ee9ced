"""Agents made on demand from a server's templates (guilds.agents, guilds.config.templates):
the templates read and checked, agents made, found after a restart, reaped when
expired, refused past a cap, removed whole; a make that fails leaves nothing.
Real files, real SQLite, the real local sandbox and bash; the fault is a real
Docker engine that is not there."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import guilds
from guilds.config.settings import load_settings
from guilds.config.templates import served_by
from guilds.errors import BadInput, ConfigError, SandboxError
from guilds.fronts.cli import main as cli_main
from guilds.fronts.serve import agents_reaped
from guilds.fronts.wiring import resolve
from guilds.limits import AGENT_MAKING_STALE_SECONDS
from guilds.record.agent_rows import AgentRefused
from guilds.record.engine import normalize_url
from guilds.record.statements import utc_now
from guilds.record.store import Store
from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable

SERVER = '''
[agent]
id = "server1"
home = "home"
sandbox = "local"

[templates.py]
[templates.py.agent]
home = "py-home"
sandbox = "local"
max_tool_calls = 7
[templates.py.secrets]
PY_SECRET = "sekrit-value-1"

[agents]
max = {max}
max_per_owner = {per_owner}
'''


def server(tmp_path: Path, *, max: int = 5, per_owner: int = 2, extra: str = "") -> Path:
    """A server's settings: its own agent, the template py (its home with a file), the caps."""
    home = tmp_path / "py-home"
    (home / "src").mkdir(parents=True, exist_ok=True)
    (home / "src" / "app.py").write_text("print('template')\n")
    path = tmp_path / "server.toml"
    path.write_text(SERVER.format(max=max, per_owner=per_owner) + extra)
    path.chmod(0o600)
    return path


def env_of(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}


def opened(tmp_path: Path, settings: Path) -> guilds.fronts.agent.Agent:
    return guilds.open(settings, data_dir=tmp_path / "data", env=env_of(tmp_path))


def agent_rows(tmp_path: Path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "data" / "guilds.db") as conn:
        return conn.execute("SELECT id, template, owner, status FROM agents ORDER BY created_at").fetchall()


# --- templates


def test_the_settings_name_their_templates_and_the_default_is_the_file_s_own_agent(tmp_path):
    path = server(tmp_path)
    own = load_settings(path, env={})
    served = served_by(own, path, {})
    assert list(served.templates) == ["default", "py"]
    assert served.template("default").settings == own
    py = served.template("py").settings
    assert (py.home, py.max_tool_calls, py.secrets) == (tmp_path / "py-home", 7, {"PY_SECRET": "sekrit-value-1"})
    assert (served.caps.max, served.caps.max_per_owner) == (5, 2)
    with pytest.raises(ConfigError) as refused:
        served.template("nope")
    assert str(refused.value) == "template 'nope': not served here (served: default, py)"


@pytest.mark.parametrize(("extra", "line"), [
    ("[templates.py.docker]\nimgae = 'x'\n", "templates.py.docker.imgae: unknown key (known: "),
    ("[templates.py.bwrap]\nuid = 5\n", "templates.py.bwrap.uid: must be 0 in a template"),
    ("[templates.q.agent]\nid = 'q'\n", "templates.q.agent.id: a template has no id"),
    ("[templates.default.agent]\n", "templates.default: reserved"),
    ("[templates.q]\nagents = {}\n", "templates.q.agents: unknown key"),
    ("[templates.q.agent]\nmax_tool_calls = 0\n", "templates.q.agent.max_tool_calls: must be at least 1"),
    ("[templates.'a b']\n", "templates.a b: "),
])
def test_a_bad_template_is_one_line_naming_its_key(tmp_path, extra, line):
    with pytest.raises(ConfigError) as refused:  # every front reads the file so
        resolve(server(tmp_path, extra=extra), data_dir=tmp_path / "data", env={})
    assert str(refused.value).startswith(line)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("caps", "line"), [
    ("max = 0", "agents.max: must be from 1 to 100000, got 0"),
    ("max_per_owner = '3'", "agents.max_per_owner: must be an integer, got '3'"),
    ("most = 3", "agents.most: unknown key (known: max, max_per_owner)"),
])
def test_bad_caps_are_refused(tmp_path, caps, line):
    path = tmp_path / "s.toml"
    path.write_text(f"[agent]\nsandbox = 'local'\n[agents]\n{caps}\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        resolve(path, data_dir=tmp_path / "data", env={})


def test_a_template_s_secret_makes_a_readable_file_refused(tmp_path):
    path = server(tmp_path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="holds secrets or tokens and group and others may read it"):
        load_settings(path, env={})


async def test_the_file_s_own_agent_answers_byte_for_byte_as_without_templates(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "s.toml").write_text('[agent]\nid = "server1"\nhome = "home"\nsandbox = "local"\n')
    texts = []
    for folder, settings in ((plain, plain / "s.toml"), (tmp_path, server(tmp_path))):
        async with opened(folder, settings) as agent:
            result = await agent.call("r1", "shell", {"command": "echo hi; pwd; echo $GUILD_AGENT_ID"})
            texts.append((result.text.replace(str(folder), "<base>"), result.is_error))
    assert texts[0] == texts[1]
    assert "server1" in texts[0][0]


# --- made, found, removed


async def test_an_agent_is_made_with_a_copy_of_the_template_s_home_and_removed_whole(tmp_path):
    async with opened(tmp_path, server(tmp_path)) as agent:
        made = await agent.make_agent("py", owner="alice")
        home = Path(made.record.home)
        assert made.id.startswith("py-") and home.parent == tmp_path / "data" / "agent-homes"
        copied, original = home / "src" / "app.py", tmp_path / "py-home" / "src" / "app.py"
        assert copied.read_text() == "print('template')\n"
        assert os.stat(copied).st_ino != os.stat(original).st_ino  # never a hard link
        result = await made.call("r1", "shell", {"command": "cat src/app.py; echo $PY_SECRET >> src/app.py; pwd"})
        assert "print('template')" in result.text and str(home) in result.text
        assert "sekrit-value-1" not in result.text  # the template's secret, redacted
        assert original.read_text() == "print('template')\n"  # the agent's writes stay its own
        assert "remaining_tool_calls: 6" in result.text  # the template's budget
        other = await agent.make_agent("py", owner="alice")
        assert other.id != made.id and other.record.home != made.record.home
        assert [a.id for a in await agent.list_agents(owner="alice")] == [made.id, other.id]
        entry = tmp_path / "data" / "agents" / f"{made.id}.json"
        assert entry.exists()
        removed = await agent.remove_agent(made.id)
        assert removed[0] == f"the local sandbox of agent {made.id}"
        assert f"its home {home}" in removed and str(entry) in removed
        assert not home.exists() and not entry.exists()
        assert [a.id for a in await agent.list_agents()] == [other.id]
        with pytest.raises(BadInput, match=f"^agent '{made.id}': no such agent$"):
            await agent.remove_agent(made.id)
        with pytest.raises(BadInput, match="no such agent"):  # an owner sees only its own
            await agent.remove_agent(other.id, owner="mallory")
    statuses = {row[0]: row[2:] for row in agent_rows(tmp_path)}
    assert statuses == {made.id: ("alice", "removed"), other.id: ("alice", "live")}


async def test_a_restarted_server_finds_its_live_agents_and_reaps_the_expired(tmp_path):
    settings = server(tmp_path)
    async with opened(tmp_path, settings) as agent:
        kept = await agent.make_agent("py", owner="bob")
        await kept.call("r1", "shell", {"command": "echo kept > note"})
        expiring = await agent.make_agent("py", owner="bob", expires_in=0.2)
    await asyncio.sleep(0.3)
    async with opened(tmp_path, settings) as agent:
        assert [a.id for a in await agent.list_agents()] == [kept.id]
        assert not Path(expiring.record.home).exists()
        found = await agent.made_agent(kept.id, owner="bob")
        result = await found.call("r2", "shell", {"command": "cat note"})
        assert result.text.startswith("kept")
    assert {row[0]: row[3] for row in agent_rows(tmp_path)} == {kept.id: "live", expiring.id: "removed"}


async def test_caps_per_owner_and_per_server_refuse_at_their_edge_and_make_nothing(tmp_path):
    async with opened(tmp_path, server(tmp_path, max=3, per_owner=2)) as agent:
        await agent.make_agent("py", owner="a")
        await agent.make_agent("py", owner="a")
        with pytest.raises(BadInput) as refused:
            await agent.make_agent("py", owner="a")
        assert str(refused.value) == ("owner 'a' holds 2 agents, the most one owner may (agents.max_per_owner); "
                                      "remove one first")
        await agent.make_agent("default", owner="b")
        with pytest.raises(BadInput, match=r"^this server holds 3 agents, its most \(agents.max\)"):
            await agent.make_agent("py", owner="c")
        assert len(os.listdir(tmp_path / "data" / "agent-homes")) == 3
        with pytest.raises(ConfigError, match=r"^template 'nope': not served here \(served: default, py\)$"):
            await agent.make_agent("nope")
        for bad in ("", "x" * 129, "a\nb"):
            with pytest.raises(BadInput, match=r"^owner: 1 to 128 printable characters"):
                await agent.make_agent("py", owner=bad)
        with pytest.raises(BadInput, match=r"^expires_in: seconds"):
            await agent.make_agent("py", owner="b", expires_in=0)
    assert len(agent_rows(tmp_path)) == 3


async def test_a_make_that_fails_part_way_leaves_nothing_behind(tmp_path):
    extra = "[templates.dock.agent]\nhome = 'py-home'\nsandbox = 'docker'\n"
    env = {**env_of(tmp_path), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = env["DOCKER_HOST"]  # the Docker SDK reads the process's own
    try:
        async with guilds.open(server(tmp_path, extra=extra), data_dir=tmp_path / "data", env=env) as agent:
            with pytest.raises(SandboxError):
                await agent.make_agent("dock", owner="a")
            assert os.listdir(tmp_path / "data" / "agent-homes") == []
            assert not [n for n in os.listdir(tmp_path / "data" / "agents") if n.startswith("dock-")]
            assert await agent.list_agents() == []
    finally:
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved
    assert agent_rows(tmp_path) == []


def test_the_cli_makes_lists_and_removes_agents(tmp_path, capsys):
    settings, env = str(server(tmp_path)), env_of(tmp_path)
    assert cli_main(["agent", "new", "py", "--owner", "carol", "--config", settings], env) == 0
    made = capsys.readouterr().out
    assert made.startswith("made py-") and "template py  owner carol" in made and "expires never" in made
    agent_id = made.split()[1]
    assert cli_main(["agent", "list", "--config", settings], env) == 0
    assert capsys.readouterr().out.startswith(f"{agent_id}  template py  owner carol  home ")
    assert cli_main(["agent", "rm", agent_id, "--config", settings], env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"removed the local sandbox of agent {agent_id}"
    assert f"removed its home {tmp_path}/data/agent-homes/{agent_id}" in out
    assert cli_main(["agent", "list", "--config", settings], env) == 0
    assert capsys.readouterr().out == "no agents\n"
    assert cli_main(["agent", "new", "nope", "--config", settings], env) == 2
    assert capsys.readouterr().err == "guilds: template 'nope': not served here (served: default, py)\n"
    assert cli_main(["agent", "rm", "py-000000000000", "--config", settings], env) == 2
    assert capsys.readouterr().err == "guilds: agent 'py-000000000000': no such agent\n"


# --- the record, on SQLite and PostgreSQL

PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


def record_url(backend: str, tmp_path: Path) -> str:
    if backend == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    return normalize_url(PG_URL if backend == "postgresql" else f"sqlite:///{tmp_path}/guilds.db")


def agent_row(agent_id: str, owner: str) -> dict:
    return {"id": agent_id, "template": "py", "owner": owner, "sandbox": "local", "home": f"/h/{agent_id}",
            "created_at": utc_now(), "expires_at": None}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_record_without_the_agents_table_gets_it_and_makes_at_once_never_pass_a_cap(tmp_path, backend):
    url = record_url(backend, tmp_path)
    async with Store(url) as store:  # a record as it was: every table but agents, with a run in it
        await store.begin_call(run_id="r-old", agent_id="a1", tool="shell", args={}, call_id="c1",
                               started_at=utc_now(), budget=5)
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE agents"))
    async with Store(url) as store:
        assert [run.id for run in await store.list_runs("a1")] == ["r-old"]  # the older record still reads
        assert await store.agents() == []
        owner = f"owner-{os.getpid()}"
        tried = await asyncio.gather(*(store.admit_agent(agent_row(f"py-{owner}-{n}", owner),
                                                         max_total=100, max_per_owner=2) for n in range(6)),
                                     return_exceptions=True)
        refused = [r for r in tried if isinstance(r, AgentRefused)]
        assert (len(refused), tried.count(None)) == (4, 2)
        held = await store.agents(owner=owner)
        assert [a.status for a in held] == ["making", "making"]
        assert await store.mark_agent(held[0].id, "live")
        assert [a.id for a in await store.agents(owner=owner, statuses=("live",))] == [held[0].id]
        at = utc_now().replace(microsecond=0)
        assert await store.expire_agent(held[0].id, at) and not await store.expire_agent(held[1].id, at)
        assert (await store.agents(agent_id=held[0].id))[0].expires_at == at  # making: not moved
        await store.forget_agent(held[1].id)
        await store.admit_agent(agent_row(f"py-{owner}-x", owner), max_total=100, max_per_owner=2)
        with pytest.raises(AgentRefused, match=r"^this server holds 2 agents, its most \(agents.max\)"):
            await store.admit_agent(agent_row(f"py-{owner}-y", "someone"), max_total=2, max_per_owner=2)
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE agents"))  # the shared test database left as found


# --- isolation on bwrap, tried as an attacker would

BWRAP_TEMPLATE = "[templates.box.agent]\nhome = 'py-home'\nsandbox = 'bwrap'\n"


def host_pid_of(marker: str, wait: float = 5) -> int:
    """The host pid of the process whose command line holds marker (a background command just
    started: its bash may not have run it yet), looked for up to wait seconds."""
    deadline = time.monotonic() + wait
    while True:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                except OSError:
                    continue
                if marker.encode() in cmdline and b"sleep" in cmdline:
                    return int(name)
        if time.monotonic() > deadline:
            raise AssertionError(f"no process with {marker}")
        time.sleep(0.05)


@pytest.mark.bwrap
@pytest.mark.skipif(bwrap_unavailable() is not None or os.geteuid() != 0,
                    reason=f"needs root and bwrap ({bwrap_unavailable()})")
async def test_two_agents_of_one_template_cannot_read_see_or_signal_each_other(tmp_path):
    async with opened(tmp_path, server(tmp_path, extra=BWRAP_TEMPLATE)) as agent:
        a, b = await agent.make_agent("box", owner="a"), await agent.make_agent("box", owner="b")
        try:
            marker = f"60{os.getpid() % 10000:04d}"
            await a.call("ra", "shell", {"command": "echo a-private-words > mine.txt"})
            started = await a.call("ra", "shell", {"command": f"sleep {marker}", "background": True})
            assert "started b1" in started.text
            victim = host_pid_of(marker)
            uid_a = (await a.call("ra", "shell", {"command": "id -u"})).text.split()[0]
            uid_b = (await b.call("rb", "shell", {"command": "id -u"})).text.split()[0]
            assert uid_a != uid_b
            with pytest.raises(BadInput, match=r"^run 'ra' belongs to agent"):  # nor its runs
                await b.call("ra", "shell", {"command": "true"})
            home_a = a.record.home
            attacks = {
                "read": f"cat {home_a}/mine.txt",
                "list": f"ls -a {home_a}",
                "find": "find / -name mine.txt -not -path '/proc/*' 2>/dev/null; echo searched",
                "proc": f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; ls /proc/{victim}/root",
                "signal": f"kill -KILL {victim}; kill -STOP {victim}",
            }
            for what, command in attacks.items():
                result = await b.call("rb", "shell", {"command": command})
                assert "a-private-words" not in result.text and "mine.txt" not in result.text.replace(
                    f"{home_a}/mine.txt", ""), what
                assert marker not in result.text.replace(f"sleep {marker}", "") or what == "proc", what
                if what == "proc":
                    assert f"sleep {marker}" not in result.text
                if what == "signal":
                    assert result.text.count("No such process") == 2
            await b.call("rb", "shell", {"command": "kill -KILL -1", "background": True})  # every process it may
            await asyncio.sleep(0.3)
            assert Path(f"/proc/{victim}/stat").read_text().split()[2] in ("S", "R")  # A's sleep runs on
            assert (await a.call("ra", "shell", {"command": "cat mine.txt"})).text.startswith("a-private-words")
            status = await a.call("ra", "shell_status", {"id": "b1"})
            assert "running" in status.text
        finally:
            for made in (a, b):
                await agent.remove_agent(made.id)
        assert not os.path.exists(f"/proc/{victim}")  # removed: its processes with it


def test_guilds_call_runs_a_tool_as_an_agent_made_on_demand(tmp_path, capsys):
    settings, env = str(server(tmp_path)), env_of(tmp_path)
    assert cli_main(["agent", "new", "py", "--config", settings], env) == 0
    agent_id = capsys.readouterr().out.split()[1]
    assert cli_main(["call", "shell", '{"command": "pwd; cat src/app.py"}', "--agent", agent_id,
                     "--config", settings], env) == 0
    out = capsys.readouterr().out
    assert f"agent-homes/{agent_id}\nprint('template')" in out and "remaining_tool_calls: 6" in out
    assert cli_main(["call", "shell", '{"command": "true"}', "--agent", "py-000000000000",
                     "--config", settings], env) == 2
    assert capsys.readouterr().err == "guilds: agent 'py-000000000000': no such agent\n"


async def test_a_server_reaps_the_expired_at_its_start_and_while_it_runs(tmp_path):
    settings = server(tmp_path)
    async with opened(tmp_path, settings) as agent:
        early = await agent.make_agent("py", expires_in=0.1)
    await asyncio.sleep(0.2)
    async with opened(tmp_path, settings) as agent, agents_reaped(agent.wired, agent.toolbox.store) as agents:
        assert await agents.live() == []  # as serve starts
        assert not Path(early.record.home).exists()
        late = await agents.make("py", expires_in=0.2)
        kept = await agents.make("py")
        reaper = asyncio.create_task(agents.reap_every(0.1))
        try:
            await asyncio.sleep(0.6)
        finally:
            reaper.cancel()
        assert [a.id for a in await agents.live()] == [kept.id]
        assert not Path(late.home).exists()


async def test_a_storm_of_makes_past_the_cap_gets_refusals_and_no_half_made_agent(tmp_path):
    async with opened(tmp_path, server(tmp_path, max=4, per_owner=4)) as agent:
        tried = await asyncio.gather(*(agent.make_agent("py", owner=f"o{n % 2}") for n in range(10)),
                                     return_exceptions=True)
        made = [r for r in tried if not isinstance(r, BaseException)]
        refused = [r for r in tried if isinstance(r, AgentRefused)]
        assert (len(made), len(refused)) == (4, 6)
        homes = sorted(os.listdir(tmp_path / "data" / "agent-homes"))
        assert homes == sorted(m.id for m in made)
        assert all((tmp_path / "data" / "agent-homes" / h / "src" / "app.py").exists() for h in homes)
    assert sorted(row[3] for row in agent_rows(tmp_path)) == ["live"] * 4


async def test_an_agent_left_half_made_by_a_stopped_process_is_reaped(tmp_path):
    async with opened(tmp_path, server(tmp_path)) as agent:
        agents = await agent.agents()
        home = agents.home_of("py-0123456789ab")
        home.parent.mkdir(mode=0o700, exist_ok=True)
        home.mkdir()  # what a process stopped midway left: its row and its home
        row = {**agent_row("py-0123456789ab", "a"), "home": str(home)}
        await agent.toolbox.store.admit_agent(row, max_total=5, max_per_owner=5)
        assert await agents.reap() == []  # a make under way is left alone
        later = utc_now() + timedelta(seconds=AGENT_MAKING_STALE_SECONDS + 1)
        assert await agents.reap(later) == ["py-0123456789ab"]
        assert not home.exists()
    assert agent_rows(tmp_path) == [("py-0123456789ab", "py", "a", "removed")]


async def test_a_retired_agent_is_gone_at_once_and_torn_down_after_even_across_a_stop(tmp_path):
    settings = server(tmp_path)
    async with opened(tmp_path, settings) as agent:
        agents = await agent.agents()
        first, second = [await agent.make_agent("py", owner="a") for _ in range(2)]
        homes = [Path(first.record.home), Path(second.record.home)]
        async with agents._teardowns:  # the teardowns held back: as a process stopped before they ran
            await agents.retire(first.id)
            await agents.retire(second.id, owner="a")
            assert [row[3] for row in agent_rows(tmp_path)] == ["retiring"] * 2
            assert await agent.list_agents() == [] and all(home.exists() for home in homes)
            with pytest.raises(BadInput, match="no such agent"):  # not found, not removed twice
                await agents.retire(first.id)
            with pytest.raises(BadInput, match="no such agent"):
                await agent.remove_agent(second.id)
            agents._removing.pop(second.id).cancel()  # its teardown never runs: the process stops
        await asyncio.sleep(0)
    assert not homes[0].exists() and homes[1].exists()  # the first's teardown done at the close
    assert [row[3] for row in agent_rows(tmp_path)] == ["removed", "retiring"]
    async with opened(tmp_path, settings) as agent:
        await agent.agents()  # the next open removes what a stopped process left retiring
        assert not homes[1].exists() and not (tmp_path / "data" / "agents" / f"{second.id}.json").exists()
    assert [row[3] for row in agent_rows(tmp_path)] == ["removed"] * 2


async def test_an_agent_s_expiry_is_moved_or_lifted_and_the_reaper_follows_it(tmp_path):
    async with opened(tmp_path, server(tmp_path)) as agent:
        soon = await agent.make_agent("py", owner="a", expires_in=0.2)
        lifted = await agent.expire_agent(soon.id, None)
        assert lifted.expires_at is None
        never = await agent.make_agent("py", owner="a")
        moved = await agent.expire_agent(never.id, 0.2, owner="a")
        assert moved.expires_at is not None
        with pytest.raises(BadInput, match="no such agent"):  # another owner's
            await agent.expire_agent(never.id, 60, owner="b")
        with pytest.raises(BadInput, match=r"^expires_in: seconds"):
            await agent.expire_agent(never.id, -1)
        await asyncio.sleep(0.3)
        assert await (await agent.agents()).reap() == [never.id]
        assert [a.id for a in await agent.list_agents()] == [soon.id]
        with pytest.raises(BadInput, match="no such agent"):  # removed: no expiry to move
            await agent.expire_agent(never.id, 60)
