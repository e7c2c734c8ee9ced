"""The one supervise loop (guilds_code/supervise.py) under both helpers' rules, on real bash.

shell's and code_task's own behaviour through it is tested end to end in
tests/test_shell.py and tests/test_harness_e2e.py; here each clock at its edge.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from guilds_code import limits, proc
from guilds_code.supervise import SHELL, Rules, Supervisor

QUICK = Rules(kill_grace=0.5, drain=0.2)
"""Short clocks, so that each edge is seen in well under a second."""


def _run(script: str, timeout: float, rules: Rules = QUICK, finished=None, apart: bool = False):
    out, err = bytearray(), bytearray()
    sinks = (out.extend, err.extend) if apart else (out.extend,)
    began = time.monotonic()
    with Supervisor() as supervisor:
        child = proc.spawn(["bash", "-c", script], os.environ, stderr=proc.PIPE if apart else proc.STDOUT,
                           session=True)
        ended = supervisor.run(child, timeout, sinks, rules, finished)
    return ended, bytes(out), bytes(err), time.monotonic() - began, child.pid


def _gone(pid: int) -> bool:
    info = proc.proc_stat(pid)
    return info is None or info.state in "ZX"


def test_stdout_and_stderr_go_to_their_sinks_and_the_exit_code_comes_back():
    ended, out, err, _, _ = _run("echo out; echo err >&2; exit 3", 10, apart=True)
    assert (out, err) == (b"out\n", b"err\n")
    assert (ended.returncode, ended.stopped, ended.cancelled) == (3, None, None)


def test_at_the_timeout_sigterm_then_sigkill_after_the_grace():
    ended, out, _, took, _ = _run("trap '' TERM; echo started; sleep 30", 0.3)
    assert out == b"started\n"
    assert ended.stopped == "timeout" and ended.returncode == -signal.SIGKILL
    assert 0.3 + QUICK.kill_grace <= took < 0.3 + QUICK.kill_grace + 1


def test_a_command_that_obeys_sigterm_ends_at_once():
    ended, _, _, took, _ = _run("sleep 30", 0.3)
    assert ended.stopped == "timeout" and ended.returncode == -signal.SIGTERM
    assert took < 0.3 + QUICK.kill_grace


def test_after_its_final_event_a_command_has_the_final_grace_then_is_stopped():
    rules = Rules(kill_grace=0.5, drain=0.2, final_grace=0.3)
    seen = bytearray()

    def finished() -> bool:
        return b"final" in seen

    began = time.monotonic()
    with Supervisor() as supervisor:
        child = proc.spawn(["bash", "-c", "echo final; sleep 30"], os.environ, session=True)
        ended = supervisor.run(child, 60, (seen.extend,), rules, finished)
    took = time.monotonic() - began
    assert ended.stopped == "linger" and ended.returncode == -signal.SIGTERM
    assert rules.final_grace <= took < rules.final_grace + 1


def test_a_grandchild_holding_the_pipe_pins_nothing_and_shell_leaves_it_running():
    ended, out, _, took, pid = _run("sleep 30 & echo $!; exit 0", 10, SHELL)
    grandchild = int(out.split()[0])
    try:
        assert ended.returncode == 0 and ended.stopped is None
        assert took < limits.SHELL_DRAIN_SECONDS + 1
        assert not _gone(grandchild)
    finally:
        proc.signal_group(pid, signal.SIGKILL)


def test_with_stop_leftovers_what_is_left_after_the_drain_is_stopped():
    rules = Rules(kill_grace=0.5, drain=0.2, stop_leftovers=True)
    ended, out, _, took, _ = _run("(trap '' TERM; exec sleep 30) & echo $!; exit 0", 10, rules)
    grandchild = int(out.split()[0])
    assert ended.returncode == 0 and ended.stopped is None
    assert rules.drain + rules.kill_grace <= took < rules.drain + rules.kill_grace + 1
    deadline = time.monotonic() + 2
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(grandchild)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_cancel_stops_the_command_within_the_cancel_grace(sig):
    timer = threading.Timer(0.3, os.kill, (os.getpid(), sig))
    began = time.monotonic()  # the signal comes 0.3 s after this, however late the command starts
    timer.start()
    try:
        ended, _, _, _, _ = _run("trap '' TERM; sleep 30", 60, Rules(kill_grace=30, drain=0.2))
    finally:
        timer.join()
    took = time.monotonic() - began
    assert ended.cancelled == sig and ended.stopped is None
    assert ended.returncode == -signal.SIGKILL
    assert 0.3 + limits.CANCEL_KILL_GRACE_SECONDS <= took < 0.3 + limits.CANCEL_KILL_GRACE_SECONDS + 1


def test_a_cancel_shortens_a_stop_under_way():
    timer = threading.Timer(0.6, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        ended, _, _, took, _ = _run("trap '' TERM; sleep 30", 0.3, Rules(kill_grace=30, drain=0.2))
    finally:
        timer.join()
    assert ended.stopped == "timeout" and ended.cancelled == signal.SIGTERM
    assert took < 0.6 + limits.CANCEL_KILL_GRACE_SECONDS + 1


def test_the_handlers_are_restored_after_the_supervisor():
    before = signal.getsignal(signal.SIGTERM)
    _run("true", 10)
    assert signal.getsignal(signal.SIGTERM) is before
