"""WebSockets to a port of an E2B sandbox (``get_host(port)``), through a real `guilds serve --e2b`,
the real Python SDK and a WebSocket server inside the sandbox (standard library only), on bwrap and
docker: the upgrade and its subprotocol, messages both ways whole, pings, closes from either side
with their codes, a port that ends, a refused upgrade passed on as the port answered it, the
message bound at its edge, and a private sandbox's token."""

from __future__ import annotations

import collections
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
)

from e2b_kit import (
    E2BServer,
    e2b_server,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
)
from guilds.fronts.e2b.ingress import TOKEN_HEADER
from guilds.limits import E2B_INGRESS_WS_MESSAGE_BYTES
from test_e2b_ingress import _free_ports

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap", "docker")]
PORT, CLOSED = _free_ports(2)
WS_SERVER = r"""
import base64, hashlib, socket, struct, sys, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def frame(op, data):
    n = len(data)
    size = bytes([n]) if n < 126 else bytes([126]) + struct.pack("!H", n) if n < 65536 else \
        bytes([127]) + struct.pack("!Q", n)
    return bytes([0x80 | op]) + size + data
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    lines = head.split(b"\r\n")
    path = lines[0].split()[1].decode()
    hdrs = {k.strip().lower(): v.strip() for k, v in (l.split(b":", 1) for l in lines[1:] if b":" in l)}
    if path.startswith("/refuse"):
        c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\nX-Why: test\r\n\r\nno way\n")
        c.close()
        return
    accept = base64.b64encode(hashlib.sha1(hdrs[b"sec-websocket-key"] + GUID).digest())
    proto = hdrs.get(b"sec-websocket-protocol", b"").split(b",")[0].strip()
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + accept + (b"\r\nSec-WebSocket-Protocol: " + proto if proto else b"")
              + b"\r\n\r\n")
    seen = [path, hdrs[b"host"].decode(), "token" if b"e2b-traffic-access-token" in hdrs else "-"]
    c.sendall(frame(1, " ".join(seen).encode()))
    while True:
        b1, b2 = exact(c, 2)
        op, n = b1 & 15, b2 & 127
        if n == 126:
            n = struct.unpack("!H", exact(c, 2))[0]
        elif n == 127:
            n = struct.unpack("!Q", exact(c, 8))[0]
        mask = exact(c, 4) if b2 & 128 else b"\0\0\0\0"
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(exact(c, n)))
        if op == 8:
            c.sendall(frame(8, data))
            c.close()
            return
        if data.startswith(b"big "):
            c.sendall(frame(2, b"x" * int(data.split()[1])))
        elif data == b"ping me":
            c.sendall(frame(9, b"hello?"))
        elif data == b"close":
            c.sendall(frame(8, struct.pack("!H", 4000) + b"done"))
        elif data == b"drop":
            c.close()
            return
        else:
            c.sendall(frame(op, data))
s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""
"""A WebSocket server inside the sandbox: it answers /refuse... with 403, else accepts (the first
subprotocol asked), sends what it saw (path, Host, whether the traffic token came in), then echoes;
``big N`` sends N bytes in one message, ``ping me`` a ping, ``close`` a close 4000, ``drop`` ends."""


class Client:
    """A WebSocket client (wsproto over a socket) to the server, with the Host a sandbox's port has."""

    def __init__(self, server: E2BServer, host: str, path: str = "/", subprotocols: tuple[str, ...] = (),
                 headers: tuple[tuple[str, str], ...] = ()):
        url = httpx.URL(server.url)
        self.sock = socket.create_connection((url.host, url.port), timeout=60)
        OPENED.append(self.sock)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.pending: collections.deque[Event] = collections.deque()
        self.sock.sendall(self.ws.send(Request(host=host, target=path, subprotocols=list(subprotocols),
                                               extra_headers=list(headers))))
        self.opening = self.event()

    def event(self) -> Event | None:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self.ws.receive_data(data)
            self.pending.extend(self.ws.events())
        return self.pending.popleft()

    def send(self, data: str | bytes) -> None:
        self.sock.sendall(self.ws.send(Message(data=data)))

    def receive(self) -> Any:
        """The next whole message's data, or the close (or None: the socket ended without one)."""
        parts: list[Any] = []
        while True:
            event = self.event()
            if event is None or isinstance(event, (CloseConnection, Pong)):
                return event
            if isinstance(event, Ping):
                self.sock.sendall(self.ws.send(event.response()))
                continue
            parts.append(event.data)  # type: ignore[attr-defined]
            if event.message_finished:  # type: ignore[attr-defined]
                return type(parts[0])().join(parts)

    def close(self, code: int = 1000) -> Any:
        self.sock.sendall(self.ws.send(CloseConnection(code=code, reason="bye")))
        return self.receive()


OPENED: list[socket.socket] = []
"""The test's clients' sockets, closed after it."""


@pytest.fixture(autouse=True)
def _clients_closed() -> Iterator[None]:
    yield
    while OPENED:
        OPENED.pop().close()


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory) -> Iterator[E2BServer]:
    with e2b_server(tmp_path_factory.mktemp("ingress-ws"), backend) as served:
        yield served


def _serve_ws(box: Any) -> None:
    box.files.write("ws.py", WS_SERVER)
    box.commands.run(f"python3 ws.py {PORT}", background=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = box.commands.run(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}), 1)'"
                                 " 2>/dev/null && echo up || echo down")
        if probe.stdout.strip() == "up":
            return
        time.sleep(0.3)
    raise AssertionError("the WebSocket server did not start in the sandbox")


def test_a_websocket_reaches_the_port_and_messages_go_both_ways(server, sbx):
    _serve_ws(sbx)
    host = sbx.get_host(PORT)
    client = Client(server, host, "/chat?room=1", subprotocols=("chat.v2", "chat.v1"))
    assert isinstance(client.opening, AcceptConnection), client.opening
    assert client.opening.subprotocol == "chat.v2"  # the port's choice, passed on
    assert client.receive() == f"/chat?room=1 {host} -"
    client.send("héllo")
    assert client.receive() == "héllo"
    payload = bytes(range(256)) * 400
    client.send(payload)
    assert client.receive() == payload
    client.send("ping me")  # the port's ping is answered on the way (the client sees no ping)
    client.send("after the ping")
    assert client.receive() == "after the ping"
    closed = client.close(4001)
    assert isinstance(closed, CloseConnection) and closed.code == 4001


def test_the_ports_close_and_end_reach_the_client(server, sbx):
    _serve_ws(sbx)
    client = Client(server, sbx.get_host(PORT))
    client.receive()
    client.send("close")
    closed = client.receive()
    assert isinstance(closed, CloseConnection) and (closed.code, closed.reason) == (4000, "done")
    dropped = Client(server, sbx.get_host(PORT))
    dropped.receive()
    dropped.send("drop")
    ended = dropped.receive()
    assert isinstance(ended, CloseConnection) and ended.code == 1011


def test_a_refused_upgrade_is_the_ports_answer_and_a_closed_port_is_502(server, sbx):
    _serve_ws(sbx)
    refused = Client(server, sbx.get_host(PORT), "/refuse")
    assert isinstance(refused.opening, RejectConnection) and refused.opening.status_code == 403
    assert (b"x-why", b"test") in refused.opening.headers
    body = refused.event()
    assert isinstance(body, RejectData) and body.data == b"no way\n"
    closed = Client(server, sbx.get_host(CLOSED))
    assert isinstance(closed.opening, RejectConnection) and closed.opening.status_code == 502


def test_a_message_at_the_bound_passes_and_one_past_it_closes_both_sides(server, sbx):
    _serve_ws(sbx)
    client = Client(server, sbx.get_host(PORT))
    client.receive()
    client.send(f"big {E2B_INGRESS_WS_MESSAGE_BYTES}")
    assert len(client.receive()) == E2B_INGRESS_WS_MESSAGE_BYTES
    client.send(f"big {E2B_INGRESS_WS_MESSAGE_BYTES + 1}")
    closed = client.receive()
    assert isinstance(closed, CloseConnection) and closed.code == 1009


@pytest.fixture
def private_box(server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    server.export(monkeypatch)
    box = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    yield box
    box.kill()


def test_a_private_sandboxs_websocket_needs_its_token_which_never_goes_in(server, private_box):
    _serve_ws(private_box)
    host = private_box.get_host(PORT)
    bare = Client(server, host)
    assert isinstance(bare.opening, RejectConnection) and bare.opening.status_code == 403
    wrong = Client(server, host, headers=((TOKEN_HEADER, "not-the-token"),))
    assert isinstance(wrong.opening, RejectConnection) and wrong.opening.status_code == 403
    client = Client(server, host, headers=((TOKEN_HEADER, private_box.traffic_access_token),))
    assert isinstance(client.opening, AcceptConnection)
    assert client.receive() == f"/ {host} -"  # the token stops here


def test_a_websocket_to_the_server_itself_or_its_sandbox_api_is_refused(server, sbx):
    own = Client(server, httpx.URL(server.url).netloc.decode())
    assert isinstance(own.opening, RejectConnection) and own.opening.status_code == 403
    api = Client(server, sbx.get_host(49983))
    assert isinstance(api.opening, RejectConnection) and api.opening.status_code == 400
