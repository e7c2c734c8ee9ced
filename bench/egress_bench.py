"""The egress proxy against the same HTTPS requests made directly, in one run.

Run (as root: it makes a network namespace for the test host):
    .venv/bin/python bench/egress_bench.py [--requests 60] [--mib 100] [--rounds 3] [--proxies 64]

The test host is tests/fixtures/egress_upstream.py over TLS on a 10.x address of a
network namespace of this machine (veth pair), its certificate from a test
authority the proxy trusts through SSL_CERT_FILE. One client, Python's
http.client, makes every request, so the only difference between paths is the
proxy (the sandbox's relay is not in the measure):

- direct: the client connects to the host itself;
- tunnel: CONNECT through the proxy's Unix socket, the client's TLS passed as bytes
  (a listed host no secret is for);
- intercepted: CONNECT to a host a secret is for: the proxy ends the client's TLS
  with a leaf of its authority, opens its own to the host, swaps the placeholder in
  the request's Authorization header and scrubs the value from the answer.

Latency: ``GET /echo``, on a new connection each time (connect, TLS, request) and on
one kept-alive connection; the paths take turns request by request; medians. The
download: ``GET /bytes?n=…`` read 1 MiB at a time; paths take turns round by round;
the median round's MiB/s. Memory: ``--proxies`` proxy processes started as the
sandboxes start theirs (each with a secret, so its authority is loaded), each having
served one intercepted request; the sum of their RSS and of their PSS (shared pages
split between them) from /proc.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from egress_kit import HostsAuthority, Proxy, namespace, upstream  # noqa: E402

from guilds.egress.ca import CertificateAuthority  # noqa: E402

TOKEN = "ghp_BenchTokenThatStaysOutside001"
PLACEHOLDER = "GUILDS_PLACEHOLDER_00000000000001"
READ = 1 << 20


class UnixTunnel(http.client.HTTPSConnection):
    """HTTPS to host through the proxy's Unix socket (CONNECT, then TLS inside)."""

    def __init__(self, proxy_socket: Path, host: str, context: ssl.SSLContext) -> None:
        super().__init__(host, 443, context=context)
        self.set_tunnel(host, 443)
        self.proxy_socket = proxy_socket

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(self.proxy_socket))
        self.sock = sock
        self._tunnel()  # type: ignore[attr-defined]
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._tunnel_host)  # type: ignore[attr-defined]


def _get(conn: http.client.HTTPConnection, path: str, auth: str = "") -> int:
    conn.request("GET", path, headers={"Authorization": auth} if auth else {})
    response = conn.getresponse()
    total = 0
    while data := response.read(READ):
        total += len(data)
    return total


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--proxies", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, namespace() as ns:
        folder = Path(scratch)
        root = HostsAuthority(folder)
        with upstream(ns, folder, cert=root.leaf("plain.test", "secret.test", ns.address), token=TOKEN):
            proxy = Proxy(folder, env={"SSL_CERT_FILE": str(root.pem), "PYTHONPATH": str(ROOT / "src")},
                          allow=["plain.test", "secret.test", f"{ns.address}/32"],
                          resolve={"plain.test": ns.address, "secret.test": ns.address},
                          secrets=[{"name": "T", "placeholder": PLACEHOLDER, "value": TOKEN,
                                    "hosts": ["secret.test"]}])
            try:
                bundle = CertificateAuthority.open(folder / "ca").trust_bundle(folder / "bundle.pem")
                context = ssl.create_default_context(cafile=str(bundle))
                context.load_verify_locations(cafile=str(root.pem))
                paths: dict[str, Callable[[], http.client.HTTPConnection]] = {
                    "direct": lambda: http.client.HTTPSConnection(ns.address, 443, context=context),
                    "tunnel": lambda: UnixTunnel(proxy.socket, "plain.test", context),
                    "intercepted": lambda: UnixTunnel(proxy.socket, "secret.test", context),
                }
                auth = f"Bearer {PLACEHOLDER}"
                _latency(paths, args.requests, auth)
                _download(paths, args.mib, args.rounds, auth, proxy.process.pid)
            finally:
                proxy.stop()
            _memory(folder, ns.address, root, args.proxies, context)


def _latency(paths: dict[str, Callable[[], http.client.HTTPConnection]], requests: int, auth: str) -> None:
    new: dict[str, list[float]] = {name: [] for name in paths}
    kept: dict[str, list[float]] = {name: [] for name in paths}
    alive = {name: make() for name, make in paths.items()}
    for conn in alive.values():
        _get(conn, "/echo", auth)  # the kept connections open before timing
    for _ in range(requests):
        for name, make in paths.items():
            began = time.perf_counter()
            conn = make()
            _get(conn, "/echo", auth)
            conn.close()
            new[name].append(time.perf_counter() - began)
            began = time.perf_counter()
            _get(alive[name], "/echo", auth)
            kept[name].append(time.perf_counter() - began)
    base_new, base_kept = _median_ms(new["direct"]), _median_ms(kept["direct"])
    print(f"| path | new connection (ms) | added | kept alive (ms) | added |  ({requests} requests each)")
    for name in paths:
        n, k = _median_ms(new[name]), _median_ms(kept[name])
        print(f"| {name} | {n:.2f} | {n - base_new:+.2f} ({n / base_new:.2f}x) | {k:.2f} | "
              f"{k - base_kept:+.2f} ({k / base_kept:.2f}x) |")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _download(paths: dict[str, Callable[[], http.client.HTTPConnection]], mib: int, rounds: int,
              auth: str, proxy_pid: int) -> None:
    """MiB/s of each path, and the proxy's own CPU time per download (user + system)."""
    size = mib << 20
    rates: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, make in paths.items():
            conn = make()
            spent = _cpu_seconds(proxy_pid)
            began = time.perf_counter()
            got = _get(conn, f"/bytes?n={size}", auth)
            rates[name].append(mib / (time.perf_counter() - began))
            cpu[name].append(_cpu_seconds(proxy_pid) - spent)
            conn.close()
            if got != size:
                raise SystemExit(f"{name}: {got} bytes of {size}")
    direct = statistics.median(rates["direct"])
    print(f"| {mib} MiB download | MiB/s | vs direct | the proxy's CPU |  ({rounds} rounds)")
    for name in paths:
        rate = statistics.median(rates[name])
        print(f"| {name} | {rate:.0f} | {rate / direct:.2f}x | {statistics.median(cpu[name]):.2f} s |")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _memory(folder: Path, address: str, root: HostsAuthority, count: int, context: ssl.SSLContext) -> None:
    """count proxies open at once, each having served one request: without a secret (a tunnel),
    then with one (an intercepted request: the authority's library loaded, a leaf made)."""
    env = {"SSL_CERT_FILE": str(root.pem), "PYTHONPATH": str(ROOT / "src")}
    secret = [{"name": "T", "placeholder": PLACEHOLDER, "value": TOKEN, "hosts": ["secret.test"]}]
    for kind, secrets, host in (("a tunnel, no secret", [], "plain.test"),
                                ("an intercepted request, one secret", secret, "secret.test")):
        proxies: list[Proxy] = []
        try:
            for n in range(count):
                box = folder / f"box-{host}-{n}"
                box.mkdir()
                proxies.append(Proxy(box, env=env, allow=[host, f"{address}/32"], resolve={host: address},
                                     ca_dir=str(folder / "ca"), secrets=secrets))
                served = UnixTunnel(proxies[-1].socket, host, context)
                _get(served, "/echo", f"Bearer {PLACEHOLDER}")
                served.close()
            rss = sum(_status_kib(p.process.pid, "VmRSS") for p in proxies)
            pss = sum(_pss_kib(p.process.pid) for p in proxies)
            print(f"| {count} proxies, each after {kind} "
                  f"| RSS {rss / 1024:.0f} MiB ({rss / count / 1024:.1f} each) "
                  f"| PSS {pss / 1024:.0f} MiB ({pss / count / 1024:.1f} each) |")
        finally:
            for p in proxies:
                p.stop()


if __name__ == "__main__":
    main()
