"""A bwrap sandbox's helper forked by the starter (``bwrap_starter``, ``guilds_code.starter``):
confined exactly as one entered through nsenter and setpriv, holding nothing of the host or of
another agent, and the nsenter path taken when the starter cannot serve. Real bwrap as root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import pytest

from guilds.config.settings import AgentSettings
from guilds.errors import SandboxError
from guilds.record.store import Store
from guilds.sandbox.bwrap import bwrap_starter
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox
from guilds.toolbox import Toolbox, transport

NO_BWRAP = unavailable()
pytestmark = [pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None or os.geteuid() != 0,
                                                    reason=f"needs root and bwrap ({NO_BWRAP})")]

CONFINEMENT = (
    "id -u; id -g; id -G; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status;"
    " grep -E '^Max (processes|address space)' /proc/self/limits; cat /proc/self/cgroup;"
    " for n in ipc mnt net pid uts; do echo ns $(readlink /proc/self/ns/$n); done; readlink /proc/self/root; pwd;"
    " s=$(awk '/^PPid/{print $2}' /proc/$PPID/status); grep -E '^(Uid|Gid|Cap|NoNewPrivs)' /proc/$s/status;"
    " echo server-fds $(ls /proc/$s/fd | sort -n | tr '\\n' ' ')"
)
"""What bash and the resident server it runs under are: ids, capabilities, limits, cgroups,
namespaces (those of the sandbox's init), root, cwd, the server's open descriptors."""


def settings(tmp_path: Path, agent_id: str, **extra) -> AgentSettings:
    return AgentSettings(id=agent_id, home=tmp_path / agent_id, sandbox="bwrap", network=False,
                         **{"transport": "resident", **extra})


@contextlib.asynccontextmanager
async def agent(tmp_path: Path, agent_id: str, **extra) -> AsyncIterator[tuple[BwrapSandbox, Toolbox]]:
    """An agent's bwrap sandbox and resident toolbox (its own record); closed and stopped after."""
    async with Store(f"sqlite:///{tmp_path}/{agent_id}.db") as store:
        box = BwrapSandbox(settings(tmp_path, agent_id, **extra), tmp_path / "data")
        toolbox = Toolbox(box.settings, box, store)
        try:
            yield box, toolbox
        finally:
            await toolbox.close()
            await box.stop()


def starter_of(box: BwrapSandbox) -> bwrap_starter.Starter:
    return bwrap_starter.starter_for(box.python, dict(box._helpers)["guilds-code"])


def server_pid(sandbox: BwrapSandbox, toolbox: Toolbox) -> int:
    """The host pid of the agent's resident helper (its channel's process)."""
    return toolbox.transport._channel._process.pid  # type: ignore[attr-defined]


async def shell(toolbox: Toolbox, command: str) -> str:
    result = await toolbox.call(f"r-{toolbox.settings.id}", "shell", {"command": command})
    assert not result.is_error, result.text
    return result.text


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def forked(shown: list[bytes]) -> bool:
    """The channel's process is the helper itself (forked by the starter), not nsenter on the host."""
    return shown[0].endswith(b"python3") and shown[3:5] == [b"/usr/local/bin/guilds-code", b"serve"]


def no_starter(monkeypatch) -> None:
    monkeypatch.setattr(BwrapSandbox, "_starter", lambda self, argv: None)


async def test_a_started_helper_is_confined_as_an_entered_one(tmp_path, monkeypatch):
    seen = {}
    for way in ("starter", "nsenter"):
        if way == "nsenter":
            no_starter(monkeypatch)
        async with agent(tmp_path, f"conf-{way}") as (box, toolbox):
            text = await shell(toolbox, CONFINEMENT)
            init = box._ensure_init()[0]
            for name in ("ipc", "mnt", "net", "pid", "uts"):  # the init's own, read on the host
                text = text.replace(f"ns {os.readlink(f'/proc/{init}/ns/{name}')}\n", "ns init's\n")
            for own, shown in ((str(box.uid), "UID"), (str(box.gid), "GID"), (box._cgroup_name, "CG"),
                               (f"conf-{way}", "X")):
                text = text.replace(own, shown)
            seen[way] = text
            shown = cmdline(server_pid(box, toolbox))
            assert forked(shown) == (way == "starter"), shown
            if way == "starter":  # the helper itself: what the sandbox's ps shows holds no host path
                assert str(tmp_path).encode() not in b" ".join(shown) and b"starter" not in shown
    for way, text in seen.items():
        assert "CapEff:\t0000000000000000" in text and "CapBnd:\t0000000000000000" in text, way
        assert text.count("NoNewPrivs:\t1") == 2 and text.count("ns init's") == 5, way
    assert seen["starter"].splitlines() == seen["nsenter"].splitlines()


async def test_no_agent_request_is_in_the_memory_the_next_helper_is_forked_from(tmp_path):
    """The starter never reads a request: an agent that reads its own helper's memory (same
    uid, dumpable) finds nothing of another agent's environment, nor does the starter hold it."""
    secret = "s3cr3t-" + os.urandom(8).hex()
    async with agent(tmp_path, "mem-a", secrets={"A_TOKEN": secret}) as (a, ta), \
            agent(tmp_path, "mem-b") as (b, tb):
        await shell(ta, "true")
        await shell(tb, "true")
        starter = starter_of(a)
        assert starter._proc is not None
        assert secret.encode() in memory(server_pid(a, ta))  # the check can find it where it is
        assert secret.encode() not in memory(server_pid(b, tb))
        assert secret.encode() not in memory(starter._proc.pid)


def memory(pid: int) -> bytes:
    """Every readable private mapping of pid (as root)."""
    data = bytearray()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data += mem.read(end - start)
            except OSError:
                continue
    return bytes(data)


async def test_the_starter_is_each_helpers_parent_so_it_is_reaped_when_it_exits(tmp_path):
    """A zombie helper left to the host's init holds the sandbox's pid namespace (and its stop)
    until that init reaps it: the starter adopts its helpers and reaps them itself."""
    async with agent(tmp_path, "reap-1") as (box, toolbox):
        await shell(toolbox, "true")
        starter = starter_of(box)
        helper = server_pid(box, toolbox)
        assert parent_of(helper) == starter._proc.pid
        await toolbox.close()  # stdin ends: the helper exits, and is reaped at once
        assert not Path(f"/proc/{helper}").exists() or parent_of(helper) != starter._proc.pid


def parent_of(pid: int) -> int:
    return int(re.search(r"^PPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


async def test_a_killed_starter_is_started_again(tmp_path):
    async with agent(tmp_path, "kill-1") as (box, toolbox):
        await shell(toolbox, "true")
        starter = starter_of(box)
        first = starter._proc.pid
        os.kill(first, signal.SIGKILL)
        await toolbox.close()
        assert "still" in await shell(toolbox, "echo still")  # a new helper: through a new starter
        assert starter._proc.pid != first and starter.broken is None
        assert forked(cmdline(server_pid(box, toolbox)))


async def test_a_starter_that_cannot_run_leaves_helpers_to_nsenter(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(bwrap_starter, "_starters", {})
    monkeypatch.setattr(bwrap_starter.Starter, "__init__", _bad_starter_init)
    async with agent(tmp_path, "bad-1") as (box, toolbox):
        with caplog.at_level(logging.WARNING):
            assert "works" in await shell(toolbox, "echo works")
        assert not forked(cmdline(server_pid(box, toolbox)))
        assert "through nsenter from now on: the starter failed" in caplog.text
        assert starter_of(box).broken


_real_init = bwrap_starter.Starter.__init__


def _bad_starter_init(self, python: str, helper_file: str) -> None:
    _real_init(self, python, "/nonexistent/guilds-code")


async def test_a_sandbox_whose_init_is_gone_is_said_in_one_line(tmp_path):
    box = BwrapSandbox(settings(tmp_path, "gone-1"), tmp_path / "data")
    await box.start()
    try:
        pid, start = box._ensure_init()
        starter = starter_of(box)
        request = box._start_request(pid, start + 1, [box.python, "-I", "-S", "x", "serve"])
        with pytest.raises(SandboxError, match=rf"^the sandbox's init {pid} is gone$"):
            starter.start(request)
        assert starter.broken is None
        status = Path(f"/proc/{pid}/status").read_text()
        assert re.search(r"^State:\s+S", status, re.M)  # the sandbox itself untouched
    finally:
        await box.stop()


async def _calls_by_exec(box: BwrapSandbox, toolbox: Toolbox, monkeypatch) -> list[list[str]]:
    """The first call of an agent on ``auto``, and the one-shot helpers it ran through nsenter."""
    execs: list[list[str]] = []
    real_exec = box.exec

    async def counted(argv, **kw):
        execs.append(list(argv))
        return await real_exec(argv, **kw)

    monkeypatch.setattr(box, "exec", counted)
    assert "first" in await shell(toolbox, "echo first")
    return execs


async def test_auto_waits_for_a_forked_helper_instead_of_a_one_shot_helper(tmp_path, monkeypatch):
    async with agent(tmp_path, "auto-1", transport="auto") as (box, toolbox):
        assert box.forks_helpers
        assert await _calls_by_exec(box, toolbox, monkeypatch) == []  # the first call went on the channel
        assert forked(cmdline(server_pid(box, toolbox)))


async def test_auto_sends_the_first_call_by_exec_where_helpers_are_entered(tmp_path, monkeypatch):
    monkeypatch.setattr(bwrap_starter, "_starters", {})
    monkeypatch.setattr(bwrap_starter.Starter, "__init__", _bad_starter_init)
    async with agent(tmp_path, "auto-2") as (box, toolbox):
        await shell(toolbox, "true")  # the starter fails once: helpers go through nsenter from now on
    async with agent(tmp_path, "auto-3", transport="auto") as (box, toolbox):
        assert not box.forks_helpers
        execs = await _calls_by_exec(box, toolbox, monkeypatch)
        assert len(execs) == 1 and execs[0][3] == "/usr/local/bin/guilds-code"  # a one-shot helper


async def test_auto_goes_by_exec_when_the_forked_helper_is_not_open_in_time(tmp_path, monkeypatch):
    monkeypatch.setattr(transport, "AUTO_OPEN_WAIT_SECONDS", 0.0)
    async with agent(tmp_path, "auto-4", transport="auto") as (box, toolbox):
        assert box.forks_helpers
        assert len(await _calls_by_exec(box, toolbox, monkeypatch)) == 1  # not waited for: a one-shot helper
        assert await toolbox.transport.opened() is not None  # the opening went on


def init_ends_once_found(box: BwrapSandbox, monkeypatch, by: str = "") -> list[int]:
    """The sandbox's init killed right after the next call found it (by: only as the method
    of that name finds it), once, as its idle stop would end it at that moment; the list gets
    the pid killed."""
    found, killed = box._ensure_init, []

    def find_then_end() -> tuple[int, int]:
        pid, start = found()
        if not killed and by in ("", sys._getframe(1).f_code.co_name):
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}/ns/ipc").exists():
                time.sleep(0.01)
        return pid, start

    monkeypatch.setattr(box, "_ensure_init", find_then_end)
    return killed


@pytest.mark.parametrize("way", ["exec", "starter"])
async def test_a_call_coming_in_as_the_init_ends_runs_in_a_new_sandbox(tmp_path, monkeypatch, caplog, way):
    """exec's nsenter and the starter's fork find no init: the call goes to a new sandbox, once."""
    async with agent(tmp_path, "a", transport="exec" if way == "exec" else "resident") as (box, toolbox):
        if way == "exec":
            assert (await shell(toolbox, "echo ran")).startswith("ran\n")
        killed = init_ends_once_found(box, monkeypatch, by="" if way == "exec" else "_open_process")
        assert (await shell(toolbox, "echo ran again")).startswith("ran again\n")
        assert "out of reach" not in caplog.text  # not found by a start: by the call itself
        record = json.loads((tmp_path / "data" / "sandboxes" / "a.json").read_text())
        assert killed and record["pid"] != killed[0] and Path(f"/proc/{record['pid']}").exists()
        if way == "starter":
            assert forked(cmdline(server_pid(box, toolbox)))


CHANNEL_REACH = (
    "s=$(awk '/^PPid/{print $2}' /proc/$PPID/status);"
    " for f in 0 1; do head -c0 /proc/$s/fd/$f 2>/dev/null && echo read-$f-open || echo read-$f-denied;"
    " (: 2>/dev/null > /proc/$s/fd/$f) && echo write-$f-open || echo write-$f-denied; done"
)
"""What a command can open of its resident server's stdin (0) and stdout (1) through /proc."""


async def test_a_worker_writes_its_answer_itself_and_a_command_can_read_neither_pipe(tmp_path):
    async with agent(tmp_path, "chan") as (box, toolbox):
        reach = (await shell(toolbox, CHANNEL_REACH)).split()[:4]
        assert reach == ["read-0-denied", "write-0-denied", "read-1-denied", "write-1-open"], reach
        await asyncio.sleep(0.3)  # the server names its waiting worker the reader
        server = server_pid(box, toolbox)
        os.kill(server, signal.SIGSTOP)  # a server that relayed the answer would give none now
        try:
            assert (await asyncio.wait_for(shell(toolbox, "echo answered"), 10)).splitlines()[0] == "answered"
        finally:
            os.kill(server, signal.SIGCONT)
        assert (await shell(toolbox, "echo again")).splitlines()[0] == "again"
