"""guilds-code serve's reader: with nothing running, a waiting worker reads the next request
off stdin itself and runs it, with no hop through the server; whatever is not one whole
request goes back to the server, which reads as before. The built helper under python3 -I -S,
real bash, frames written by hand."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code import limits
from resident_kit import ResidentServer
from test_helper_faults import _wait_for
from test_resident import children_of, eventually_gone, sandbox, server, shell  # noqa: F401  (fixtures)


def with_reader(sandbox, server) -> int:
    """A call answered, and a moment for the server to name its waiting worker the reader: its pid."""
    worker = int(ok_text(server.call(shell(sandbox, "echo $PPID"))))
    time.sleep(0.2)
    return worker


def frame(frame_id: str, request: dict) -> bytes:
    return json.dumps({"v": 1, "id": frame_id, "request": request}).encode() + b"\n"


@contextlib.contextmanager
def stopped(pid: int):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_request_is_read_and_run_by_the_waiting_worker_while_the_server_sleeps(sandbox, server):
    first = with_reader(sandbox, server)
    with stopped(server.proc.pid):  # a server that read stdin itself would answer nothing now
        assert int(ok_text(server.call(shell(sandbox, "echo $PPID"), timeout=10))) == first
    assert ok_text(server.call(shell(sandbox, "echo again"))) == "again"  # the server reads its reply, reads on


def test_a_frame_in_two_writes_is_given_back_and_answered(sandbox, server):
    server.call(shell(sandbox, "true"))
    data = frame("split", shell(sandbox, "echo whole"))
    server.send(data[:20])
    time.sleep(0.3)  # the reader reads the first part alone
    server.send(data[20:])
    (answer,) = server.answers(1, timeout=10)
    assert (answer["id"], ok_text(answer["envelope"])) == ("split", "whole")


def test_two_frames_in_one_write_are_both_answered(sandbox, server):
    with_reader(sandbox, server)
    server.send(frame("a", shell(sandbox, "echo one")) + frame("b", shell(sandbox, "echo two")))
    answers = {a["id"]: ok_text(a["envelope"]) for a in server.answers(2, timeout=10)}
    assert answers == {"a": "one", "b": "two"}


@pytest.mark.parametrize("given, error", [
    (b'{"v": 1, "id": "x", "cancel": true}\n', None),  # no such request: nothing to say
    (b"\n", None),  # a keepalive
    (b'{"v": 2, "id": "bad", "request": {}}\n', "frame: protocol version 2, this helper speaks 1"),
    (b"not json\n", "frame: not valid JSON"),
])
def test_what_is_no_request_goes_back_to_the_server_which_answers_as_before(sandbox, server, given, error):
    with_reader(sandbox, server)
    server.send(given)
    if error is not None:
        (answer,) = server.answers(1, timeout=10)
        assert answer["envelope"]["error"].startswith(error), answer
    assert ok_text(server.call(shell(sandbox, "echo next"), timeout=10)) == "next"


def test_stdin_ending_while_the_worker_reads_ends_the_server(sandbox, server):
    with_reader(sandbox, server)
    server.proc.stdin.close()
    assert server.proc.wait(10) == 0


def test_a_stopped_reader_is_killed_and_the_request_answered_within_the_check(sandbox, server):
    reader = with_reader(sandbox, server)
    os.kill(reader, signal.SIGSTOP)  # the agent's own commands run as the same user
    try:
        began = time.monotonic()
        answered = int(ok_text(server.call(shell(sandbox, "echo $PPID"), timeout=10)))
        assert answered != reader
        assert time.monotonic() - began < 2 * limits.SERVE_READER_CHECK_SECONDS + limits.SERVE_READER_UNDO_SECONDS + 2
        assert _wait_for(lambda: reader not in {pid for pid, _ in children_of(server.proc.pid)})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(reader, signal.SIGKILL)


def test_an_idle_server_takes_stdin_back_before_its_workers_exit(sandbox):
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--workers-idle", "1")
    try:
        reader = int(ok_text(server.call(shell(sandbox, "echo $PPID"))))
        assert _wait_for(lambda: not children_of(server.proc.pid), timeout=5)
        with stopped(server.proc.pid):  # with no worker, nothing reads stdin but the server now
            server.request(shell(sandbox, "echo late"))
            time.sleep(0.3)
            assert not server.ready()
        (answer,) = server.answers(1, timeout=10)
        assert ok_text(answer["envelope"]) == "late"
        assert reader not in {pid for pid, _ in children_of(server.proc.pid)}
    finally:
        server.close()


def test_a_cancel_reaches_a_request_the_reader_took(sandbox, server):
    with_reader(sandbox, server)
    frame_id = server.request(shell(sandbox, "sleep 30"))
    time.sleep(0.3)
    server.cancel(frame_id)
    (answer,) = server.answers(1, timeout=10)
    assert answer["envelope"]["error"].startswith("cancelled")


@contextlib.contextmanager
def telling_after(sandbox, ms: int):
    """A server whose readers tell of a request they took only ms after taking it (or at its end)."""
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--reader-tell-ms", str(ms))
    try:
        yield server
    finally:
        server.close()


def test_a_short_request_the_reader_took_wakes_the_server_once_with_its_answer(sandbox):
    with telling_after(sandbox, 600_000) as server:
        with_reader(sandbox, server)
        first = server.request(shell(sandbox, "sleep 1.5; echo first"))
        time.sleep(0.3)  # the reader runs it and has not told the server: nothing reads stdin
        second = server.request(shell(sandbox, "echo second"))
        time.sleep(0.5)
        assert not server.ready()
        answers = {a["id"]: ok_text(a["envelope"]) for a in server.answers(2, timeout=10)}
        assert answers == {first: "first", second: "second"}


def test_a_long_request_the_reader_took_is_told_at_the_clock_and_others_run_beside_it(sandbox):
    with telling_after(sandbox, 200) as server:
        with_reader(sandbox, server)
        slow = server.request(shell(sandbox, "sleep 30"))
        time.sleep(0.5)
        began = time.monotonic()
        assert ok_text(server.call(shell(sandbox, "echo beside"), timeout=10)) == "beside"
        assert time.monotonic() - began < 2
        server.cancel(slow)
        (answer,) = server.answers(1, timeout=10)
        assert (answer["id"], answer["envelope"]["error"][:9]) == (slow, "cancelled")


def test_a_reader_killed_before_it_told_has_its_request_answered(sandbox):
    with telling_after(sandbox, 600_000) as server:
        reader = with_reader(sandbox, server)
        began = time.monotonic()
        answer = server.call(shell(sandbox, "kill -9 $PPID; sleep 5"), timeout=10)  # its own worker
        assert answer["error"] == "internal error: the request's worker ended without an answer"
        assert time.monotonic() - began < 3
        assert eventually_gone(reader)
        assert ok_text(server.call(shell(sandbox, "echo next"), timeout=10)) == "next"


@pytest.mark.parametrize("value", ["0", "x", str(1000 * 7 * 24 * 3600 + 1)])
def test_a_bad_tell_time_is_refused_in_one_line(sandbox, value):
    done = subprocess.run([PYTHON, "-I", "-S", str(sandbox.helper), "serve", "--reader-tell-ms", value],
                          env=sandbox.process_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                          check=False)
    said = (done.stdout + done.stderr).decode()
    assert done.returncode != 0
    assert said.startswith("guilds-code serve: --reader-tell-ms: must be ") and said.count("\n") == 1, said
