"""Faults of the orchestrator's processes, caused for real: `guilds call` and `guilds serve`
stopped by a signal or killed (SIGKILL) while a command runs, an owner on another
machine that stopped beating, and a full disk under the record (a tmpfs mounted here).

The known point: the call's `sleep` is seen in /proc before the fault is caused.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from sqlalchemy.ext.asyncio import create_async_engine

import mcp_kit as kit
from conftest import sized_tmpfs
from guilds.limits import OWNER_HEARTBEAT_SECONDS as HEARTBEAT_SECONDS
from guilds.limits import OWNER_LEASE_SECONDS as LEASE_SECONDS
from guilds.record.engine import normalize_url
from guilds.record.owners import LOST
from guilds.record.schema import calls, metadata, owners
from guilds.record.store import Store
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.web.app import create_app
from guilds.web.endpoint_lock import TOKEN_FILE, Lock, host_names
from guilds.web.logs import HelperLogReader
from guilds_code.redact import Redactor

STOP_SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP"]


SANDBOXES = [
    "local",
    pytest.param("bwrap", marks=pytest.mark.skipif(bool(unavailable()), reason=f"bwrap: {unavailable()}")),
]


def agent(tmp_path: Path, sandbox: str = "local") -> tuple[Path, dict[str, str]]:
    """A settings file (the sandbox, home under tmp_path) and the environment of a CLI process."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nhome = "{tmp_path / "home"}"\nsandbox = "{sandbox}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUILDS_")}
    return config, {**env, "GUILDS_DATA": str(tmp_path / "data")}


def start_call(tmp_path: Path, command: str, run: str, sandbox: str = "local") -> subprocess.Popen:
    config, env = agent(tmp_path, sandbox)
    return subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "call", "shell", f'{{"command": "{command}"}}',
                             "--config", str(config), "--run", run], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def record(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'data' / 'guilds.db'}")


def reap(proc: subprocess.Popen) -> None:
    """Kill it if it still runs, wait for it, close its pipes."""
    proc.kill()
    if proc.stdout is not None and not proc.stdout.closed:
        proc.communicate()
    proc.wait()


async def running_sleep(proc: subprocess.Popen, arg: str) -> None:
    """Wait for the call's sleep to show in /proc: the known point."""
    assert await kit.wait_for(lambda: kit.processes("sleep", arg) or proc.poll() is not None, 60)
    assert proc.poll() is None and kit.processes("sleep", arg)


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("name", STOP_SIGNALS)
async def test_a_stop_signal_to_guilds_call_stops_the_command_and_records_it_cancelled(tmp_path, name, sandbox):
    command, arg = kit.sleep_command()
    proc = start_call(tmp_path, command, "stopped", sandbox)
    try:
        await running_sleep(proc, arg)
        proc.send_signal(getattr(signal, name))
        out, err = proc.communicate(timeout=30)
    finally:
        reap(proc)
    signum = getattr(signal, name)
    assert proc.returncode == 128 + signum
    assert err == f"guilds: stopped by {name}; the call's command was stopped and the call recorded as cancelled\n"
    assert out == "" and not await kit.left_running(arg)
    async with record(tmp_path) as store:
        (call,) = await store.calls("stopped")
    assert (call.status, call.is_error, call.text.splitlines()[0]) == (
        "cancelled", True, "the call was cancelled before it finished")


@pytest.mark.parametrize("sandbox", ["local", pytest.param("bwrap", marks=[
    pytest.mark.skipif(bool(unavailable()), reason=f"bwrap: {unavailable()}")])])
async def test_a_killed_guilds_call_leaves_no_command_and_its_call_is_lost(tmp_path, sandbox):
    command, arg = kit.sleep_command()
    proc = start_call(tmp_path, command, "killed", sandbox)
    try:
        await running_sleep(proc, arg)
        proc.kill()
        proc.wait(10)
    finally:
        reap(proc)
    left = await kit.left_running(arg)
    for pid in left:  # this test's own sleep, by its pid
        os.kill(pid, signal.SIGKILL)
    assert not left  # the helper got its parent-death signal and stopped the command
    async with record(tmp_path) as store:  # opening the record finds the owner gone
        (call,) = await store.calls("killed")
        flow, page = await app_pages(store, "killed", call.seq)
    assert (call.status, call.is_error, call.text) == ("lost", True, LOST)
    assert call.row == f"Run {command} · lost" and call.finished_at is not None
    assert f'<li id="call-{call.seq}" class="item row lost"' in flow and f"Run {command} · lost" in flow
    assert "Running: the result is not in yet" not in page and "ended before the call finished" in page


async def test_a_server_with_the_record_open_finds_a_killed_calls_owner_gone(tmp_path):
    """What the app of a running `guilds serve` shows: its own Store's lease sweeps, no restart needed."""
    (tmp_path / "data").mkdir()
    async with record(tmp_path) as store:
        command, arg = kit.sleep_command()
        proc = start_call(tmp_path, command, "killed")
        try:
            await running_sleep(proc, arg)
            assert (await store.calls("killed"))[0].status == "running"
            proc.kill()
            proc.wait(10)
        finally:
            proc.kill()
            proc.communicate()
        lost = lambda calls: calls and calls[0].status == "lost"  # noqa: E731
        deadline = asyncio.get_running_loop().time() + 3 * HEARTBEAT_SECONDS
        while not lost(await store.calls("killed")) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert lost(await store.calls("killed"))


async def no_logs(agent_id: str, path: str) -> dict:
    return {"ok": False, "error": "no logs here"}


async def app_pages(store: Store, run_id: str, seq: int) -> tuple[str, str]:
    """The run's flow and the call's page as the app serves them."""
    token = "t" * 40
    app = create_app(store, redactor=Redactor([]), logs=HelperLogReader(no_logs),
                     lock=Lock(token, host_names("127.0.0.1")))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1",
                                  headers={"authorization": f"Bearer {token}"}) as c:
        return (await c.get(f"/runs/{run_id}")).text, (await c.get(f"/runs/{run_id}/calls/{seq}")).text


async def fresh_postgres(url: str) -> None:
    engine = create_async_engine(normalize_url(url))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    await engine.dispose()


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not os.environ.get("GUILDS_TEST_POSTGRES_URL"), reason="GUILDS_TEST_POSTGRES_URL is not set"))])
async def test_a_call_of_an_owner_elsewhere_is_lost_once_its_lease_has_passed(tmp_path, db):
    """A process on another machine (a power loss there): only its heartbeat tells; past the lease it is gone."""
    (tmp_path / "data").mkdir()
    if db == "postgresql":
        url = os.environ["GUILDS_TEST_POSTGRES_URL"]
        await fresh_postgres(url)
    else:
        url = f"sqlite:///{tmp_path / 'data' / 'guilds.db'}"
    async with Store(url) as store:
        for run, age in (("stale", LEASE_SECONDS + 5), ("fresh", LEASE_SECONDS - 20)):
            slot = await store.begin_call(run_id=run, agent_id="a", tool="shell", args={"command": "make"},
                                          call_id=run, started_at=datetime.now(UTC), budget=10)
            async with store.engine.begin() as conn:
                beat = datetime.now(UTC) - timedelta(seconds=age)
                await conn.execute(sa.insert(owners).values(id=f"far-{run}", machine="another/boot/pid:[1]", pid=1,
                                                            pid_start=1, heartbeat_at=beat))
                await conn.execute(sa.update(calls).where(calls.c.run_id == run, calls.c.seq == slot.seq)
                                   .values(owner=f"far-{run}"))
    async with Store(url) as store:
        stale, fresh = (await store.calls("stale"))[0], (await store.calls("fresh"))[0]
        assert (stale.status, stale.row) == ("lost", "Run make · lost")
        assert fresh.status == "running"
        assert await store.sweep_lost() == []


# --- `guilds serve` --------------------------------------------------------------------
def start_serve(tmp_path: Path) -> tuple[subprocess.Popen, str, str]:
    """A real `guilds serve` on a free loopback port: (process, /mcp's URL, token)."""
    config, env = agent(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0",
                             "--config", str(config)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if found := re.search(r"(http://127\.0\.0\.1:\d+)/\?token=", line):
            return proc, found.group(1) + "/mcp", (tmp_path / "data" / TOKEN_FILE).read_text().strip()
    raise AssertionError(f"guilds serve ended: {proc.wait()}")


async def call_in_background(url: str, token: str, command: str, run: str) -> asyncio.Task:
    async def call() -> None:
        async with (
            create_mcp_http_client(headers={"authorization": f"Bearer {token}"}) as http,
            Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as c,
        ):
            await c.call_tool("shell", {"command": command}, meta={"guilds/run": run})

    return asyncio.create_task(call())


@pytest.mark.parametrize("name", STOP_SIGNALS)
async def test_a_stop_signal_to_guilds_serve_stops_the_running_calls(tmp_path, name):
    proc, url, token = start_serve(tmp_path)
    command, arg = kit.sleep_command()
    task = await call_in_background(url, token, command, "served")
    try:
        await running_sleep(proc, arg)
        proc.send_signal(getattr(signal, name))
        proc.wait(30)
    finally:
        proc.kill()
        proc.stderr.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not await kit.left_running(arg)
    async with record(tmp_path) as store:
        (call,) = await store.calls("served")
    assert call.status == "cancelled" and call.is_error


def descendants(pid: int) -> list[int]:
    """The live processes below pid (children, theirs, ...)."""
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if stat[0] not in (b"Z", b"X"):
            parents[int(name)] = int(stat[1])
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


@pytest.mark.parametrize("name", STOP_SIGNALS)
async def test_a_stop_signal_to_guilds_serve_closes_what_it_opened_then_exits_0(tmp_path, name):
    """After uvicorn's shutdown (which raises the signal again as it returns), serve still stops
    its reaper, ends its resident helpers and closes the record, removing its owner entry."""
    proc, url, token = start_serve(tmp_path)
    try:
        await (await call_in_background(url, token, "echo warm", "closing"))  # its resident helper opens
        assert await kit.wait_for(lambda: descendants(proc.pid), 30), "the server holds no helper process"
        helpers = descendants(proc.pid)
        with sqlite3.connect(tmp_path / "data" / "guilds.db") as db:
            assert db.execute("SELECT pid FROM owners").fetchall() == [(proc.pid,)]
        proc.send_signal(getattr(signal, name))
        returncode = proc.wait(60)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.stderr.close()
    assert returncode == 0, err
    assert err.splitlines()[-1] == (f"guilds serve: stopped by {name}: the running calls recorded as cancelled, "
                                    "the warm pools' agents removed, the run record closed")
    assert not [pid for pid in helpers if alive(pid)]  # ended by the server, not left to their parent-death signal
    with sqlite3.connect(tmp_path / "data" / "guilds.db") as db:
        assert db.execute("SELECT pid FROM owners").fetchall() == []  # its entry removed as the record closed


async def test_a_killed_guilds_serve_leaves_no_command_and_its_call_is_lost(tmp_path):
    proc, url, token = start_serve(tmp_path)
    command, arg = kit.sleep_command()
    task = await call_in_background(url, token, command, "served")
    try:
        await running_sleep(proc, arg)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
        proc.stderr.close()
        await asyncio.gather(task, return_exceptions=True)
    assert not await kit.left_running(arg)
    proc, url, token = start_serve(tmp_path)  # the restarted server finds the call lost
    try:
        async with record(tmp_path) as store:
            (call,) = await store.calls("served")
        assert call.status == "lost"
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


# --- a full disk -------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs mounted at tmp_path/data (root only), unmounted after."""
    data = tmp_path / "data"
    data.mkdir()
    with sized_tmpfs(data, "4m"):
        yield data


def fill(folder: Path) -> None:
    """Write a file until the disk is full."""
    with open(folder / "filler", "wb", buffering=0) as fh:  # unbuffered: nothing left to flush at close
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass


async def test_a_full_disk_under_the_record_gives_one_line(tmp_path, small_disk):
    first = start_call(tmp_path, "echo before", "disk")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0 and out.startswith("before"), err
    fill(small_disk)
    for _ in range(3):
        proc = start_call(tmp_path, "echo after", "disk")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "Traceback" not in err, err
        assert re.fullmatch(rf"guilds: the run record at {small_disk}/guilds.db could not be "
                            r"(made|written \(.+\)): (database or disk is full|disk I/O error)\n", err), err
    os.unlink(small_disk / "filler")
    proc = start_call(tmp_path, "echo again", "disk")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.startswith("again"), err


async def test_a_command_that_fills_the_records_disk_still_returns_its_output(tmp_path, small_disk):
    """The disk fills during the call (the agent's own command): the output is printed, then one line."""
    proc = start_call(tmp_path, f"head -c 8M /dev/zero > {small_disk}/filler 2>/dev/null; echo produced", "filling")
    out, err = proc.communicate(timeout=120)
    assert out.startswith("produced\n") and "remaining_tool_calls: 199" in out
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert re.fullmatch(rf"guilds: the run record at {small_disk}/guilds.db could not be written "
                        r"\(the result of call 1 of run filling\): (database or disk is full|disk I/O error)\n",
                        err), err


async def test_a_full_disk_for_a_fresh_data_folder_gives_one_line(tmp_path, small_disk):
    fill(small_disk)
    proc = start_call(tmp_path, "echo hi", "fresh")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "No space left on device" in err or "database or disk is full" in err
