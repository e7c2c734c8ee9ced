"""Test hosts for the egress proxy, on this machine only: a network namespace with a veth
pair on a 10.x address (never an address outside the machine), a test certificate
authority of its own, a real HTTPS server in the namespace, the proxy as its own
process (``python -m guilds.egress``), and a TCP relay in front of the proxy's Unix
socket so real clients (curl) can use it as ``--proxy http://…``. The tests' and the
benchmarks' common kit."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from guilds.egress.daemon import connect_unix

UPSTREAM = Path(__file__).resolve().parent / "fixtures" / "egress_upstream.py"
WAIT_SECONDS = 15.0
"""How long a test waits for a server or a proxy to start listening."""


def netns_usable() -> bool:
    """Can this process make network namespaces (root with ip)?"""
    if os.geteuid() != 0:
        return False
    return subprocess.run(["ip", "netns", "list"], check=False, capture_output=True).returncode == 0


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class HostsAuthority:
    """A certificate authority for test hosts (the host's side: what the proxy must verify against)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test root")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(hours=1))
                     .not_valid_after(now + datetime.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                    critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                                    critical=False)
                     .sign(self.key, hashes.SHA256()))
        self.pem = folder / "test-root.pem"
        self.pem.write_bytes(_pem(self.cert))

    def leaf(self, *names: str) -> Path:
        """A PEM file with a leaf for names (host names or addresses) and its key."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alts: list[x509.GeneralName] = []
        for name in names:
            try:
                alts.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alts.append(x509.DNSName(name))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(alts), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        path = self.folder / f"leaf-{secrets.token_hex(4)}.pem"
        path.write_bytes(_pem(cert) + _pem(key))
        return path


@dataclass
class Namespace:
    """A network namespace reached from the host over a veth pair: ``host_address`` on the
    host's end, ``address`` inside."""

    name: str
    address: str
    host_address: str

    def run(self, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)  # type: ignore[call-overload]


@contextlib.contextmanager
def namespace() -> Iterator[Namespace]:
    """A fresh namespace on a random 10.x.y.0/30, deleted (its veth pair with it) afterwards."""
    tag = secrets.token_hex(3)
    name, outside, inside = f"egp-{tag}", f"egh{tag}", f"egn{tag}"
    a, b = secrets.randbelow(200) + 20, secrets.randbelow(63) * 4
    host_address, address = f"10.{a}.{b}.1", f"10.{a}.{b}.2"
    steps = [["ip", "netns", "add", name],
             ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside],
             ["ip", "link", "set", inside, "netns", name],
             ["ip", "addr", "add", f"{host_address}/30", "dev", outside],
             ["ip", "link", "set", outside, "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{address}/30", "dev", inside],
             ["ip", "netns", "exec", name, "ip", "link", "set", inside, "up"],
             ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield Namespace(name, address, host_address)
    finally:
        subprocess.run(["ip", "link", "del", outside], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "ready", f"the test host did not start: {line!r}"


@contextlib.contextmanager
def upstream(ns: Namespace, folder: Path, *, cert: Path | None, port: int = 443,
             token: str = "") -> Iterator[Path]:
    """The test host (fixtures/egress_upstream.py) on ns's address; yields its seen-log.
    Every test host of folder keeps its ``/store`` in one file, ``store.jsonl``."""
    seen = folder / f"seen-{port}.log"
    seen.touch()
    (folder / "store.jsonl").touch()
    argv = [sys.executable, str(UPSTREAM), "--addr", ns.address, "--port", str(port), "--seen", str(seen),
            "--token", token, "--store", str(folder / "store.jsonl")] + (["--cert", str(cert)] if cert else [])
    process = ns.run(argv, stdout=subprocess.PIPE, text=True)
    try:
        _wait_ready(process)
        yield seen
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


class Proxy:
    """The egress proxy as its own process, its config written 0600 into folder."""

    def __init__(self, folder: Path, *, env: dict[str, str] | None = None, python: str = sys.executable,
                 **config: object) -> None:
        self.folder = folder
        self.socket = folder / "sock" / "proxy.sock"
        self.decisions = folder / "decisions.jsonl"
        self.pidfile = folder / "proxy.pid"
        where = {} if "listen" in config else {"socket": str(self.socket)}
        full: dict[str, object] = {**where, "decisions": str(self.decisions),
                                   "pidfile": str(self.pidfile), "ca_dir": str(folder / "ca"), **config}
        from guilds.egress.proxy_config import write_config

        self.config_path = write_config(folder / "egress.json", full)
        self.stderr = folder / "proxy.stderr"
        with open(self.stderr, "w") as err:
            self.process = subprocess.Popen([python, "-m", "guilds.egress", str(self.config_path)],
                                            env={**os.environ, **(env or {})}, stderr=err)
        deadline = time.monotonic() + WAIT_SECONDS
        while not self.pidfile.exists():
            assert self.process.poll() is None, self.stderr.read_text()
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.02)

    def decision_lines(self) -> list[dict[str, object]]:
        from guilds.egress.decisions import read_decisions

        return read_decisions(self.decisions)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=WAIT_SECONDS)


class Relay:
    """A TCP listener on 127.0.0.1 that splices each connection to a Unix socket
    (what the sandbox's relay does; here so curl can take ``--proxy http://…``)."""

    def __init__(self, unix_path: Path) -> None:
        self.unix_path = unix_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX) as proxy:
            try:
                proxy.connect(str(self.unix_path))
            except OSError:
                return
            back = threading.Thread(target=_copy, args=(proxy, client), daemon=True)
            back.start()
            _copy(client, proxy)
            back.join()

    def close(self) -> None:
        self.listener.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(64 * 1024):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def curl(relay: Relay, url: str, *args: str, tag: str = "", ca: Path | None = None,
         timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """curl through the relay (``--proxy-user TAG:`` when tag), trusting ca."""
    argv = ["curl", "-sS", "--max-time", str(timeout), "--noproxy", "", "--proxy", relay.url]
    if tag:
        argv += ["--proxy-user", f"{tag}:"]
    if ca:
        argv += ["--cacert", str(ca)]
    return subprocess.run(argv + [*args, url], check=False, capture_output=True, text=True, timeout=timeout + 10,
                          env={"PATH": os.environ["PATH"]})


def raw_exchange(unix_path: Path, data: bytes, timeout: float = 10) -> bytes:
    """Send data to the proxy's socket as it is and read its whole answer."""
    with connect_unix(unix_path) as sock:
        sock.settimeout(timeout)
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)
