"""A foreground shell call's processes that left its group end with the call; its
group's `cmd &` jobs and background commands run on; a fork that meets the
process limit is said with the limit. The built helper and real bash, then a
real sandbox (bwrap, docker, kubernetes) with a low pids limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import backend_kit
import kube_kit
from conftest import ok_text
from guilds.config.settings import AgentSettings, BwrapSettings, DockerSettings
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds_code import escaped, limits, proc
from toolbox_kit import sandbox_toolbox

NO_BWRAP = unavailable()
PIDS_LIMIT = 64
SETSID_LOOP = "for i in $(seq 96); do setsid sleep {s} >/dev/null 2>&1 </dev/null & done; sleep 60"
"""96 sleepers that each left the call's group, then a wait the timeout cuts."""


def sh(sandbox, command, **args):
    return sandbox.call("shell", dict(command=command, **args))


def running(seconds: str) -> list[int]:
    """Live pids whose command line is `sleep <seconds>` (a zombie's is empty)."""
    want = f"sleep\0{seconds}\0".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                found.append(int(entry))
    return found


@pytest.fixture
def sleepers():
    """The sleep lengths a test used: whatever of them is left is killed after it."""
    used: list[str] = []
    yield used
    for seconds in used:
        for pid in running(seconds):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_timed_out_fork_loop_of_setsid_sleepers_leaves_none(sandbox, sleepers):
    sleepers.append("301.5")
    env = sh(sandbox, SETSID_LOOP.format(s="301.5"), timeout_seconds=2)
    assert env["meta"]["timed_out"] and ok_text(env).endswith("exit_code: 124")
    assert running("301.5") == []


def test_a_normal_end_ends_what_left_the_group_not_its_jobs(sandbox, sleepers):
    sleepers.extend(["302.5", "303.5"])
    env = sh(sandbox, "setsid sleep 302.5 >/dev/null 2>&1 </dev/null & sleep 303.5 >/dev/null 2>&1 & echo ok")
    assert ok_text(env) == "ok"
    assert running("302.5") == [] and len(running("303.5")) == 1


def test_a_job_that_leaves_the_group_as_the_call_ends_is_ended_too(sandbox, sleepers):
    """The job calls setsid a moment after bash has exited: the end looks once more."""
    sleepers.extend(["302.7", "303.7"])
    env = sh(sandbox, "(sleep 0.01; exec setsid sleep 302.7) >/dev/null 2>&1 </dev/null & "
                      "sleep 303.7 >/dev/null 2>&1 & echo ok")
    assert ok_text(env) == "ok"
    assert running("302.7") == [] and len(running("303.7")) == 1


def test_what_a_background_command_started_outlives_foreground_calls(sandbox, sleepers):
    sleepers.append("304.5")
    start = sh(sandbox, "setsid sleep 304.5 >/dev/null 2>&1 </dev/null & sleep 30", background=True)
    deadline = time.monotonic() + 10
    while not running("304.5") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ok_text(sh(sandbox, "echo next")) == "next"
    assert len(running("304.5")) == 1
    sandbox.call("shell_status", {"id": start["meta"]["background_id"], "stop": True})


def test_a_process_that_ignores_sigterm_is_killed(sandbox, sleepers):
    sleepers.append("305.5")
    command = "setsid bash -c 'trap \"\" TERM; sleep 305.5' >/dev/null 2>&1 </dev/null & sleep 0.3; echo ok"
    began = time.monotonic()
    assert ok_text(sh(sandbox, command)) == "ok"
    assert running("305.5") == []
    assert time.monotonic() - began < 5


def test_the_key_is_a_foreground_calls_own(sandbox):
    said = ok_text(sh(sandbox, f"echo ${escaped.CALL_KEY_ENV}; echo ${escaped.CALL_KEY_ENV}"))
    first = said.split("\n")
    assert len(first[0]) == 16 and first[0] == first[1]
    assert ok_text(sh(sandbox, f"echo ${escaped.CALL_KEY_ENV}")) != first[0]
    sandbox.env[escaped.CALL_KEY_ENV] = "inherited"  # the helper's own is never passed on
    start = sh(sandbox, f"echo bg=${escaped.CALL_KEY_ENV}.", background=True)
    log = start["meta"]["log_path"]
    deadline = time.monotonic() + 10
    while "bg=" not in (Path(log).read_text() if Path(log).exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(log).read_text() == "bg=.\n"


# --- what the end-of-call look reads ---------------------------------------------------
def started_call(script: str) -> escaped.Call:
    """A real bash of a fresh key running script in its own session, as the shell op starts it."""
    key = escaped.new_key()
    since = escaped.boot_ticks()
    child = proc.spawn(["bash", "-c", script], {**os.environ, escaped.CALL_KEY_ENV: key},
                       stdout=None, session=True)
    return escaped.start(key, child.pid, since)


def test_the_time_taken_before_a_spawn_bounds_the_start_time_proc_gives_the_process():
    """boot_ticks() before a spawn is at most the child's /proc start time, and close to it:
    the look's lower bound holds without reading /proc at the spawn."""
    for _ in range(50):
        call = started_call("exit 0")
        started = proc.proc_stat(call.leader)
        os.waitpid(call.leader, 0)
        assert started is not None
        assert call.since <= started.start_time <= escaped.boot_ticks()
        assert started.start_time - call.since <= os.sysconf("SC_CLK_TCK")  # within a second


def test_the_look_ends_an_escaped_process_of_a_call_whose_bash_was_reaped(sleepers):
    """The shell op reaps bash before the look: the start time read at the spawn still bounds it."""
    sleepers.append("306.5")
    call = started_call("setsid sleep 306.5 >/dev/null 2>&1 </dev/null &")
    os.waitpid(call.leader, 0)
    assert call.since > 0
    deadline = time.monotonic() + 10
    while not running("306.5") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert escaped.end(call) == 1
    assert running("306.5") == []


def test_a_short_calls_look_reads_only_the_pids_handed_out_since_its_bash():
    call = started_call("true")
    os.waitpid(call.leader, 0)
    later = proc.spawn(["sleep", "5"], os.environ, stdout=None)
    try:
        fresh = escaped.Call(call.key, call.leader, call.since, time.monotonic())
        read = escaped._pids_since(fresh)
        assert later.pid in read
        assert os.getpid() not in read and 1 not in read  # older than the call: never read
        assert all(pid > call.leader for pid in read) or min(read) <= _last_pid() < call.leader
    finally:
        os.kill(later.pid, signal.SIGKILL)
        later.wait()


def test_a_look_across_a_wrap_of_the_pids_reads_from_the_bottom_too():
    """bash's pid above the namespace's last one: the counter went past pid_max since."""
    above = escaped.Call("k", _last_pid() + 10, 0, time.monotonic())
    read = escaped._pids_since(above)
    assert os.getpid() in read and 1 in read


def test_a_long_calls_look_reads_every_pid():
    """Past pid_max / ESCAPED_PIDS_PER_SECOND_MAX seconds the pids may have gone all the way round."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    call = started_call("true")
    os.waitpid(call.leader, 0)
    long_ago = time.monotonic() - top / limits.ESCAPED_PIDS_PER_SECOND_MAX - 1
    read = escaped._pids_since(escaped.Call(call.key, call.leader, call.since, long_ago))
    assert os.getpid() in read and 1 in read


def _last_pid() -> int:
    return int(Path("/proc/sys/kernel/ns_last_pid").read_text())


# --- real sandboxes with a low pids limit ---------------------------------------------
root_bwrap = [pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the agent's uid is its own under root only")]
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")


def low_limit_settings(tmp_path: Path, backend: str) -> AgentSettings:
    """PIDS_LIMIT processes on bwrap and docker; kubernetes: the node's podPidsLimit."""
    settings = AgentSettings(id=f"esc{os.getpid() % 10000}", home=tmp_path / "home", sandbox=backend,
                             bwrap=BwrapSettings(pids_limit=PIDS_LIMIT),
                             docker=DockerSettings(image=IMAGE, pids_limit=PIDS_LIMIT))
    return kube_kit.kube_settings(settings) if backend == "kubernetes" else settings


def low_limit_toolbox(tmp_path: Path, backend: str = "bwrap"):
    """A Toolbox over a real sandbox of backend, its pids limit low (low_limit_settings)."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return sandbox_toolbox(low_limit_settings(tmp_path, backend), data)


@pytest.mark.backends(*backend_kit.ISOLATING)
async def test_a_fork_loop_at_the_pids_limit_leaves_the_next_call_working(tmp_path, sleepers, backend):
    if backend == "bwrap" and os.geteuid() != 0:
        pytest.skip("the agent's uid is its own under root only")
    sleepers.append("306.5")
    async with low_limit_toolbox(tmp_path, backend) as toolbox:
        loop = await toolbox.call("r1", "shell", {"command": SETSID_LOOP.format(s="306.5"), "timeout_seconds": 5})
        assert not loop.is_error and "timed out after 5s" in loop.text, loop.text
        after = await toolbox.call("r1", "shell", {"command": "echo works; ps -eo args | grep -c '^sleep 306.5'"})
        assert not after.is_error and after.text.split("\n")[:2] == ["works", "0"], after.text
        assert running("306.5") == []


def _bwrap(test):
    for mark in root_bwrap:
        test = mark(test)
    return test


@_bwrap
async def test_bwrap_a_fork_refused_names_the_process_limit(tmp_path, sleepers):
    sleepers.append("307.5")
    fill = ("python3 -c 'import os,time\nwhile True:\n try:\n  pid=os.fork()\n except OSError as e:\n"
            "  print(\"full:\", e, flush=True)\n  break\n"
            " if pid==0:\n  os.execvp(\"sleep\", [\"sleep\", \"307.5\"])\ntime.sleep(300)'")
    async with low_limit_toolbox(tmp_path) as toolbox:
        started = await toolbox.call("r1", "shell", {"command": fill, "background": True})
        assert not started.is_error, started.text
        log = Path(started.meta["log_path"])
        deadline = time.monotonic() + 30
        while "full:" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        refused = await toolbox.call("r1", "shell", {"command": "echo never"})
        assert refused.is_error, refused.text
        assert refused.text.startswith("cannot start ") and (
            f": the sandbox's process limit (RLIMIT_NPROC {PIDS_LIMIT}" in refused.text), refused.text
        assert "stop background commands (shell_status stop) or wait for some to end" in refused.text


def test_the_pid_counters_are_read_through_descriptors_held_open_and_stay_current():
    from guilds_code import escaped

    before = escaped._read_int(escaped._LAST_PID)
    held = dict(escaped._counters)
    subprocess.run(["true"], check=True)
    after = escaped._read_int(escaped._LAST_PID)
    assert before is not None and after is not None and after != before  # a pid was handed out between
    assert escaped._counters == held and set(held) >= {escaped._LAST_PID}  # the same descriptor, read again
    assert os.readlink(f"/proc/self/fd/{held[escaped._LAST_PID]}") == escaped._LAST_PID
    assert escaped._read_int(escaped._PID_MAX) == int(Path(escaped._PID_MAX).read_text())
