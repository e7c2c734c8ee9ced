"""``guilds-code serve --direct 1`` (``guilds_code.direct``), the built helper under python3 -I -S:
its channel offered over TCP, taken by the connection that names the token sent on stdin, and
by nothing else; the offer's end (a request on stdin, its time, refusals); the socket's end as
stdin's. The kubernetes side: tests/test_kube_direct.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code import limits
from resident_kit import ResidentServer

TOKEN = "5e" * 32


@pytest.fixture
def offering(helper_path, tmp_path):
    """A server started with --direct 1 (its hello read); closed at the end."""
    started: list[ResidentServer] = []

    def _start(*extra: str) -> ResidentServer:
        started.append(ResidentServer(PYTHON, str(helper_path), {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                                      "--direct", "1", *extra))
        return started[-1]

    yield _start
    for server in started:
        server.close()


def token_frame(token: str = TOKEN) -> bytes:
    return json.dumps({"v": 1, "direct": token}).encode() + b"\n"


OPEN: list[socket.socket] = []
"""The test's connections, closed after it (``closing``)."""


@pytest.fixture(autouse=True)
def closing(offering):
    """After the test, before its servers are closed: a server whose channel is a connection
    ends at that connection's end."""
    yield
    while OPEN:
        OPEN.pop().close()


def connect(port: int, token: str = TOKEN) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    OPEN.append(sock)
    sock.sendall(token.encode() + b"\n")
    return sock


def line_of(sock: socket.socket) -> bytes:
    """The first line the socket sends (b"" when it is closed first)."""
    got = b""
    while b"\n" not in got:
        part = sock.recv(4096)
        if not part:
            return got
        got += part
    return got


def refused(port: int) -> bool:
    """Nothing listens on port (a full backlog, whose connections time out, still listens)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    except TimeoutError:
        pass
    return False


def request_line(frame_id: str, command: str, home: str) -> bytes:
    return json.dumps({"v": 1, "id": frame_id, "request": {
        "op": "shell", "args": {"command": command}, "run_id": "r1", "agent_id": "a", "call_id": frame_id,
        "home": home, "cwd": home}}).encode() + b"\n"


def answer_text(sock: socket.socket, frame_id: str) -> str:
    from guilds_code.protocol import decode_envelope

    answer = json.loads(line_of(sock))
    assert answer["id"] == frame_id, answer
    return ok_text(decode_envelope(answer["envelope"].encode()))


def test_the_token_named_makes_the_connection_the_channel(offering, tmp_path):
    server = offering()
    port = server.hello["direct"]
    assert isinstance(port, int) and 0 < port < 65536
    server.send(token_frame())
    sock = connect(port)
    hello = json.loads(line_of(sock))
    assert hello["hello"] == "guilds-code" and hello["pid"] == server.proc.pid and "direct" not in hello
    sock.sendall(request_line("a1", "echo over tcp", str(tmp_path)))
    assert answer_text(sock, "a1") == "over tcp"
    assert refused(port)  # the listener closed once taken
    sock.shutdown(socket.SHUT_WR)  # the socket's end is stdin's: the server exits
    assert server.proc.wait(10) == 0


def test_a_worker_writes_its_answer_on_the_connection_itself(offering, tmp_path):
    """No /proc path opens a socket: the worker writes on its own descriptor of the connection,
    so a stopped server (which would have to relay every answer) leaves calls answered."""
    server = offering()
    server.send(token_frame())
    sock = connect(server.hello["direct"])
    assert b'"hello"' in line_of(sock)
    sock.sendall(request_line("a1", "echo first", str(tmp_path)))
    assert answer_text(sock, "a1") == "first"
    time.sleep(0.3)  # the server names its waiting worker the reader
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        sock.sendall(request_line("a2", "echo with the server stopped", str(tmp_path)))
        assert answer_text(sock, "a2") == "with the server stopped"
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    sock.sendall(request_line("a3", "echo again", str(tmp_path)))
    assert answer_text(sock, "a3") == "again"


def test_the_connection_taken_sends_each_frame_at_once():
    """TCP_NODELAY on the channel's socket: a frame written while another is unacknowledged
    (two calls' answers, a cancel) is not held for the acknowledgement."""
    from guilds_code.direct import Offer

    offer = Offer()
    try:
        offer.token = TOKEN.encode()
        client = connect(offer.port)
        fd = offer.take()
        assert fd is not None
        taken = socket.socket(fileno=fd)
        try:
            assert taken.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert taken.gettimeout() is None  # blocking, as stdin and stdout are
        finally:
            taken.close()
        client.close()
    finally:
        offer.close()


def test_the_orchestrators_connection_sends_each_frame_at_once(offering):
    """kube_direct's side of the same: the connection it makes to the offered port (here the
    built helper's, on loopback) has TCP_NODELAY, and is the channel (its hello read)."""
    from guilds.sandbox.kubernetes import kube_direct

    server = offering()
    server.send(token_frame())
    sock, hello = kube_direct._connect("127.0.0.1", server.hello["direct"], TOKEN, time.monotonic() + 10)
    OPEN.append(sock)
    assert json.loads(hello)["hello"] == "guilds-code"
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_connection_before_the_token_waits_for_it(offering):
    server = offering()
    port = server.hello["direct"]
    sock = connect(port)  # faster than the token frame, as TCP is beside an exec's stream
    time.sleep(0.3)
    server.send(token_frame())
    assert b'"hello"' in line_of(sock)


@pytest.mark.parametrize("token", ["0" * 64, TOKEN[:-1], "", TOKEN.upper()])
def test_another_token_is_closed_without_a_word(offering, token):
    server = offering()
    server.send(token_frame())
    sock = connect(server.hello["direct"], token)
    assert line_of(sock) == b""
    sock = connect(server.hello["direct"])  # still offered to the orchestrator
    assert b'"hello"' in line_of(sock)


def test_refusals_end_the_offer_and_stdin_stays_the_channel(offering, sandbox_request):
    server = offering()
    server.send(token_frame())
    port = server.hello["direct"]
    for _ in range(limits.DIRECT_REFUSALS_MAX):
        assert line_of(connect(port, "0" * 64)) == b""
    deadline = time.monotonic() + 5
    while not refused(port):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ok_text(server.call(sandbox_request("echo still on stdin"))) == "still on stdin"


def test_a_request_on_stdin_ends_the_offer(offering, sandbox_request):
    server = offering()
    assert ok_text(server.call(sandbox_request("echo on stdin"))) == "on stdin"
    assert refused(server.hello["direct"])
    server.send(token_frame())  # too late: a frame of no use, answered as one
    (answer,) = server.answers(1, timeout=10)
    assert answer["id"] is None and not answer["envelope"]["ok"]


def test_bad_token_frames_are_frames_gone_wrong(offering):
    server = offering()
    server.send(json.dumps({"v": 1, "direct": "not hex at all, and long enough to pass the bound"}).encode()
                + b"\n")
    (answer,) = server.answers(1, timeout=10)
    assert not answer["envelope"]["ok"]
    assert refused(server.hello["direct"])  # a frame that is no token ends the offer too


@pytest.mark.slow
def test_the_offer_ends_after_its_time(offering):
    server = offering()
    assert server.hello["direct"]
    deadline = time.monotonic() + limits.DIRECT_OFFER_SECONDS + 5
    while not refused(server.hello["direct"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_without_the_option_nothing_is_offered(helper_path, tmp_path):
    server = ResidentServer(PYTHON, str(helper_path), {"PATH": "/usr/bin:/bin"})
    try:
        assert "direct" not in server.hello
    finally:
        server.close()


@pytest.fixture
def sandbox_request(tmp_path):
    def _request(command: str) -> dict:
        return {"op": "shell", "args": {"command": command}, "run_id": "r1", "agent_id": "a", "call_id": "c1",
                "home": str(tmp_path), "cwd": str(tmp_path)}
    return _request
