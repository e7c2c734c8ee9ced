"""The egress proxy asleep (guilds.egress.waiter): a proxy on a Unix socket that served
nothing for linger_seconds execs the waiter in its own process, holding the socket
and no secret; a connection that sends wakes it, a probe does not; a stop signal or
its idle clock ends it as it ends the proxy; killed, it fails closed. The real proxy
process (egress_kit.Proxy), real sockets; no network needed."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from egress_kit import Proxy, raw_exchange
from guilds.egress.daemon import is_serving

SRC = Path(__file__).resolve().parent.parent / "src"
SECRET = "ghs_TheRealValueOnlyTheProxyHolds1"
PLACEHOLDER = "GUILDS_PLACEHOLDER_000000000000001"
REFUSED = b"HTTP/1.1 403"
ASK = b"CONNECT x.test:443 HTTP/1.1\r\n\r\n"


def asleep_proxy(folder: Path, **config: object) -> Proxy:
    """A proxy (linger 0.5 s, a secret for git.test) started and awake."""
    return Proxy(folder, env={"PYTHONPATH": str(SRC)}, allow=["git.test"], linger_seconds=0.5,
                 secrets=[{"name": "T", "placeholder": PLACEHOLDER, "value": SECRET, "hosts": ["git.test"]}],
                 **config)


def argv_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def sleeping(proxy: Proxy) -> bool:
    return any(a.endswith("waiter.py") for a in argv_of(proxy.process.pid))


def wait_until(what, seconds: float = 15.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, f"{what.__name__} never became true"
        time.sleep(every)


def private_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return sum(int(m) for m in re.findall(r"^Private_(?:Clean|Dirty):\s+(\d+)", text, re.M))


def memory_holds(pid: int, needle: bytes) -> bool:
    """Does any readable mapping of pid hold needle? (root reads /proc/<pid>/mem)"""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r") or line.rstrip().endswith("[vvar]"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue
    return False


@pytest.fixture
def proxy(tmp_path):
    started = asleep_proxy(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def test_a_quiet_proxy_sleeps_in_its_own_process_and_still_listens(proxy):
    assert argv_of(proxy.process.pid)[1:3] == ["-m", "guilds.egress"]
    wait_until(lambda: sleeping(proxy))
    assert proxy.pidfile.read_text().split()[0] == str(proxy.process.pid)
    assert is_serving(proxy.socket) and oct(proxy.socket.stat().st_mode & 0o777) == "0o666"
    assert str(proxy.config_path) in argv_of(proxy.process.pid)  # the orchestrator still finds it by its config


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's memory: needs root")
def test_asleep_it_holds_no_secret_and_a_fraction_of_the_memory(proxy):
    awake = private_kib(proxy.process.pid)
    assert memory_holds(proxy.process.pid, SECRET.encode())  # the check can see it while awake
    wait_until(lambda: sleeping(proxy))
    assert not memory_holds(proxy.process.pid, SECRET.encode())
    assert private_kib(proxy.process.pid) < awake / 3


def test_a_probe_leaves_it_asleep_and_a_request_wakes_it_then_it_sleeps_again(proxy):
    wait_until(lambda: sleeping(proxy))
    for _ in range(3):
        assert is_serving(proxy.socket)
    time.sleep(0.3)
    assert sleeping(proxy)
    assert raw_exchange(proxy.socket, ASK).startswith(REFUSED)
    assert not sleeping(proxy) and "--conn-fd" in argv_of(proxy.process.pid)
    assert [d["host"] for d in proxy.decision_lines()] == ["x.test"]  # the probes left no line
    wait_until(lambda: sleeping(proxy))
    assert raw_exchange(proxy.socket, ASK).startswith(REFUSED)
    assert proxy.stderr.read_text() == ""


def test_every_connection_that_comes_while_it_wakes_is_served(proxy):
    wait_until(lambda: sleeping(proxy))
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda _: raw_exchange(proxy.socket, ASK), range(24)))
    assert all(a.startswith(REFUSED) for a in answers)
    assert len(proxy.decision_lines()) == 24


def test_a_stop_signal_ends_the_sleeping_proxy_and_removes_its_files(proxy):
    wait_until(lambda: sleeping(proxy))
    assert proxy.stop() == 0
    assert not proxy.socket.exists() and not proxy.pidfile.exists()


@pytest.mark.parametrize("moment", ["falling asleep", "waking"])
def test_a_stop_signal_in_the_middle_of_an_exec_still_ends_it_cleanly(tmp_path, moment):
    proxy = asleep_proxy(tmp_path)
    try:
        if moment == "waking":
            wait_until(lambda: sleeping(proxy))
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(proxy.socket))
                conn.sendall(ASK)
                wait_until(lambda: not sleeping(proxy), every=0.0005)
                proxy.process.send_signal(signal.SIGTERM)
        else:
            wait_until(lambda: sleeping(proxy), every=0.0005)
            proxy.process.send_signal(signal.SIGTERM)
        assert proxy.process.wait(timeout=15) == 0
        assert not proxy.socket.exists() and not proxy.pidfile.exists()
    finally:
        proxy.stop()


def test_its_idle_clock_ends_the_sleeping_proxy(tmp_path):
    clock = tmp_path / "clock"
    clock.touch()
    proxy = asleep_proxy(tmp_path, idle_clock=str(clock), idle_seconds=3.0)
    try:
        wait_until(lambda: sleeping(proxy))
        assert proxy.process.wait(timeout=15) == 0
        assert not proxy.socket.exists() and not proxy.pidfile.exists()
    finally:
        proxy.stop()


def test_a_killed_sleeping_proxy_fails_closed_and_a_second_one_takes_its_place(tmp_path):
    first = asleep_proxy(tmp_path)
    wait_until(lambda: sleeping(first))
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    assert not is_serving(first.socket)
    with pytest.raises(ConnectionRefusedError):
        raw_exchange(first.socket, ASK)
    first.pidfile.unlink()
    second = asleep_proxy(tmp_path)
    try:
        assert raw_exchange(second.socket, ASK).startswith(REFUSED)
    finally:
        second.stop()


def test_the_sleeping_proxys_lock_still_turns_a_second_proxy_away(proxy):
    wait_until(lambda: sleeping(proxy))
    second = subprocess.run([sys.executable, "-m", "guilds.egress", str(proxy.config_path)],
                            env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True,
                            timeout=30, check=False)
    assert second.returncode == 3
    assert sleeping(proxy) and is_serving(proxy.socket)


def test_a_tcp_proxy_never_sleeps(tmp_path):
    proxy = Proxy(tmp_path, env={"PYTHONPATH": str(SRC)}, allow=["git.test"], linger_seconds=0.5,
                  listen="127.0.0.1:0", credential="5c" * 32)
    try:
        time.sleep(1.5)
        assert not sleeping(proxy)
        port = int(proxy.pidfile.read_text().split()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GUILDS-EGRESS " + b"5c" * 32 + b"\n" + ASK)
            assert conn.recv(100).startswith(REFUSED)
    finally:
        proxy.stop()
