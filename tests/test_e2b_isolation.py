"""Two E2B sandboxes of ``base`` on bwrap, tried as an attacker would, through the unmodified
E2B Python SDK: each is an agent of its own, so one sandbox cannot read the other's
files (by their path, nor by searching the whole file system), see its processes in
/proc, signal them (by pid, nor with ``kill -KILL -1``), reach the sockets it listens
on, nor reach its egress proxy; each attack fails, and the other sandbox runs on."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from e2b_kit import E2BServer, e2b_server, home_of, pids_alive

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap"),
              pytest.mark.skipif(os.geteuid() != 0, reason="an agent's own uid needs a root orchestrator")]
PORT = 8765
LISTEN = ("python3 -c 'import socket, sys, time\n"
          "t = socket.socket(); t.bind((\"127.0.0.1\", {port})); t.listen()\n"
          "u = socket.socket(socket.AF_UNIX); u.bind(\"\\0{name}\"); u.listen()\n"
          "time.sleep({marker})'")
"""Listens on a TCP port of the loopback and on an abstract unix socket, then sleeps."""
CONNECT = ("python3 -c 'import socket, sys\n"
           "for family, address in ((socket.AF_INET, (\"127.0.0.1\", {port})), (socket.AF_UNIX, \"\\0{name}\"),\n"
           "                        (socket.AF_UNIX, sys.argv[1])):\n"
           "    try: socket.socket(family).connect(address); print(\"reached\", address)\n"
           "    except OSError as e: print(\"refused\", type(e).__name__)' {proxy}")
"""Tries the other sandbox's TCP port, its abstract socket and its egress proxy's socket."""
OWN_PROXY = "/run/guilds-egress/proxy.sock"
"""Where a sandbox's own egress proxy's socket is, inside it."""


def _listener(marker: str) -> int:
    """The host pid of the sandbox's listening python (its command line holds marker)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in pids_alive(marker):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"python"):
                    return pid
            except OSError:  # ended meanwhile (its bash)
                continue
        time.sleep(0.05)
    raise AssertionError(f"no listener with {marker}")


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2b-isolation")
    with e2b_server(folder, backend, 'network = ["example.invalid"]') as served:
        yield served


def test_two_sandboxes_of_base_cannot_read_see_signal_or_reach_each_other(server: E2BServer, monkeypatch):
    server.export(monkeypatch)
    a, b = Sandbox.create(timeout=300), Sandbox.create(timeout=300)
    try:
        home_a, marker = home_of(a, server.data), f"7{os.getpid() % 10000:04d}1"
        a.files.write("mine.txt", "a-private-words")
        a.commands.run(LISTEN.format(port=PORT, name=f"guilds-{marker}", marker=marker), background=True, timeout=0)
        victim = _listener(marker)
        own = CONNECT.format(port=PORT, name=f"guilds-{marker}", proxy=OWN_PROXY)
        assert a.commands.run(own).stdout.count("reached") == 3  # its own sockets and proxy answer it
        uid_a, uid_b = (box.commands.run("id -u").stdout.strip() for box in (a, b))
        assert uid_a != uid_b
        proxy_a = server.data / "egress" / home_a.name / "run" / "proxy.sock"
        assert proxy_a.is_socket()  # started before its first command
        attacks = {
            "read": f"cat {home_a}/mine.txt; ls -a {home_a}",
            "find": "find / -path /proc -prune -o -name mine.txt -print 2>/dev/null; echo searched",
            "proc": f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; ls /proc/{victim}/root",
            "signal": f"kill -KILL {victim}; kill -STOP {victim}",
            "reach": CONNECT.format(port=PORT, name=f"guilds-{marker}", proxy=proxy_a),
        }
        for what, command in attacks.items():
            out = b.commands.run(f"{{ {command}\n}} 2>&1; true", timeout=120).stdout
            assert "a-private-words" not in out and "mine.txt" not in out.replace(f"{home_a}/mine.txt", ""), \
                (what, out)
            assert marker not in out, (what, out)
            if what == "signal":
                assert out.count("No such process") == 2, out
            if what == "reach":
                assert out.split() == ["refused", "ConnectionRefusedError", "refused", "ConnectionRefusedError",
                                       "refused", "FileNotFoundError"], out
        with contextlib.suppress(SandboxException):  # every process it may signal: its own service too, at once
            b.commands.run("kill -KILL -1", background=True)
        time.sleep(0.5)
        assert Path(f"/proc/{victim}/stat").read_text().split()[2] in ("S", "R")  # A's command runs on
        assert a.files.read("mine.txt") == "a-private-words"
        assert a.commands.run(own).stdout.count("reached") == 3
    finally:
        a.kill()
        b.kill()
    assert not pids_alive(marker)  # killed: its processes with it
