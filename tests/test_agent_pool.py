"""Warm pools (guilds.agents.pool, guilds.agents.demand): agents of a template made
ahead on real bwrap and a real Docker engine, adopted by a make, refilled, sized from
demand, kept within the server's cap, taken back or removed by a restarted server,
never handed out dead. Real SQLite, real processes; a killed server is a real
process killed with SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa

import backend_kit
import guilds
from guilds.agents import pool as pool_module
from guilds.agents.demand import target
from guilds.config.templates import PoolSettings
from guilds.errors import BadInput, ConfigError
from guilds.fronts.wiring import resolve
from guilds.observe.metrics import Metrics
from guilds.record.agent_rows import AgentRefused
from guilds.record.engine import normalize_url
from guilds.record.statements import utc_now
from guilds.record.store import Store

IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
FILL_SECONDS = 60.0


def server(tmp_path: Path, backend: str = "bwrap", *, spare: int = 1, max_pool: int = 4, cool_down: int = 60,
           window: int = 10, agents_max: int = 10, per_owner: int = 5) -> Path:
    """Settings serving the template ``box`` (its home holds f.txt) with a warm pool."""
    home = tmp_path / "box-home"
    home.mkdir(exist_ok=True)
    (home / "f.txt").write_text("from the template\n")
    docker = f"[templates.box.docker]\nimage = '{IMAGE}'\nmemory = '256m'\n" if backend == "docker" else ""
    path = tmp_path / "server.toml"
    path.write_text(f"""
[agent]
id = "server1"
home = "home"
sandbox = "local"

[templates.box.agent]
home = "box-home"
sandbox = "{backend}"
{docker}
[templates.box.pool]
spare = {spare}
max = {max_pool}
cool_down_seconds = {cool_down}
window_seconds = {window}

[agents]
max = {agents_max}
max_per_owner = {per_owner}
""")
    path.chmod(0o600)
    return path


def opened(tmp_path: Path, settings: Path, *, pool: bool = True) -> guilds.fronts.agent.Agent:
    return guilds.open(settings, data_dir=tmp_path / "data", env={**os.environ, "GUILDS_DATA": str(tmp_path / "data")},
                       pool=pool)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, settings: Path, *, pool: bool = True):
    """An open agent and its agents made on demand; the live ones removed at the end (nothing left running)."""
    async with opened(tmp_path, settings, pool=pool) as agent:
        agents = await agent.agents()
        try:
            yield agent, agents
        finally:
            for record in await agents.live():
                await agents.remove(record.id)


async def until(check, what: str, seconds: float = FILL_SECONDS):
    """Poll check() (sync or async) until it is truthy; its value."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.05)


def ready(agents, n: int, template: str = "box"):
    return lambda: agents.pools.counts()[template].ready >= n and agents.pools.counts()[template].making == 0


def rows(agents):
    return agents.store.agents(statuses=("making", "live", "pooled", "retiring", "removed"))


async def statuses(agents) -> dict[str, str]:
    return {record.id: record.status for record in await rows(agents)}


# --- the settings


def test_a_pool_s_keys_are_read_with_their_defaults(tmp_path):
    served = resolve(server(tmp_path, spare=2, max_pool=20, agents_max=20), data_dir=tmp_path / "data", env={})
    from guilds.config.templates import served_by

    pool = served_by(served.settings, served.settings_file, {}).template("box").pool
    assert pool == PoolSettings(spare=2, max=20, cool_down_seconds=60, window_seconds=10)
    assert served_by(served.settings, served.settings_file, {}).template("default").pool.on is False


@pytest.mark.parametrize(("table", "line"), [
    ("spare = 3\nmax = 2", "templates.q.pool.spare: must be at most pool.max (2), got 3"),
    ("max = 1001", "templates.q.pool.max: must be from 0 to 1000, got 1001"),
    ("max = -1", "templates.q.pool.max: must be from 0 to 1000, got -1"),
    ("max = 11", "templates.q.pool.max: must be at most agents.max (10), got 11"),
    ("max = 2\nwindow_seconds = 0", "templates.q.pool.window_seconds: must be from 1 to 3600, got 0"),
    ("max = 2\ncool_down_seconds = 86401", "templates.q.pool.cool_down_seconds: must be from 0 to 86400, got 86401"),
    ("max = '2'", "templates.q.pool.max: must be an integer, got '2'"),
    ("size = 2", "templates.q.pool.size: unknown key (known: spare, max, cool_down_seconds, window_seconds)"),
])
def test_a_bad_pool_key_is_one_line_naming_it(tmp_path, table, line):
    path = tmp_path / "s.toml"
    path.write_text(f"[agent]\nsandbox = 'local'\n[templates.q.agent]\nsandbox = 'bwrap'\n"
                    f"[templates.q.pool]\n{table}\n[agents]\nmax = 10\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        resolve(path, data_dir=tmp_path / "data", env={})


@pytest.mark.parametrize("sandbox", ["local", "kubernetes"])
def test_a_pool_needs_bwrap_or_docker(tmp_path, sandbox):
    path = tmp_path / "s.toml"
    path.write_text(f"[agent]\nsandbox = 'local'\n[templates.q.agent]\nsandbox = '{sandbox}'\n"
                    "[templates.q.pool]\nmax = 2\n")
    with pytest.raises(ConfigError, match=f"^templates.q.pool: a warm pool needs agent.sandbox bwrap, docker or "
                                          f"auto, or kubernetes with kubernetes.mode \"claim\", got '{sandbox}'$"):
        resolve(path, data_dir=tmp_path / "data", env={})
    path.write_text(f"[agent]\nsandbox = 'local'\n[templates.q.agent]\nsandbox = '{sandbox}'\n"
                    "[templates.q.pool]\nmax = 0\n")  # 0: no pool, on any sandbox
    resolve(path, data_dir=tmp_path / "data", env={})


def test_the_top_level_pool_is_the_default_template_s(tmp_path):
    from guilds.config.templates import served_by

    path = tmp_path / "s.toml"
    path.write_text("[agent]\nsandbox = 'bwrap'\n[pool]\nspare = 1\nmax = 3\nwindow_seconds = 5\n")
    wired = resolve(path, data_dir=tmp_path / "data", env={})
    assert served_by(wired.settings, wired.settings_file, {}).template("default").pool == PoolSettings(
        spare=1, max=3, cool_down_seconds=60, window_seconds=5)


@pytest.mark.parametrize(("text", "line"), [
    ("[agent]\nsandbox = 'local'\n[pool]\nmax = 2\n",
     ("pool: a warm pool needs agent.sandbox bwrap, docker or auto, or kubernetes with kubernetes.mode \"claim\", "
      "got 'local'")),
    ("[agent]\nsandbox = 'bwrap'\n[pool]\nmax = 11\n[agents]\nmax = 10\n",
     "pool.max: must be at most agents.max (10), got 11"),
    ("[agent]\nsandbox = 'bwrap'\n[pool]\nspare = 3\nmax = 2\n", "pool.spare: must be at most pool.max (2), got 3"),
    ("[agent]\nsandbox = 'bwrap'\n[pool]\nsize = 2\n",
     "pool.size: unknown key (known: spare, max, cool_down_seconds, window_seconds)"),
    ("[agent]\nsandbox = 'bwrap'\npool = 2\n", "agent.pool: unknown key"),
])
def test_a_bad_default_pool_is_one_line_naming_its_key(tmp_path, text, line):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}"):
        resolve(path, data_dir=tmp_path / "data", env={})


def test_the_pool_s_owner_name_is_refused_to_callers():
    from guilds.agents.registry import checked_owner

    with pytest.raises(BadInput, match=r"^owner: 'pool:' begins the names of the warm pools' holders"):
        checked_owner("pool:x")


# --- the sizing rule (pure)

POOL = PoolSettings(spare=2, max=20, cool_down_seconds=60, window_seconds=10)


def test_the_target_is_spare_plus_the_makes_of_the_window_capped_by_max():
    assert target([], 100.0, POOL) == 2
    assert target([95.0, 96.0, 97.0], 100.0, POOL) == 5
    assert target([float(t) for t in range(80, 100)], 100.0, POOL) == 12  # 10 in the last 10 s
    assert target([100.0 + t / 10 for t in range(100)], 110.0, POOL) == 20  # capped
    assert target([1.0], 5.0, PoolSettings()) == 0  # no pool


def test_under_a_steady_stream_the_target_grows_and_shrinks_only_after_the_cool_down():
    stream = [float(t) for t in range(100)]  # one make a second for 100 s
    assert target(stream[:1], 0.0, POOL) == 3
    assert target(stream[:6], 5.0, POOL) == 8
    assert target(stream, 99.0, POOL) == 12  # steady: spare + the window's 10
    assert target(stream, 150.0, POOL) == 12  # no make for 51 s: still within the cool-down
    assert target(stream, 159.5, POOL) == 12
    assert target(stream, 160.5, POOL) == 11  # the cool-down passes the peak: it falls
    assert target(stream, 170.0, POOL) == 2
    burst = [50.0] * 30
    assert target(burst, 50.0, POOL) == 20
    assert target(burst, 119.0, POOL) == 20  # the window, then the cool-down
    assert target(burst, 120.5, POOL) == 2


# --- on bwrap and docker

pytestmark_backends = pytest.mark.backends("bwrap", "docker")


@pytestmark_backends
async def test_a_make_adopts_a_pooled_agent_and_the_pool_refills(tmp_path, backend):
    async with serving(tmp_path, server(tmp_path, backend, spare=2)) as (agent, agents):
        await until(ready(agents, 2), "the pool filled")
        pooled = {p.id for p in agents.pools.pools["box"].ready}
        assert {r.id: (r.owner.startswith("pool:"), r.status) for r in await rows(agents)} == \
               dict.fromkeys(pooled, (True, "pooled"))
        assert await agents.live() == []  # listed nowhere, counted against no owner
        started = time.monotonic()
        made = await agent.make_agent("box", owner="alice", expires_in=600)
        assert made.id in pooled
        assert (made.record.owner, made.record.status) == ("alice", "live")
        assert made.record.expires_at - made.record.created_at == timedelta(seconds=600)
        assert made.toolbox.started and made.toolbox.transport.channel is not None  # nothing left to start
        first = await made.call("r1", "shell", {"command": "cat f.txt; pwd"})
        assert first.text.startswith(f"from the template\n{made.record.home}\n")
        assert time.monotonic() - started < 5
        recorded = (await agents.store.agents(agent_id=made.id))[0]
        assert (recorded.owner, recorded.status) == ("alice", "live")
        assert [a.id for a in await agent.list_agents(owner="alice")] == [made.id]
        counts = agents.pools.counts()["box"]
        assert (counts.hits, counts.misses) == (1, 0)
        await until(ready(agents, 3), "refilled to spare + the make of the window")
        assert agents.pools.counts()["box"].target == 3
        metrics = Metrics()
        metrics.watch_pools(agents.pools)
        text = metrics.text().decode()
        assert 'guilds_pool_agents{state="ready",template="box"} 3.0' in text
        assert 'guilds_pool_hits_total{template="box"} 1.0' in text
        assert 'guilds_pool_misses_total{template="box"} 0.0' in text
        held = {p.id: p.record.home for p in agents.pools.pools["box"].ready}
        await agent.remove_agent(made.id)
    after = rows_on_disk(tmp_path)
    assert all(after[agent_id] == "removed" for agent_id in held)  # the close removed the pooled
    assert not any(Path(home).exists() for home in held.values())


def rows_on_disk(tmp_path: Path) -> dict[str, str]:
    import sqlite3

    with sqlite3.connect(tmp_path / "data" / "guilds.db") as conn:
        return dict(conn.execute("SELECT id, status FROM agents").fetchall())


@pytestmark_backends
async def test_two_adopted_agents_share_no_home_uid_or_process(tmp_path, backend):
    async with serving(tmp_path, server(tmp_path, backend, spare=2)) as (agent, agents):
        await until(ready(agents, 2), "the pool filled")
        a, b = await agent.make_agent("box", owner="a"), await agent.make_agent("box", owner="b")
        assert agents.pools.counts()["box"].hits == 2
        marker = f"7{os.getpid() % 10000:04d}1"
        await a.call("ra", "shell", {"command": "echo private-words > mine.txt"})
        await a.call("ra", "shell", {"command": f"sleep {marker}", "background": True})
        seen = await b.call("rb", "shell", {"command": f"cat {a.record.home}/mine.txt; ls {a.record.home}; "
                                                       "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; "
                                                       "cat f.txt; ls"})
        assert "private-words" not in seen.text and f"sleep {marker}" not in seen.text
        assert "mine.txt" not in seen.text.replace(f"{a.record.home}/mine.txt", "")
        assert "from the template" in seen.text
        uids = [(await x.call(r, "shell", {"command": "id -u"})).text.split()[0] for x, r in ((a, "ra"), (b, "rb"))]
        if backend == "bwrap":
            assert uids[0] != uids[1]
        assert a.record.home != b.record.home
        assert "running" in (await a.call("ra", "shell_status", {"id": "b1"})).text


@pytestmark_backends
async def test_a_killed_pooled_sandbox_is_never_handed_out(tmp_path, backend):
    async with serving(tmp_path, server(tmp_path, backend, spare=1, cool_down=0, window=1)) as (agent, agents):
        await until(ready(agents, 1), "the pool filled")
        victim = agents.pools.pools["box"].ready[0].id
        kill_sandbox(tmp_path, backend, victim)
        made = await agent.make_agent("box", owner="alice")
        assert made.id != victim
        assert (await made.call("r1", "shell", {"command": "echo alive"})).text.startswith("alive")
        counts = agents.pools.counts()["box"]
        assert (counts.hits, counts.misses) == (0, 1)
        await until(lambda: statuses_now(agents, victim, "removed"), "the dead one removed")
        assert not Path(tmp_path / "data" / "agent-homes" / victim).exists()


async def statuses_now(agents, agent_id: str, status: str) -> bool:
    return (await statuses(agents)).get(agent_id) == status


def kill_sandbox(tmp_path: Path, backend: str, agent_id: str) -> None:
    """SIGKILL the bwrap sandbox's init (the kernel ends the rest), or kill the container."""
    if backend == "bwrap":
        import json

        record = json.loads((tmp_path / "data" / "sandboxes" / f"{agent_id}.json").read_text())
        os.kill(record["pid"], signal.SIGKILL)
        return
    import docker

    client = docker.from_env()
    try:
        client.api.kill(f"guilds-{agent_id}")
    finally:
        client.close()


@pytestmark_backends
async def test_a_restarted_server_takes_back_the_pooled_that_answer_and_removes_the_rest(tmp_path, backend):
    settings = server(tmp_path, backend, spare=3)
    script = tmp_path / "holder.py"
    script.write_text(f"""
import asyncio, guilds, os, sys
async def main():
    async with guilds.open({str(settings)!r}, data_dir={str(tmp_path / 'data')!r}, pool=True) as agent:
        agents = await agent.agents()
        while agents.pools.counts()["box"].ready < 3:
            await asyncio.sleep(0.05)
        print(" ".join(p.id for p in agents.pools.pools["box"].ready), flush=True)
        await asyncio.sleep(3600)
asyncio.run(main())
""")
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "GUILDS_DATA": str(tmp_path / "data")}) as holder:
        try:
            left = holder.stdout.readline().split()
        finally:
            holder.kill()  # a server killed: nothing of it runs its close
    assert len(left) == 3
    kill_sandbox(tmp_path, backend, left[0])
    async with serving(tmp_path, settings) as (agent, agents):
        kept = {p.id for p in agents.pools.pools["box"].ready}
        assert kept == set(left[1:])  # taken back as the start ends, before any refill
        found = await statuses(agents)
        assert found[left[0]] == "removed" and not Path(tmp_path / "data" / "agent-homes" / left[0]).exists()
        assert all(found[i] == "pooled" for i in left[1:])
        made = await agent.make_agent("box", owner="alice")
        assert made.id in kept
        assert (await made.call("r1", "shell", {"command": "cat f.txt"})).text.startswith("from the template")
    found = rows_on_disk(tmp_path)
    assert [i for i, s in found.items() if s not in ("removed", "live")] == []  # nothing orphaned


async def test_a_second_process_leaves_a_running_holder_s_pooled_agents_alone(tmp_path):
    settings = server(tmp_path, spare=1)
    async with serving(tmp_path, settings) as (first, agents):
        await until(ready(agents, 1), "the pool filled")
        theirs = agents.pools.pools["box"].ready[0].id
        async with serving(tmp_path, settings) as (_second, other):  # its start takes back only a gone holder's
            assert theirs not in {p.id for p in other.pools.pools["box"].ready}
            await until(ready(other, 1), "its own pool filled")
            assert other.pools.pools["box"].ready[0].id != theirs
        assert (await statuses(agents))[theirs] == "pooled"
        assert (await first.make_agent("box", owner="a")).id == theirs


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_the_record_adopts_a_fork_s_children_at_once_within_the_owner_s_cap(tmp_path, backend):
    async with agents_table(tmp_path, backend) as store:
        for agent_id in ("p1", "p2", "p3", "p4", "p5"):
            await store.admit_agent(pool_row(agent_id, "pool:holder"), max_total=9, max_per_owner=9)
            assert await store.mark_agent(agent_id, "pooled", only_from=("making",))
        await store.admit_agent(pool_row("l1", "alice"), max_total=9, max_per_owner=9)
        assert await store.mark_agent("p2", "retiring", only_from=("pooled",))  # retired meanwhile
        change = {"owner": "alice", "created_at": utc_now(), "expires_at": None}
        taken, looked = await store.adopt_agents(["p1", "p2", "p3", "p4", "p5"], change, max_per_owner=4, n=5)
        assert (taken, looked) == (["p1", "p3", "p4"], 4)  # alice had 1 of 4: room for 3; p2 was not pooled
        assert sorted(a.id for a in await store.agents(owner="alice")) == ["l1", "p1", "p3", "p4"]
        assert [a.id for a in await store.agents(statuses=("pooled",))] == ["p5"]
        with pytest.raises(AgentRefused, match=r"^owner 'alice' holds 4 agents"):
            await store.adopt_agents(["p5"], change, max_per_owner=4, n=1)
        bob = {**change, "owner": "bob"}
        assert await store.adopt_agents(["p1", "p5"], bob, max_per_owner=4, n=1) == (["p5"], 2)  # p1 is alice's


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_the_server_s_cap_counts_the_pooled_and_a_make_at_the_cap_evicts_one(tmp_path):
    async with serving(tmp_path, server(tmp_path, spare=2, max_pool=3, agents_max=3, per_owner=3)) as (agent, agents):
        await until(ready(agents, 2), "the pool filled")
        held = []
        peak = 0
        for owner in ("a", "b", "c"):
            held.append(await agent.make_agent("box", owner=owner))
            counted = [r for r in await rows(agents) if r.status in ("making", "live", "pooled")]
            peak = max(peak, len(counted))
        await asyncio.sleep(0.5)  # the refill tries and is refused at the cap
        counted = [r for r in await rows(agents) if r.status in ("making", "live", "pooled")]
        assert max(peak, len(counted)) <= 3
        assert len([r for r in counted if r.status == "live"]) == 3
        with pytest.raises(AgentRefused, match=r"^this server holds 3 agents, its most \(agents.max\)"):
            await agent.make_agent("box", owner="d")
        await agent.remove_agent(held[0].id)
        await until(ready(agents, 1), "refilled into the freed place")
        assert len([r for r in await rows(agents) if r.status in ("making", "live", "pooled")]) == 3


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_a_make_of_another_template_at_the_cap_takes_a_pooled_agent_s_place(tmp_path):
    settings = server(tmp_path, spare=2, max_pool=2, agents_max=2, per_owner=2)
    settings.write_text(settings.read_text() + "\n[templates.other.agent]\nsandbox = 'bwrap'\n")
    async with serving(tmp_path, settings) as (agent, agents):
        await until(ready(agents, 2), "the pool filled")
        evicted_from = {p.id for p in agents.pools.pools["box"].ready}
        made = await agent.make_agent("other", owner="a")
        assert made.record.template == "other"
        found = await statuses(agents)
        assert sorted(found[i] for i in evicted_from) in (["pooled", "removed"], ["pooled", "retiring"])


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_the_pool_grows_under_a_steady_stream_and_shrinks_only_after_the_cool_down(tmp_path):
    settings = server(tmp_path, spare=1, max_pool=6, cool_down=12, window=2, agents_max=20)
    async with serving(tmp_path, settings) as (agent, agents):
        await until(ready(agents, 1), "the pool filled")
        for n in range(8):  # four makes a second for two seconds
            await agent.make_agent("box", owner=f"o{n % 4}")
            await asyncio.sleep(0.25)
        stopped = time.monotonic()
        counts = agents.pools.counts()["box"]
        assert counts.target == 6 and counts.hits + counts.misses == 8  # spare + the window's makes, capped
        assert counts.ready + counts.making >= 5  # its makes started at once
        await until(lambda: agents.pools.counts()["box"].ready == 6, "grown to the target", 11)
        while time.monotonic() - stopped < 11.5:  # the cool-down after the last make: held
            assert agents.pools.counts()["box"].target == 6
            await asyncio.sleep(0.2)
        await until(lambda: agents.pools.counts()["box"].target == 1, "the target falls after the cool-down", 5)
        await until(ready_exactly(agents, 1), "shrunk to spare", 30)


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
@pytest.mark.skipif(os.geteuid() != 0, reason="a fork takes pooled agents whose overlay homes a root orchestrator made")
async def test_a_fork_s_take_refills_after_its_pause_and_a_make_s_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_module, "POOL_FORK_REFILL_PAUSE_SECONDS", 3.0)
    async with serving(tmp_path, server(tmp_path, spare=2, max_pool=3)) as (agent, agents):
        await until(ready(agents, 2), "the pool filled")
        taken = await agents.pools.take_swappable("box", 2, "alice", None, 5)
        started = time.monotonic()
        assert [record.owner for record, _ in taken] == ["alice", "alice"]
        await until(lambda: agents.pools.counts()["box"].making > 0, "the refill started", 30)
        assert time.monotonic() - started > 2.5  # not before the pause (the tick is 1 s)
        await until(ready(agents, 3), "refilled to spare + the takes of the window")
        made = time.monotonic()
        await agent.make_agent("box", owner="bob")
        await until(lambda: agents.pools.counts()["box"].making > 0, "the make's refill started", 30)
        assert time.monotonic() - made < 2.5


def ready_exactly(agents, n: int):
    return lambda: agents.pools.counts()["box"].ready == n and agents.pools.counts()["box"].making == 0


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_a_make_that_finds_the_pool_empty_does_not_wait_for_the_refill(tmp_path):
    refills, release = [], asyncio.Event()

    async def held(toolbox):  # the refill (the pool's second) is held until the miss is made
        refills.append(toolbox.settings.id)
        if len(refills) > 1:
            await release.wait()

    async with serving(tmp_path, server(tmp_path, spare=1, max_pool=1), pool=False) as (agent, agents):
        agents.pools.prepare_with(held)
        await agents.pools.start()
        await until(ready(agents, 1), "the pool filled")
        first = await agent.make_agent("box", owner="a")
        await until(lambda: agents.pools.counts()["box"].making == 1 and len(refills) == 2, "the refill started")
        second = await agent.make_agent("box", owner="a")  # a miss: made by itself
        counts = agents.pools.counts()["box"]
        assert (counts.hits, counts.misses) == (1, 1)
        release.set()
        await until(ready(agents, 1), "the refill is the pool's")
        assert agents.pools.pools["box"].ready[0].id not in (first.id, second.id)


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_the_owner_s_cap_refuses_an_adoption_and_leaves_the_agent_pooled(tmp_path):
    async with serving(tmp_path, server(tmp_path, spare=1, per_owner=1)) as (agent, agents):
        await agent.make_agent("box", owner="a")
        await until(ready(agents, 1), "the pool filled")
        waiting = agents.pools.pools["box"].ready[0].id
        with pytest.raises(AgentRefused, match=r"^owner 'a' holds 1 agents"):
            await agent.make_agent("box", owner="a")
        assert waiting in {p.id for p in agents.pools.pools["box"].ready}
        assert (await statuses(agents))[waiting] == "pooled"


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
async def test_the_hook_runs_in_each_pooled_sandbox_and_keeping_moves_the_idle_clock(tmp_path):
    ran = []

    async def hook(toolbox):
        ran.append(toolbox.settings.id)
        await toolbox.sandbox.exec(["sh", "-c", "echo prepared > prepared.txt"], timeout=10)

    async with serving(tmp_path, server(tmp_path, spare=1)) as (agent, agents):  # pool=True: started with it
        with pytest.raises(RuntimeError, match=r"^prepare_with: the pools have started"):
            agents.pools.prepare_with(hook)
    async with serving(tmp_path, server(tmp_path, spare=1), pool=False) as (agent, agents):
        agents.pools.prepare_with(hook)
        await agents.pools.start()
        await until(ready(agents, 1), "the pool filled")
        pooled = agents.pools.pools["box"].ready[0].id
        assert ran == [pooled]
        clock = tmp_path / "data" / "sandboxes" / f"{pooled}.clock"
        os.utime(clock, (time.time() - 3600, time.time() - 3600))
        await agents.pools.keep()
        assert time.time() - clock.stat().st_mtime < 60
        made = await agent.make_agent("box", owner="a")
        assert (await made.call("r", "shell", {"command": "cat prepared.txt"})).text.startswith("prepared")


# --- the record: adoption, eviction and hand-over in one transaction each

PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


@contextlib.asynccontextmanager
async def agents_table(tmp_path: Path, backend: str):
    """A Store whose agents table is this test's own: made anew, dropped at the end (the shared
    test database left as found)."""
    if backend == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    url = normalize_url(PG_URL if backend == "postgresql" else f"sqlite:///{tmp_path}/guilds.db")
    async with Store(url) as store, store.engine.begin() as conn:
        await conn.execute(sa.text("DROP TABLE agents"))
    async with Store(url) as store:
        try:
            yield store
        finally:
            async with store.engine.begin() as conn:
                await conn.execute(sa.text("DROP TABLE agents"))


def pool_row(agent_id: str, owner: str) -> dict:
    return {"id": agent_id, "template": "box", "owner": owner, "sandbox": "bwrap", "home": f"/h/{agent_id}",
            "created_at": utc_now(), "expires_at": None}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_the_record_admits_many_at_once_all_or_none_evicting_one_pooled_agent_for_each_past_the_cap(
        tmp_path, backend):
    async with agents_table(tmp_path, backend) as store:
        for agent_id in ("p1", "p2"):
            await store.admit_agent(pool_row(agent_id, "pool:holder"), max_total=4, max_per_owner=4)
            assert await store.mark_agent(agent_id, "pooled", only_from=("making",))
        retired = await store.admit_agents([pool_row(f"l{n}", "alice") for n in (1, 2, 3)], max_total=4,
                                           max_per_owner=3, evictable=["gone", "p1", "p2"])
        assert retired == ["p1"]  # the third is past the cap of 4
        making = await store.agents(statuses=("making",))
        assert sorted(a.id for a in making) == ["l1", "l2", "l3"]
        with pytest.raises(AgentRefused, match=r"^owner 'bob' holds 1 agents"):
            await store.admit_agents([pool_row("b1", "bob"), pool_row("b2", "bob")], max_total=10,
                                     max_per_owner=1)
        with pytest.raises(AgentRefused, match=r"^this server holds 5 agents"):
            await store.admit_agents([pool_row("b1", "bob"), pool_row("b2", "bob")], max_total=5,
                                     max_per_owner=2)
        assert not await store.agents(owner="bob", statuses=("making", "live"))  # a refusal keeps none
        assert await store.mark_agents(["l1", "l2", "l3"], "live") == 3
        assert sorted(a.id for a in await store.agents(statuses=("live",))) == ["l1", "l2", "l3"]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_the_record_adopts_once_evicts_at_the_cap_and_hands_over(tmp_path, backend):
    async with agents_table(tmp_path, backend) as store:
        holder = "pool:holder"
        for agent_id in ("p1", "p2", "p3"):
            await store.admit_agent(pool_row(agent_id, holder), max_total=4, max_per_owner=4)
            assert await store.mark_agent(agent_id, "pooled", only_from=("making",))
        change = {"owner": "alice", "created_at": utc_now(), "expires_at": None}
        tried = await asyncio.gather(*(store.adopt_agent(["p1"], change, max_per_owner=2) for _ in range(5)))
        assert (tried.count("p1"), tried.count(None)) == (1, 4)  # adopted once
        assert [(a.id, a.owner) for a in await store.agents(statuses=("live",))] == [("p1", "alice")]
        await store.admit_agent(pool_row("l2", "alice"), max_total=4, max_per_owner=2)  # 4: the cap
        with pytest.raises(AgentRefused, match=r"^owner 'alice' holds 2 agents"):
            await store.adopt_agent(["p2"], change, max_per_owner=2)
        assert (await store.agents(agent_id="p2", statuses=("pooled",)))[0].owner == holder  # left pooled
        with pytest.raises(AgentRefused, match=r"^this server holds 4 agents"):
            await store.admit_agent(pool_row("l3", "bob"), max_total=4, max_per_owner=2)
        retired = await store.admit_agent(pool_row("l3", "bob"), max_total=4, max_per_owner=2,
                                          evictable=["gone", "p3", "p2"])
        assert retired == "p3"
        assert [a.id for a in await store.agents(statuses=("retiring",))] == ["p3"]
        assert not await store.mark_agent("p3", "pooled", only_from=("making",))  # a make sees it retired
        assert await store.hand_over_agent("p2", holder, "pool:next")
        assert not await store.hand_over_agent("p2", holder, "pool:other")  # once
        assert (await store.agents(agent_id="p2", statuses=("pooled",)))[0].owner == "pool:next"


@pytest.mark.bwrap
@pytest.mark.skipif(backend_kit.why_not("bwrap") is not None, reason=f"bwrap: {backend_kit.why_not('bwrap')}")
def test_guilds_serve_runs_the_pools_counts_them_and_removes_them_at_its_stop(tmp_path):
    data = tmp_path / "data"
    argv = [sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--no-token",
            "--config", str(server(tmp_path, spare=2))]
    with subprocess.Popen(argv, env={**os.environ, "GUILDS_DATA": str(data)}, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        try:
            printed = ""
            while (found := re.search(r"the app at (http://[^/ ]+)/", printed)) is None:
                line = proc.stderr.readline()
                assert line, f"guilds serve ended: {printed}"
                printed += line
            deadline = time.monotonic() + FILL_SECONDS
            while 'guilds_pool_agents{state="ready",template="box"} 2.0' not in (
                    text := httpx2.get(f"{found.group(1)}/metrics", timeout=10).text):
                assert time.monotonic() < deadline, text
                time.sleep(0.1)
            assert 'guilds_pool_misses_total{template="box"} 0.0' in text
            pooled = [i for i, s in rows_on_disk(tmp_path).items() if s == "pooled"]
            assert len(pooled) == 2
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    assert {rows_on_disk(tmp_path)[i] for i in pooled} == {"removed"}  # the stop removed them
    assert not any((data / "agent-homes" / i).exists() for i in pooled)
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(data).encode() in _cmdline(p)]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
