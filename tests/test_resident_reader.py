"""guilds-code serve's reader: with nothing running, a waiting worker reads the next request
off stdin itself and runs it, with no hop through the server; whatever is not one whole
request goes back to the server, which reads as before. The built helper under python3 -I -S,
real bash, frames written by hand."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code import limits
from resident_kit import ResidentServer
from test_helper_faults import _wait_for
from test_resident import children_of, sandbox, server, shell  # noqa: F401  (fixtures)


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
