"""The egress proxy as a process, against real test hosts in a network namespace of
this machine (HTTPS with a test authority, plain HTTP), driven by curl through a
TCP relay to its Unix socket, and by raw bytes where a client would be too polite."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egress_kit import HostsAuthority, Namespace, Proxy, Relay, curl, namespace, netns_usable, raw_exchange, upstream
from guilds.egress.ca import CertificateAuthority
from guilds.egress.daemon import UNIX_PATH_MAX, is_serving
from guilds.limits import EGRESS_HEAD_MAX_BYTES, EGRESS_REQUEST_LINE_MAX_BYTES

pytestmark = pytest.mark.skipif(not netns_usable(), reason="needs root and ip netns for the test hosts")

TOKEN = "ghp_RealTokenThatStaysOutside0001"
PLACEHOLDER = "GUILDS_PLACEHOLDER_00000000000001"
SRC = Path(__file__).resolve().parent.parent / "src"


@dataclass
class Site:
    ns: Namespace
    root: HostsAuthority
    bundle: Path
    proxy: Proxy
    relay: Relay
    seen: Path
    seen_plain: Path
    folder: Path
    trap: socket.socket

    def tagged(self, tag: str, count: int = 1) -> list[dict[str, object]]:
        """The decisions of tag, once there are count of them (an allowed one is written when its
        connection ends, a moment after the client's)."""
        deadline = time.monotonic() + 10
        while True:
            found = [d for d in self.proxy.decision_lines() if str(d["tag"]).startswith(tag)]
            if len(found) >= count or time.monotonic() > deadline:
                return found


def _proxy_env(root: HostsAuthority | None) -> dict[str, str]:
    env = {"PYTHONPATH": str(SRC)}
    if root is not None:
        env["SSL_CERT_FILE"] = str(root.pem)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp("egress")
    root = HostsAuthority(folder)
    trap = socket.create_server(("127.0.0.1", 0))
    trap.settimeout(0.5)
    trap_port = trap.getsockname()[1]
    with namespace() as ns:
        leaf = root.leaf("git.test", "other.test", ns.address)
        with upstream(ns, folder, cert=leaf, token=TOKEN) as seen, \
                upstream(ns, folder, cert=None, port=80) as seen_plain:
            proxy = Proxy(folder, env=_proxy_env(root),
                          allow=["git.test", "plain.test", "other.test", f"{ns.address}/32",
                                 "loop.test", f"loop.test:{trap_port}", "meta.test", "zero.test"],
                          resolve={"git.test": ns.address, "plain.test": ns.address, "other.test": ns.address,
                                   "loop.test": "127.0.0.1", "meta.test": "169.254.169.254",
                                   "zero.test": "0.0.0.0"},
                          secrets=[{"name": "GH_TOKEN", "placeholder": PLACEHOLDER, "value": TOKEN,
                                    "hosts": ["git.test"]}])
            bundle = CertificateAuthority.open(folder / "ca").trust_bundle(folder / "bundle.pem")
            relay = Relay(proxy.socket)
            try:
                yield Site(ns, root, bundle, proxy, relay, seen, seen_plain, folder, trap)
            finally:
                relay.close()
                proxy.stop()
                trap.close()


def _seen_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_listed_host_is_reached_and_the_decision_recorded(site):
    done = curl(site.relay, f"https://{site.ns.address}/echo", tag="run1/call1", ca=site.root.pem)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["Host"] == site.ns.address
    [decision] = site.tagged("run1/call1")
    assert decision["allowed"] is True and decision["host"] == site.ns.address and decision["port"] == 443
    assert decision["bytes_down"] > len(done.stdout) and decision["bytes_up"] > 0


def test_an_unlisted_host_gets_a_403_naming_the_setting(site):
    answer = raw_exchange(site.proxy.socket, b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: git.test\r\n\r\n")
    reason = b"guilds egress: api.example.com:443 is not in agent.network"
    assert answer.startswith(b"HTTP/1.1 403 " + reason + b"\r\n")
    assert answer.endswith(b"\r\n\r\n" + reason + b"\n")
    done = curl(site.relay, "https://api.example.com/", "-v", tag="run1/unlisted")
    assert done.returncode != 0 and reason.decode() in done.stderr
    [decision] = site.tagged("run1/unlisted")
    assert decision["allowed"] is False and decision["reason"] == reason.decode()


def test_an_unlisted_address_is_refused(site):
    done = curl(site.relay, f"https://{site.ns.host_address}/", "-v", tag="run1/addr", ca=site.root.pem)
    assert done.returncode != 0
    assert f"guilds egress: {site.ns.host_address}:443 is not in agent.network" in done.stderr


@pytest.mark.parametrize(("name", "shown", "kind"), [
    ("loop.test", "127.0.0.1", "a loopback address"),
    ("meta.test", "169.254.169.254", "a cloud metadata address"),
    ("zero.test", "0.0.0.0", "an unspecified address (this host)"),
])
def test_a_listed_name_resolving_inward_is_refused(site, name, shown, kind):
    done = curl(site.relay, f"https://{name}/", "-v", tag=f"run1/{name}")
    assert done.returncode != 0
    assert f"guilds egress: {name}:443 resolves to {shown}, {kind}" in done.stderr


def test_nothing_reaches_a_loopback_service_through_a_listed_name(site):
    """loop.test:<port> is listed, a service of the host listens there: the proxy must not connect."""
    port = site.trap.getsockname()[1]
    answer = raw_exchange(site.proxy.socket, f"CONNECT loop.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403 guilds egress: loop.test:")
    with pytest.raises(TimeoutError):
        site.trap.accept()


def test_the_connect_target_decides_never_the_host_header(site):
    listed_header = raw_exchange(site.proxy.socket,
                                 b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: git.test:443\r\n\r\n")
    assert b"api.example.com:443 is not in agent.network" in listed_header.split(b"\r\n")[0]
    plain = raw_exchange(site.proxy.socket, b"GET http://api.example.com/echo HTTP/1.1\r\nHost: plain.test\r\n\r\n")
    assert b"api.example.com:80 is not in agent.network" in plain.split(b"\r\n")[0]


def test_a_host_header_differing_from_the_target_is_refused(site):
    plain = raw_exchange(site.proxy.socket, b"GET http://plain.test/echo HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
    assert plain.startswith(b"HTTP/1.1 403 guilds egress: the Host header 'api.example.com' differs from the "
                            b"target plain.test:80")
    inside = curl(site.relay, "https://git.test/echo", "-H", "Host: api.example.com", "-i", ca=site.bundle)
    assert "403 guilds egress: the Host header 'api.example.com' differs from the target git.test:443" in inside.stdout
    assert not any("/echo" in line for line in _seen_lines(site.seen) if "api.example.com" in line)


def test_plain_http_reaches_a_listed_host_without_the_proxys_headers(site):
    done = curl(site.relay, "http://plain.test/echo", tag="run1/plain")
    assert done.returncode == 0, done.stderr
    headers = json.loads(done.stdout)
    assert headers["Host"] == "plain.test"
    assert "Proxy-Authorization" not in headers and headers["Connection"] == "close"
    assert site.tagged("run1/plain")[0]["allowed"] is True


def test_the_token_goes_out_only_as_the_secret_host_receives_it(site):
    bearer = curl(site.relay, "https://git.test/private", "-H", f"Authorization: Bearer {PLACEHOLDER}",
                  ca=site.bundle)
    assert bearer.stdout == "welcome\n"
    basic = curl(site.relay, "https://git.test/private", "-u", f"x-access-token:{PLACEHOLDER}", ca=site.bundle)
    assert basic.stdout == "welcome\n"
    seen = [line for line in _seen_lines(site.seen) if line.startswith("GET /private")]
    assert seen[-2] == f"GET /private Bearer {TOKEN}"
    assert base64.b64decode(seen[-1].rsplit(" ", 1)[1]).decode() == f"x-access-token:{TOKEN}"


def test_a_placeholder_sent_to_another_host_stays_a_placeholder(site):
    """other.test is listed (same test host) but the secret is not for it: no swap, no TLS interception."""
    for host in ("other.test", site.ns.address):
        done = curl(site.relay, f"https://{host}/private", "-H", f"Authorization: Bearer {PLACEHOLDER}",
                    ca=site.root.pem)
        assert done.stdout == "no\n", done.stderr
        assert _seen_lines(site.seen)[-1] == f"GET /private Bearer {PLACEHOLDER}"
    assert TOKEN not in site.seen_plain.read_text()


def test_the_token_is_scrubbed_from_what_comes_back(site):
    """The host echoes the token in a header and in a chunked body cut inside it."""
    for auth in (f"Bearer {PLACEHOLDER}", "Basic " + base64.b64encode(f"x:{PLACEHOLDER}".encode()).decode()):
        done = curl(site.relay, "https://git.test/leak", "-i", "-H", f"Authorization: {auth}", ca=site.bundle)
        assert done.returncode == 0, done.stderr
        real_auth = auth.replace(PLACEHOLDER, TOKEN) if auth.startswith("Bearer") else \
            "Basic " + base64.b64encode(f"x:{TOKEN}".encode()).decode()
        assert _seen_lines(site.seen)[-1] == f"GET /leak {real_auth}"
        assert f"X-Seen: {auth}" in done.stdout and f"seen: {auth}\n" in done.stdout
        assert TOKEN not in done.stdout and real_auth not in done.stdout


def test_an_intercepted_tunnel_keeps_its_connection_alive(site):
    done = curl(site.relay, "https://git.test/private", "-o", "/dev/null", "-o", "/dev/null",
                "-w", "%{http_code} %{num_connects}\n", "-H", f"Authorization: Bearer {PLACEHOLDER}",
                "https://git.test/echo", tag="run1/keep", ca=site.bundle)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["200 1", "200 0"]
    assert _seen_lines(site.seen)[-2:] == [f"GET /echo Bearer {TOKEN}", f"GET /private Bearer {TOKEN}"]
    assert len(site.tagged("run1/keep")) == 1


def _rss_high_water(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_large_body_streams_both_ways_without_being_held(site):
    size = 48 << 20
    before = _rss_high_water(site.proxy.process.pid)
    down = curl(site.relay, f"https://git.test/bytes?n={size}", "-o", "/dev/null", "-w", "%{size_download}",
                ca=site.bundle, timeout=120)
    assert down.stdout == str(size), down.stderr
    up = subprocess.run(["curl", "-sS", "--noproxy", "", "--proxy", site.relay.url, "--cacert", str(site.bundle),
                         "-H", "Transfer-Encoding: chunked", "--data-binary", "@-", "https://git.test/upload"],
                        input=b"y" * (8 << 20), capture_output=True, timeout=120, check=False)
    assert up.stdout == b"%d\n" % (8 << 20), up.stderr
    assert _rss_high_water(site.proxy.process.pid) - before < 16 << 20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("host", ["other.test", "git.test"])
def test_a_client_that_stops_reading_holds_the_host_back_not_the_proxys_memory(site, host):
    """32 MiB asked for, nothing read for a while: the proxy holds a bounded part of it
    (a tunnel's bytes, or an intercepted answer), then the whole body still arrives."""
    size = 32 << 20
    pid = site.proxy.process.pid
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(site.proxy.socket))
        raw.sendall(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
        assert raw.recv(100).startswith(b"HTTP/1.1 200")
        context = ssl.create_default_context(cafile=str(site.bundle))
        context.load_verify_locations(cafile=str(site.root.pem))
        with context.wrap_socket(raw, server_hostname=host) as tls:
            before = _rss(pid)
            tls.sendall(f"GET /bytes?n={size} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            time.sleep(2)
            held = _rss(pid) - before
            got = 0
            while got < size:
                data = tls.recv(1 << 20)
                assert data
                got += data.count(b"x")
    assert held < 8 << 20, held
    assert got == size


def test_the_hosts_certificate_is_verified(site, tmp_path):
    """A proxy that does not trust the test root refuses to carry the secret to that host."""
    untrusting = Proxy(tmp_path, env={**_proxy_env(None), "SSL_CERT_FILE": "/nonexistent"},
                       allow=["git.test", f"{site.ns.address}/32"], resolve={"git.test": site.ns.address},
                       secrets=[{"name": "T", "placeholder": PLACEHOLDER, "value": TOKEN, "hosts": ["git.test"]}])
    try:
        answer = raw_exchange(untrusting.socket, b"CONNECT git.test:443 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 502 guilds egress: the certificate of git.test:443 failed verification")
    finally:
        untrusting.stop()


@pytest.mark.parametrize(("request_bytes", "status", "reason"), [
    (b"CONNECT " + b"a" * EGRESS_REQUEST_LINE_MAX_BYTES + b":443 HTTP/1.1\r\n\r\n", 414,
     f"the request line is longer than {EGRESS_REQUEST_LINE_MAX_BYTES} bytes"),
    (b"GET / HTTP/1.1\r\nX: " + b"v" * EGRESS_HEAD_MAX_BYTES + b"\r\n\r\n", 431,
     f"the request head is longer than {EGRESS_HEAD_MAX_BYTES} bytes"),
    (b"HELLO\r\n\r\n", 400, "the request line is malformed: 'HELLO'"),
    (b"CONNECT git.test HTTP/1.1\r\n\r\n", 400, "the CONNECT target is not host:port: 'git.test'"),
    (b"GET /echo HTTP/1.1\r\nHost: plain.test\r\n\r\n", 400, "the proxy takes CONNECT host:port"),
    (b"GET https://git.test/ HTTP/1.1\r\n\r\n", 400, "the proxy takes CONNECT host:port"),
])
def test_a_bad_request_gets_a_one_line_refusal(site, request_bytes, status, reason):
    answer = raw_exchange(site.proxy.socket, request_bytes)
    first = answer.split(b"\r\n", 1)[0].decode()
    assert first.startswith(f"HTTP/1.1 {status} {reason}")


def test_a_silent_client_is_let_go(site):
    """Half a head and nothing more: the proxy still answers the next client."""
    hold = socket.socket(socket.AF_UNIX)
    hold.connect(str(site.proxy.socket))
    hold.sendall(b"CONNECT git.te")
    try:
        done = curl(site.relay, "http://plain.test/echo")
        assert done.returncode == 0
    finally:
        hold.close()


# --- the process ------------------------------------------------------------------

def test_the_socket_is_open_to_the_sandbox_and_the_config_is_not(site):
    assert stat.S_IMODE(site.proxy.socket.stat().st_mode) == 0o666
    assert stat.S_IMODE(site.proxy.config_path.stat().st_mode) == 0o600
    assert site.proxy.pidfile.read_text().strip() == str(site.proxy.process.pid)


def _proxy(folder: Path, **config: object) -> Proxy:
    return Proxy(folder, env=_proxy_env(None), allow=["git.test"], **config)


def test_a_stop_signal_removes_the_socket_and_pidfile(tmp_path):
    proxy = _proxy(tmp_path)
    assert proxy.stop() == 0
    assert not proxy.socket.exists() and not proxy.pidfile.exists()


def test_a_stop_signal_cuts_open_tunnels_at_once_and_records_them(site, tmp_path):
    """An intercepted tunnel left open (TLS inside) must not hold the proxy past its stop."""
    proxy = Proxy(tmp_path, env=_proxy_env(site.root), allow=["git.test", f"{site.ns.address}/32"],
                  resolve={"git.test": site.ns.address},
                  secrets=[{"name": "T", "placeholder": PLACEHOLDER, "value": TOKEN, "hosts": ["git.test"]}])
    bundle = CertificateAuthority.open(tmp_path / "ca").trust_bundle(tmp_path / "bundle.pem")
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(proxy.socket))
        raw.sendall(b"CONNECT git.test:443 HTTP/1.1\r\nProxy-Authorization: Basic " +
                    base64.b64encode(b"run3/open:") + b"\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 200")
        with ssl.create_default_context(cafile=str(bundle)).wrap_socket(raw, server_hostname="git.test") as tls:
            tls.sendall(b"GET /echo HTTP/1.1\r\nHost: git.test\r\n\r\n")
            assert tls.recv(100).startswith(b"HTTP/1.1 200")
            began = time.monotonic()
            assert proxy.stop() == 0
            assert time.monotonic() - began < 5
    assert proxy.stderr.read_text() == ""
    [decision] = proxy.decision_lines()
    assert decision["tag"] == "run3/open" and decision["allowed"] is True and decision["bytes_down"] > 0


def test_an_intercepted_tunnel_through_a_proxy_woken_from_sleep_is_served_as_before(site, tmp_path):
    """The connection that wakes a sleeping proxy is the server's side of it: the proxy ends
    its TLS with a leaf of its authority, swaps the placeholder, scrubs the answer."""
    proxy = Proxy(tmp_path, env=_proxy_env(site.root), allow=["git.test", f"{site.ns.address}/32"],
                  resolve={"git.test": site.ns.address}, linger_seconds=0.5,
                  secrets=[{"name": "T", "placeholder": PLACEHOLDER, "value": TOKEN, "hosts": ["git.test"]}])
    try:
        bundle = CertificateAuthority.open(tmp_path / "ca").trust_bundle(tmp_path / "bundle.pem")
        for turn in ("asleep", "awake"):
            if turn == "asleep":
                deadline = time.monotonic() + 15
                while b"waiter.py" not in Path(f"/proc/{proxy.process.pid}/cmdline").read_bytes():
                    assert time.monotonic() < deadline, "the proxy never slept"
                    time.sleep(0.05)
            with socket.socket(socket.AF_UNIX) as raw:
                raw.connect(str(proxy.socket))
                raw.sendall(b"CONNECT git.test:443 HTTP/1.1\r\n\r\n")
                assert raw.recv(100).startswith(b"HTTP/1.1 200")
                with ssl.create_default_context(cafile=str(bundle)).wrap_socket(raw, server_hostname="git.test") as tls:
                    tls.sendall(f"GET /private HTTP/1.1\r\nHost: git.test\r\nAuthorization: Bearer {PLACEHOLDER}"
                                "\r\nConnection: close\r\n\r\n".encode())
                    answer = b"".join(iter(lambda: tls.recv(4096), b""))
            assert answer.startswith(b"HTTP/1.1 200"), (turn, answer[:200])
            assert TOKEN.encode() not in answer
    finally:
        proxy.stop()
    assert proxy.stderr.read_text() == ""


def test_the_proxy_lives_while_its_idle_clock_is_fresh_and_exits_after(tmp_path):
    clock = tmp_path / "clock"
    clock.touch()
    fresh = threading.Event()
    fresh.set()

    def keep_fresh() -> None:
        while fresh.is_set():
            clock.touch()
            time.sleep(0.2)

    threading.Thread(target=keep_fresh, daemon=True).start()
    proxy = _proxy(tmp_path, idle_clock=str(clock), idle_seconds=2.0)
    time.sleep(3)
    assert proxy.process.poll() is None
    assert raw_exchange(proxy.socket, b"CONNECT x.test:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    fresh.clear()
    assert proxy.process.wait(timeout=15) == 0
    assert not proxy.socket.exists() and not proxy.pidfile.exists()


def test_a_second_proxy_for_the_same_sandbox_steps_aside(tmp_path):
    first = _proxy(tmp_path)
    try:
        second = subprocess.run([sys.executable, "-m", "guilds.egress", str(first.config_path)],
                                env={**os.environ, **_proxy_env(None)}, capture_output=True, text=True,
                                timeout=30, check=False)
        assert second.returncode == 3
        assert second.stderr == f"guilds egress: a proxy already serves {first.socket}\n"
        assert raw_exchange(first.socket, b"CONNECT x.test:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    finally:
        first.stop()


def test_a_dead_proxys_socket_is_replaced_by_the_next(tmp_path):
    first = _proxy(tmp_path)
    assert is_serving(first.socket)
    first.process.kill()
    first.process.wait()
    assert first.socket.exists() and not is_serving(first.socket)
    with pytest.raises(ConnectionRefusedError):
        raw_exchange(first.socket, b"CONNECT x.test:443 HTTP/1.1\r\n\r\n")
    first.pidfile.unlink()
    second = _proxy(tmp_path)
    try:
        assert raw_exchange(second.socket, b"CONNECT x.test:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
        assert is_serving(second.socket)
        assert [d["host"] for d in second.decision_lines()] == ["x.test"]  # the probes left no line
    finally:
        second.stop()


CREDENTIAL = "5c" * 32


def _tcp_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: conn.recv(4096), b""))


def test_on_tcp_only_a_connection_that_sends_the_credential_first_is_served(tmp_path):
    proxy = _proxy(tmp_path, listen="127.0.0.1:0", credential=CREDENTIAL)
    try:
        pid, port = proxy.pidfile.read_text().split()
        assert int(pid) == proxy.process.pid and not proxy.socket.exists()
        ask = b"CONNECT x.test:443 HTTP/1.1\r\n\r\n"
        served = _tcp_exchange(int(port), b"GUILDS-EGRESS " + CREDENTIAL.encode() + b"\n" + ask)
        assert served.startswith(b"HTTP/1.1 403") and b"x.test:443 is not in agent.network" in served
        assert proxy.stderr.read_text() == ""
        for wrong in (b"GUILDS-EGRESS " + b"5d" * 32 + b"\n", b"GUILDS-EGRESS " + CREDENTIAL.encode()[:-1], b""):
            assert _tcp_exchange(int(port), wrong + ask) == b""  # another agent's, one cut short, none
        assert _tcp_exchange(int(port), b"") == b""  # a probe: it sends nothing, and is not logged
        assert [d["host"] for d in proxy.decision_lines()] == ["x.test"]  # none of them reached the policy
        assert proxy.stderr.read_text().count("without this sandbox's credential was closed") == 3
    finally:
        assert proxy.stop() == 0
    assert not proxy.pidfile.exists()


def test_on_tcp_a_taken_port_falls_back_to_another(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _proxy(tmp_path / "a", listen="127.0.0.1:0", credential=CREDENTIAL)
    taken = int(first.pidfile.read_text().split()[1])
    second = _proxy(tmp_path / "b", listen=f"127.0.0.1:{taken}", credential=CREDENTIAL)
    try:
        port = int(second.pidfile.read_text().split()[1])
        assert port != taken
        assert _tcp_exchange(port, b"GUILDS-EGRESS " + CREDENTIAL.encode() + b"\nCONNECT x.test:443 HTTP/1.1\r\n\r\n"
                             ).startswith(b"HTTP/1.1 403")
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize(("config", "said"), [
    ({"listen": "127.0.0.1:0"}, "egress config: credential must be 64 hex digits with listen"),
    ({"listen": "127.0.0.1:0", "credential": "abc"}, "egress config: credential must be 64 hex digits with listen"),
    ({"listen": "localhost:80", "credential": CREDENTIAL},
     "egress config: listen must be an address and a port, got 'localhost:80'"),
    ({"listen": "127.0.0.1:0", "credential": CREDENTIAL, "socket": "/s"},
     "egress config: socket and listen exclude each other"),
    ({"socket": "/s", "credential": CREDENTIAL}, "egress config: credential is only for listen"),
])
def test_a_wrong_tcp_config_is_named(config, said):
    from guilds.egress.proxy_config import ConfigError, parse_config

    with pytest.raises(ConfigError) as raised:
        parse_config({"decisions": "/d", "allow": ["git.test"], **config})
    assert str(raised.value) == said


def test_a_wrong_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"socket": str(tmp_path / "s"), "decisions": str(tmp_path / "d"),
                                  "allow": ["bad host"]}))
    done = subprocess.run([sys.executable, "-m", "guilds.egress", str(config)], env={**os.environ, **_proxy_env(None)},
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr == ("egress config: agent.network: 'bad host' is not a host name, *.domain, host:port "
                           "or address range\n")


def test_connections_are_served_at_once(site):
    """Twenty clients at a time, each with its own tag, each recorded."""
    results: list[int] = []

    def one(n: int) -> None:
        results.append(curl(site.relay, "http://plain.test/echo", tag=f"run2/c{n}").returncode)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0] * 20, time.monotonic() - began
    assert len(site.tagged("run2/", 20)) == 20


@pytest.mark.parametrize("target", ["http://[::1/", "http://[::1", "http://[zz]/", "http://a]b/", "http://h:99999/"])
def test_a_malformed_url_gets_a_400_and_no_traceback(site, target):
    before = site.proxy.stderr.read_text()
    answer = raw_exchange(site.proxy.socket, f"GET {target} HTTP/1.1\r\n\r\n".encode())
    first = answer.split(b"\r\n", 1)[0].decode()
    assert first.startswith("HTTP/1.1 400 "), answer
    assert site.proxy.stderr.read_text() == before
    assert site.proxy.decision_lines()[-1]["reason"] == first.removeprefix("HTTP/1.1 400 ")


def test_a_failure_no_branch_foresaw_is_a_500_and_one_line_in_the_log(site, tmp_path):
    """A secret whose value no header can carry (not Latin-1) fails the request it is swapped
    into: the client gets a 500, the log one line without the value, and the proxy serves on."""
    value = "€" * len(PLACEHOLDER)
    odd = Proxy(tmp_path, env=_proxy_env(site.root), allow=["git.test", f"{site.ns.address}/32"],
                resolve={"git.test": site.ns.address},
                secrets=[{"name": "ODD", "placeholder": PLACEHOLDER, "value": value, "hosts": ["git.test"]}])
    relay = Relay(odd.socket)
    try:
        bundle = CertificateAuthority.open(tmp_path / "ca").trust_bundle(tmp_path / "bundle.pem")
        for _ in range(2):
            done = curl(relay, "https://git.test/private", "-i", "-H", f"Authorization: Bearer {PLACEHOLDER}",
                        ca=bundle)
            assert "\nHTTP/1.1 500 guilds egress: the proxy failed serving this request; see its log" in done.stdout
        log = odd.stderr.read_text().splitlines()
        assert len(log) == 2 and all(line.startswith("guilds egress: serving a connection failed: Unicode")
                                     for line in log), log
        assert value not in odd.stderr.read_text() and value[:3] not in odd.decisions.read_text()
    finally:
        relay.close()
        odd.stop()


def test_a_proxy_whose_socket_path_is_past_the_kernels_limit_serves_there(tmp_path):
    """A data folder deep in the tree: the socket's path is over sun_path's 107 bytes, bound
    and reached through its folder held open (``unix_address``), never refused."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proxy = _proxy(deep)
    try:
        assert len(os.fsencode(str(proxy.socket))) > UNIX_PATH_MAX
        assert is_serving(proxy.socket)
        assert raw_exchange(proxy.socket, b"CONNECT x.test:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    finally:
        proxy.stop()
    assert not is_serving(proxy.socket)
