"""Requests to a port of an E2B sandbox from outside (``sandbox.get_host(port)``), through a real
`guilds serve --e2b` and the real Python SDK, on local, bwrap, docker and kubernetes (the test cluster).

A server started in the sandbox by ``commands.run(..., background=True)`` answers at
``get_host(port)`` (the Host form) and through the ``E2b-Sandbox-Port`` header form;
bodies stream both ways; a closed port is E2B's 502; a private sandbox needs its own
traffic token; ``mask_request_host`` is the Host the server sees; and no Host reaches
a port of this machine, another sandbox's port, or anything but a name the server answers to.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from e2b_kit import (
    BACKENDS,
    E2BServer,
    e2b_server,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
    pids_alive,
)
from guilds.fronts.e2b.ingress import PORT_NOT_OPEN, TOKEN_HEADER
from guilds.fronts.e2b.ingress_reach import RELAY
from guilds.limits import E2B_INGRESS_MAX_PER_SANDBOX

pytestmark = [pytest.mark.slow, pytest.mark.backends(*BACKENDS, "kubernetes")]
SERVER = r"""
import hashlib, http.server, json, sys, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def _send(self, body, kind="application/json"):
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path in ("/stream", "/forever"):
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            if self.path == "/forever":
                while True:
                    self.wfile.write(b"more\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            for word in (b"first\n", b"second\n"):
                self.wfile.write(word)
                self.wfile.flush()
                time.sleep(2)
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._send(json.dumps({"path": self.path, "headers": headers, "names": list(self.headers)}).encode())
    def do_POST(self):
        if self.headers.get("transfer-encoding") == "chunked":
            data = b""
            while (size := int(self.rfile.readline().strip(), 16)):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers["content-length"]))
        self._send(json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}).encode())
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
"""A server inside the sandbox: GET echoes the path and headers (names in lower case, and as
written), /stream sends two lines two seconds apart, /forever a line every 0.2 s for ever,
POST answers its body's digest."""


def _free_ports(count: int) -> list[int]:
    """Ports no process of this machine listens on now: on local (and bwrap with the host's
    network) a sandbox's ports are this machine's, shared with whatever else runs here."""
    held = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    ports = [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()
    return ports


PORT, CLOSED, SECOND, ENDLESS, BIND_ALL, DAEMON = _free_ports(6)
"""The test server's port, one nothing listens on, and the other servers' ports."""


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory) -> Iterator[E2BServer]:
    """The E2B server, on a port of its own: one the kernel gave it on one of the ports above
    (freed when this module was read) is stopped and another started, since the sandbox's
    server could not listen there (on local and bwrap it shares this machine's ports)."""
    for _ in range(3):
        with e2b_server(tmp_path_factory.mktemp("ingress"), backend) as served:
            if httpx.URL(served.url).port not in (PORT, CLOSED, SECOND, ENDLESS, BIND_ALL, DAEMON):
                yield served
                return
    raise AssertionError("three servers in a row were given a port of this module's")


def _serve(box: Any, port: int = PORT) -> Any:
    """The test server started in box on port, once it answers inside."""
    box.files.write("srv.py", SERVER)
    handle = box.commands.run(f"python3 srv.py {port}", background=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = box.commands.run(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)'"
                                 " 2>/dev/null && echo up || echo down")
        if probe.stdout.strip() == "up":
            return handle
        time.sleep(0.3)
    raise AssertionError("the test server did not start in the sandbox")


def _get(server: E2BServer, host: str, path: str = "/", **headers: str) -> httpx.Response:
    """GET path of the server with that Host, as a client whose name resolves to it sends it."""
    return httpx.get(server.url + path, headers={"Host": host, **headers}, timeout=30)


def test_get_host_names_the_port_at_the_servers_domain_and_reaches_it(server, sbx):
    _serve(sbx)
    port = httpx.URL(server.url).port
    host = sbx.get_host(PORT)
    assert host == f"{PORT}-{sbx.sandbox_id}.localhost:{port}"
    assert sbx.traffic_access_token is None  # public, E2B's default
    answer = _get(server, host, "/a/b?c=d", **{"X-Mine": "kept"})
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["path"] == "/a/b?c=d"
    assert seen["headers"]["host"] == host  # the client's Host, as E2B passes it
    assert seen["headers"]["x-mine"] == "kept"
    assert {"Host", "X-Mine", "User-Agent", "Connection"} <= set(seen["names"])  # Go's canonical names, as E2B's


def test_the_header_form_reaches_the_port(server, sbx):
    _serve(sbx)
    host = httpx.URL(server.url).netloc.decode()
    answer = _get(server, host, "/h", **{"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(PORT)})
    assert answer.status_code == 200, answer.text
    assert answer.json()["path"] == "/h"
    missing = _get(server, host, "/h", **{"E2b-Sandbox-Port": str(PORT)})
    assert missing.status_code == 400
    envd = sbx.get_host(49983)  # the process service's port: the in-sandbox API, its access token checked
    assert _get(server, envd, "/health", **{"X-Access-Token": sbx._envd_access_token}).status_code == 204
    assert _get(server, envd, "/health").status_code == 401


def test_bodies_stream_both_ways(server, sbx):
    _serve(sbx)
    host = sbx.get_host(PORT)
    with httpx.stream("GET", server.url + "/stream", headers={"Host": host}, timeout=30) as answer:
        started = time.monotonic()
        lines = answer.iter_lines()
        assert next(lines) == "first"
        first_at = time.monotonic() - started
        assert next(lines) == "second"
    assert first_at < 1.5, f"the first line came after {first_at:.1f} s: the answer was held back"
    data = secrets.token_bytes(3 * 1024 * 1024)
    sent = httpx.post(server.url + "/up", content=data, headers={"Host": host}, timeout=60)
    assert sent.json() == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    chunked = httpx.post(server.url + "/up", content=iter([data[:1000], data[1000:5000]]),
                         headers={"Host": host}, timeout=60)
    assert chunked.json() == {"sha256": hashlib.sha256(data[:5000]).hexdigest(), "bytes": 5000}


def test_a_client_gone_ends_the_relay_of_an_endless_answer(server, sbx):
    port = ENDLESS
    _serve(sbx, port)
    marker = f"{RELAY[-16:]}\0{port}\0"  # the relay's code, then its port, on its command line
    with httpx.stream("GET", server.url + "/forever", headers={"Host": sbx.get_host(port)}, timeout=30) as answer:
        assert next(answer.iter_lines()) == "more"
        assert pids_alive(marker)
    deadline = time.monotonic() + 20
    while pids_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_alive(marker) == []


@pytest.mark.backends("bwrap")
def test_past_the_cap_of_requests_at_once_a_sandbox_answers_429(server, sbx):
    _serve(sbx)
    host = sbx.get_host(PORT)
    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=None)) as client, \
            contextlib.ExitStack() as streams:
        for _ in range(E2B_INGRESS_MAX_PER_SANDBOX):
            held = streams.enter_context(client.stream("GET", server.url + "/forever", headers={"Host": host}))
            assert held.status_code == 200
        refused = _get(server, host)
        assert refused.status_code == 429
        assert refused.json()["connectionLimit"] == E2B_INGRESS_MAX_PER_SANDBOX
    deadline = time.monotonic() + 20  # the streams closed: their places free again
    while _get(server, host).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _get(server, host).status_code == 200


def test_a_closed_port_is_e2bs_502(server, sbx):
    answer = _get(server, sbx.get_host(CLOSED))
    assert answer.status_code == 502
    assert answer.json() == {"sandboxId": sbx.sandbox_id, "message": PORT_NOT_OPEN, "port": str(CLOSED)}


def test_a_private_sandbox_needs_its_own_traffic_token(server, sbx, monkeypatch):
    server.export(monkeypatch)
    private = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    other = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        token = private.traffic_access_token
        assert token and other.traffic_access_token and token != other.traffic_access_token
        assert Sandbox.connect(private.sandbox_id).traffic_access_token == token
        _serve(private)
        host = private.get_host(PORT)
        assert _get(server, sbx.get_host(PORT)).status_code == 502  # private's port is not sbx's (local: the same)
        missing = _get(server, host)
        assert missing.status_code == 403
        assert missing.json()["message"].endswith(f"'{TOKEN_HEADER}' is missing")
        for wrong in (other.traffic_access_token, private._envd_access_token, token + "x", ""):
            refused = _get(server, host, **{TOKEN_HEADER: wrong})
            assert refused.status_code == 403, wrong
        assert _get(server, host, **{TOKEN_HEADER: token}).status_code == 200
        # this sandbox's token opens no other sandbox's port, private or public
        assert _get(server, other.get_host(PORT), **{TOKEN_HEADER: token}).status_code == 403
        _serve(sbx, SECOND)  # on local, PORT is the host's, taken by private's server
        seen = _get(server, sbx.get_host(SECOND), **{TOKEN_HEADER: token}).json()
        assert TOKEN_HEADER not in seen["headers"]  # never passed in
    finally:
        private.kill()
        other.kill()


def test_a_paused_sandboxs_ports_answer_409_and_a_killed_ones_502(server, sbx):
    _serve(sbx)
    host = sbx.get_host(PORT)
    assert _get(server, host).status_code == 200
    sbx.beta_pause()
    paused = _get(server, host)
    assert paused.status_code == 409
    assert paused.json() == {"sandboxId": sbx.sandbox_id, "message": "The sandbox is paused", "code": 409,
                             "canAutoResume": False}
    sbx.kill()
    assert _get(server, host).status_code == 502


def test_mask_request_host_is_the_host_the_server_sees(server, monkeypatch):
    server.export(monkeypatch)
    box = Sandbox.create(timeout=120, network={"mask_request_host": "custom-host.example.com:${PORT}"})
    try:
        _serve(box)
        seen = _get(server, box.get_host(PORT)).json()
        assert seen["headers"]["host"] == f"custom-host.example.com:{PORT}"
    finally:
        box.kill()


@pytest.fixture
def host_service() -> Iterator[tuple[int, bytes]]:
    """An HTTP server of this machine's on its loopback: (its port, the secret it answers)."""
    secret = secrets.token_hex(16).encode()

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", str(len(secret)))
            self.end_headers()
            self.wfile.write(secret)

        def log_message(self, *args: Any) -> None:
            pass

    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    yield served.server_address[1], secret
    served.shutdown()
    served.server_close()


def test_no_host_reaches_a_port_of_this_machine_or_of_another_sandbox(server, sbx, host_service):
    port, secret = host_service
    answer = _get(server, sbx.get_host(port))
    assert answer.status_code == 502 and secret not in answer.content
    assert answer.json()["message"] == PORT_NOT_OPEN
    # the server's own port, named as a sandbox's: not the server's app either
    own = _get(server, sbx.get_host(httpx.URL(server.url).port))
    assert own.status_code == 502
    unknown = _get(server, sbx.get_host(PORT).replace(sbx.sandbox_id, "i" + "0" * 20))
    assert unknown.status_code == 502 and unknown.json()["message"] == "The sandbox was not found"
    forged = _get(server, f"{PORT}-{sbx.sandbox_id}.evil.example")  # a domain the server does not answer to
    assert forged.status_code == 400
    for bad in ("0", "65536", "99999"):
        assert _get(server, f"{bad}-{sbx.sandbox_id}.localhost").status_code == 400


def test_the_port_of_a_listener_bound_to_every_address_is_reached(server, sbx):
    """A server on 0.0.0.0 (``python3 -m http.server``, as E2B's own tests start one)."""
    sbx.files.write("index.html", "hello from the sandbox")
    sbx.commands.run(f"python3 -m http.server {BIND_ALL} --bind 0.0.0.0", background=True)
    deadline, answer = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        answer = _get(server, sbx.get_host(BIND_ALL), "/index.html")
        if answer.status_code == 200:
            break
        time.sleep(0.5)
    assert answer is not None and answer.text == "hello from the sandbox"


def test_bad_ingress_options_refuse_the_create(server):
    for network, named in (({"allowPublicTraffic": "no"}, "allowPublicTraffic"),
                           ({"maskRequestHost": "a.example\r\nX-Evil: 1"}, "maskRequestHost"),
                           ({"maskRequestHost": "x" * 300}, "maskRequestHost")):
        answer = httpx.post(server.url + "/sandboxes", json={"templateID": "base", "network": network},
                            headers={"X-API-KEY": server.key}, timeout=30)
        assert answer.status_code == 400, answer.text
        assert f"network.{named}" in answer.json()["message"]


@pytest.mark.backends("bwrap", "docker")
def test_a_private_sandboxs_fork_is_private_with_a_token_of_its_own(server, monkeypatch):
    server.export(monkeypatch)
    source = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    children = source.fork(count=1, timeout=120)
    try:
        (child,) = children
        assert isinstance(child, Sandbox), child
        token = child.traffic_access_token
        assert token and token != source.traffic_access_token
        _serve(child)
        assert _get(server, child.get_host(PORT), **{TOKEN_HEADER: source.traffic_access_token}).status_code == 403
        assert _get(server, child.get_host(PORT), **{TOKEN_HEADER: token}).status_code == 200
    finally:
        source.kill()
        for child in children:
            if isinstance(child, Sandbox):
                child.kill()


@pytest.fixture(scope="module")
def host_network_server(backend, tmp_path_factory) -> Iterator[E2BServer]:
    """A server whose agent has ``network = true``: on bwrap the host's own network."""
    with e2b_server(tmp_path_factory.mktemp("ingress-wide"), backend, "network = true") as served:
        yield served


@pytest.mark.backends("bwrap", "docker")
def test_with_the_hosts_network_only_the_sandboxs_own_listeners_are_reached(host_network_server, host_service,
                                                                             monkeypatch):
    """bwrap with ``network = true`` shares this machine's network: a port is reached only
    when a process of the sandbox listens there, even a daemon that left its command."""
    server, (port, secret) = host_network_server, host_service
    server.export(monkeypatch)
    box, other = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    try:
        answer = _get(server, box.get_host(port))
        assert answer.status_code == 502 and secret not in answer.content
        mine = DAEMON
        box.files.write("srv.py", SERVER)
        box.commands.run(f"setsid python3 srv.py {mine} >/dev/null 2>&1 < /dev/null &")  # detached, in its pid ns
        deadline, seen = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            seen = _get(server, box.get_host(mine), "/daemon")
            if seen.status_code == 200:
                break
            time.sleep(0.3)
        assert seen is not None and seen.json()["path"] == "/daemon"
        assert _get(server, other.get_host(mine)).status_code == 502  # box's port, not other's
    finally:
        box.kill()
        other.kill()


@pytest.fixture(scope="module")
def listed_network_server(backend, tmp_path_factory) -> Iterator[E2BServer]:
    """A server whose agent's network is a list: its sandboxes have an egress proxy and its relay."""
    with e2b_server(tmp_path_factory.mktemp("ingress-listed"), backend, 'network = ["a.e2b.test"]') as served:
        yield served


@pytest.mark.backends("bwrap", "docker")
def test_the_egress_relay_inside_is_not_a_port_of_the_sandbox(listed_network_server, monkeypatch):
    server = listed_network_server
    server.export(monkeypatch)
    box = Sandbox.create(timeout=120)
    try:
        proxy = box.commands.run("echo $HTTPS_PROXY").stdout.strip()
        relay_port = httpx.URL(proxy).port
        assert relay_port
        connect = f"import socket; socket.create_connection(('127.0.0.1', {relay_port}), 3)"
        inside = box.commands.run(f'python3 -c "{connect}" && echo open')
        assert inside.stdout.strip() == "open"  # it listens inside
        answer = _get(server, box.get_host(relay_port))
        assert answer.status_code == 502 and answer.json()["message"] == PORT_NOT_OPEN
    finally:
        box.kill()


def test_with_e2b_shared_ingress_options_the_record_would_not_carry_are_refused(tmp_path, monkeypatch):
    """Two `guilds serve --e2b --e2b-shared` on one record (tests/test_deploy_shared.py): a sandbox
    made through one is served by the other, which knows of it only what the record keeps, so a
    private sandbox or a masked Host is refused at create; a public one's port is served."""
    from e2b.exceptions import SandboxException

    from guilds.fronts.e2b.keys import api_key
    from test_deploy_shared import TOKEN, on, replica

    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "ingress{secrets.token_hex(3)}"\nhome = "{tmp_path / "home"}"\n'
                      'sandbox = "local"\n')
    config.chmod(0o600)
    shared = {"config": str(config), "url": f"sqlite:///{tmp_path / 'shared.db'}", "folder": str(tmp_path)}
    monkeypatch.setenv("E2B_API_KEY", api_key(TOKEN, "default"))
    with replica(shared, "a") as (_, url):
        for network in ({"allow_public_traffic": False}, {"mask_request_host": "x.example"}):
            with pytest.raises(SandboxException, match="--e2b-shared"):
                Sandbox.create(timeout=120, network=network, **on(url))
        box = Sandbox.create(timeout=120, **on(url))
        try:
            assert box.traffic_access_token is None
            [port] = _free_ports(1)  # picked now: a port picked at import may be another server's by now
            _serve(box, port)
            answer = httpx.get(url + "/p", headers={"Host": box.get_host(port)}, timeout=30)
            assert answer.status_code == 200, answer.text
        finally:
            box.kill()
