"""guilds-code serve's ``--orphan-exit``: a server whose orchestrator is gone without its
stdin ending (a pods/exec stream whose client died) ends once neither a frame nor a
keepalive came for that long, awake or asleep; keepalives keep it, wake no sleeping
server and move no idle clock; and the channel of a sandbox that asks for them sends
them. The built helper under python3 -I -S, real bash."""

from __future__ import annotations

import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code.frames import KEEPALIVE
from resident_kit import ResidentServer
from test_resident import sandbox, shell  # noqa: F401  (fixtures)
from test_resident_sleep import asleep


def serve(sandbox, *options: str) -> ResidentServer:  # noqa: F811
    return ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), *options)


def keep_alive(server: ResidentServer, seconds: float, every: float = 0.3, *, sleeping: bool = False) -> None:
    """Keepalives for seconds, each checked to find the server still there (sleeping: asleep,
    each time: a woken server stays awake its --sleep-idle second at least)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert server.proc.poll() is None, "it ended while keepalives came"
        assert not sleeping or asleep(server), "a keepalive woke it"
        server.send(KEEPALIVE)
        time.sleep(every)


def asleep_among_keepalives(server: ResidentServer) -> None:
    """Keepalives until the server sleeps: they are no request, so it falls asleep among them."""
    end = time.monotonic() + 30
    while not asleep(server):
        assert time.monotonic() < end, "it never fell asleep"
        keep_alive(server, 0.3)


def ended_within(server: ResidentServer, seconds: float) -> float:
    """The seconds it took to end (its stdin still open): AssertionError past seconds."""
    began = time.monotonic()
    code = server.proc.wait(seconds)
    assert code == 0, server.proc.stderr.read()
    return time.monotonic() - began


def test_nothing_on_stdin_for_the_orphan_time_ends_it_and_keepalives_keep_it(sandbox):  # noqa: F811
    server = serve(sandbox, "--orphan-exit", "2", "--sleep-idle", "3600")
    try:
        keep_alive(server, 3.5)  # past the orphan time: kept
        assert ok_text(server.call(shell(sandbox, "echo here"))) == "here"
        took = ended_within(server, 10)  # stdin open, nothing more sent
        assert 1.5 < took < 8, took
    finally:
        server.close()


def test_a_call_running_when_it_is_orphaned_is_cancelled_and_answered(sandbox):  # noqa: F811
    server = serve(sandbox, "--orphan-exit", "2", "--sleep-idle", "3600")
    try:
        frame_id = server.request(shell(sandbox, "sleep 60; echo late"))
        (answer,) = server.answers(1, timeout=15)
        assert answer["id"] == frame_id and "late" not in str(answer["envelope"])
        assert ended_within(server, 15) < 8
    finally:
        server.close()


def test_asleep_keepalives_wake_nothing_and_their_end_ends_the_waiter(sandbox):  # noqa: F811
    server = serve(sandbox, "--orphan-exit", "2", "--sleep-idle", "1")
    try:
        assert ok_text(server.call(shell(sandbox, "echo one"))) == "one"
        asleep_among_keepalives(server)
        keep_alive(server, 3, sleeping=True)  # past the orphan time, still the waiter, never woken
        assert ok_text(server.call(shell(sandbox, "echo two"))) == "two"  # a frame wakes it as before
        asleep_among_keepalives(server)  # (without them a loaded machine may see it end first)
        took = ended_within(server, 10)  # the keepalives stopped: the waiter ends
        assert 1.5 < took < 8, took
    finally:
        server.close()


def test_keepalives_move_no_idle_clock(sandbox):  # noqa: F811
    server = serve(sandbox, "--orphan-exit", "30", "--idle-exit", "2", "--sleep-idle", "3600")
    try:
        began = time.monotonic()
        with pytest.raises(AssertionError, match="ended while keepalives came"):
            keep_alive(server, 10)
        assert 1.5 < time.monotonic() - began < 8
    finally:
        server.close()


def test_a_bad_orphan_time_is_refused(sandbox):  # noqa: F811
    import subprocess

    done = subprocess.run([PYTHON, "-I", "-S", str(sandbox.helper), "serve", "--orphan-exit", "0"],
                          capture_output=True, text=True, timeout=30, env=sandbox.process_env(), check=False)
    assert done.returncode != 0 and done.stderr.strip().startswith("guilds-code serve: --orphan-exit"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
