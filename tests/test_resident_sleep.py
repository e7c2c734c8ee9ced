"""guilds-code serve asleep (``guilds_code/asleep.py``): idle, it execs a bash waiter
in its own process; the next request's first byte execs the server again, which
answers it as if it had never slept. The built helper under python3 -I -S, real bash."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code.proc import live_groups, proc_stat
from resident_kit import ResidentServer
from test_egress_sleep import argv_of, private_kib, wait_until
from test_resident import sandbox, shell  # noqa: F401  (fixtures)
from test_resident_workers import _group_of_a_running_command

SLEEP = ("--sleep-idle", "1")


def asleep(server: ResidentServer) -> bool:
    """Its process runs the bash waiter (same pid), not the server."""
    try:
        return "guilds-code-asleep" in argv_of(server.proc.pid)
    except OSError:
        return False


@pytest.fixture
def sleepy(sandbox):  # noqa: F811
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), *SLEEP)
    yield server
    server.close()


def test_an_idle_server_sleeps_in_its_own_process_and_the_next_call_wakes_it(sandbox, sleepy):  # noqa: F811
    assert ok_text(sleepy.call(shell(sandbox, "echo one"))) == "one"
    awake_kib = private_kib(sleepy.proc.pid)
    wait_until(lambda: asleep(sleepy))
    assert proc_stat(sleepy.proc.pid).state in "SR" and not os.listdir(f"/proc/{sleepy.proc.pid}/task")[1:]
    asleep_kib = private_kib(sleepy.proc.pid)
    # about 330 against 1300 KiB: 3x leaves room for a busy machine's pages (3.9x seen)
    assert asleep_kib * 3 < awake_kib and asleep_kib < 1024, (asleep_kib, awake_kib)
    two, worker = ok_text(sleepy.call(shell(sandbox, "echo two; echo $PPID"))).split("\n")
    assert two == "two" and proc_stat(int(worker)).ppid == sleepy.proc.pid
    argv = argv_of(sleepy.proc.pid)
    assert argv[1:6] == ["-I", "-S", str(sandbox.helper), "serve", SLEEP[0]]
    assert argv[-2:] == ["--woken", str(ord("{"))]  # the first byte of the request frame
    wait_until(lambda: asleep(sleepy))  # and again
    assert ok_text(sleepy.call(shell(sandbox, "echo three"))) == "three"
    assert argv_of(sleepy.proc.pid).count("--woken") == 1
    sleepy.proc.stdin.close()
    assert sleepy.proc.wait(10) == 0 and sleepy.proc.stderr.read() == b""


def test_frames_that_come_together_while_it_sleeps_are_each_answered(sandbox, sleepy):  # noqa: F811
    sleepy.call(shell(sandbox, "true"))
    wait_until(lambda: asleep(sleepy))
    frames = [b"not json\n"] + [json.dumps({"v": 1, "id": f"m{n}", "request": shell(sandbox, f"echo {n}")}).encode()
                                + b"\n" for n in range(5)]
    sleepy.send(b"".join(frames))
    answers = {a["id"]: a["envelope"] for a in sleepy.answers(6, timeout=30)}
    assert answers[None]["error"].startswith("frame: ")  # the waiter's byte is the bad frame's first
    assert {fid: ok_text(env) for fid, env in answers.items() if fid} == {f"m{n}": str(n) for n in range(5)}


def test_a_cancel_for_no_request_wakes_it_and_is_ignored(sandbox, sleepy):  # noqa: F811
    sleepy.call(shell(sandbox, "true"))
    wait_until(lambda: asleep(sleepy))
    sleepy.cancel("gone1")
    wait_until(lambda: not asleep(sleepy))
    assert ok_text(sleepy.call(shell(sandbox, "echo after"))) == "after"


def test_a_long_call_keeps_it_awake(sandbox, sleepy):  # noqa: F811
    frame_id = sleepy.request(shell(sandbox, "sleep 3; echo done"))
    time.sleep(2.5)
    assert not asleep(sleepy)
    (answer,) = sleepy.answers(1, timeout=30)
    assert (answer["id"], ok_text(answer["envelope"])) == (frame_id, "done")
    wait_until(lambda: asleep(sleepy))


def test_a_running_background_command_keeps_it_awake_until_it_ends(sandbox, sleepy):  # noqa: F811
    started = ok_text(sleepy.call(shell(sandbox, "sleep 4", background=True)))
    pid = int(started.split("(pid ")[1].split(")")[0])
    try:
        time.sleep(3)
        assert not asleep(sleepy) and pid in live_groups()
        wait_until(lambda: asleep(sleepy))
        assert pid not in live_groups()
        assert ok_text(sleepy.call(sandbox.request("shell_status", {"id": "b1"}))).startswith("b1 exited 0")
    finally:
        if pid in live_groups():
            os.killpg(pid, signal.SIGKILL)


def test_a_woken_server_has_its_watchdog_again(sandbox, sleepy):  # noqa: F811
    sleepy.call(shell(sandbox, "true"))
    wait_until(lambda: asleep(sleepy))
    pgid, _ = _group_of_a_running_command(sandbox, sleepy)
    try:
        os.kill(proc_stat(pgid).ppid, signal.SIGKILL)  # its worker
        wait_until(lambda: pgid not in live_groups(), seconds=10)
    finally:
        if pgid in live_groups():
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.parametrize("end", ["stdin's end", "SIGTERM", "SIGHUP", "SIGINT"])
def test_asleep_it_ends_as_the_server_does(sandbox, sleepy, end):  # noqa: F811
    sleepy.call(shell(sandbox, "true"))
    wait_until(lambda: asleep(sleepy))
    if end == "stdin's end":
        sleepy.proc.stdin.close()
    else:
        sleepy.proc.send_signal(getattr(signal, end))
    assert sleepy.proc.wait(10) == 0
    assert sleepy.proc.stdout.read() == b"" and sleepy.proc.stderr.read() == b""


def test_asleep_its_idle_exit_still_comes_when_due(sandbox):  # noqa: F811
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), *SLEEP, "--idle-exit", "4")
    try:
        server.call(shell(sandbox, "true"))
        last_frame = time.monotonic()
        wait_until(lambda: asleep(server))
        assert server.proc.wait(10) == 0
        assert 3.5 < time.monotonic() - last_frame < 8
    finally:
        server.close()


@pytest.mark.parametrize("moment", ["falling asleep", "waking"])
def test_a_stop_signal_in_the_middle_of_an_exec_still_ends_it_with_0(sandbox, sleepy, moment):  # noqa: F811
    sleepy.call(shell(sandbox, "true"))
    if moment == "waking":
        wait_until(lambda: asleep(sleepy))
        sleepy.request(shell(sandbox, "true"))
        wait_until(lambda: not asleep(sleepy), every=0.0005)
    else:
        wait_until(lambda: asleep(sleepy), every=0.0005)
    sleepy.proc.send_signal(signal.SIGTERM)
    assert sleepy.proc.wait(10) == 0
    assert sleepy.proc.stderr.read() == b""


def test_without_bash_it_stays_awake(sandbox):  # noqa: F811
    server = ResidentServer(PYTHON, str(sandbox.helper), {**sandbox.process_env(), "PATH": "/nonexistent"}, *SLEEP)
    try:
        assert server.call(sandbox.request("shell_status", {}))["ok"] is True
        time.sleep(2.5)
        assert not asleep(server)
        assert server.call(sandbox.request("shell_status", {}))["ok"] is True
    finally:
        server.close()
