"""A shared sandbox's commands through any server: two `guilds serve --e2b --e2b-shared` on one
run record and one token, each advertising its address (``GUILDS_ADVERTISE_URL``), as a
deployment's replicas do (docs/deploy.md), driven by the real E2B SDK.

A command started through one server is listed, followed, sent input, closed and killed
through the other; its end removes it from every list; when the server that started it
stops, its commands end with its process service and are not found through the other."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2b_kit import _read_exports
from test_deploy_shared import TOKEN, on, servers_files, stop

pytestmark = pytest.mark.slow


@pytest.fixture
def shared(tmp_path: Path) -> dict[str, str]:
    return servers_files(tmp_path, "shared-commands")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def replica(shared: dict[str, str], name: str, advertise: bool = True) -> Iterator[str]:
    """A server of its own data folder on a port of its own, saying where it answers; its URL.
    The port is free when picked; a client's connection may take it before the server binds
    it, so a server that could not bind it starts again on another."""
    data = Path(shared["folder"], name)
    data.mkdir(mode=0o700)
    (data / "serve.token").write_text(TOKEN + "\n")
    (data / "serve.token").chmod(0o600)
    for _ in range(3):
        port = free_port()
        env = {**os.environ, "GUILDS_DATA": str(data), "GUILDS_DATABASE_URL": shared["url"]}
        if advertise:
            env["GUILDS_ADVERTISE_URL"] = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", str(port),
                                 "--config", shared["config"], "--e2b", "--e2b-shared", "--e2b-key", "other"],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        found = _read_exports(proc)
        if "E2B_API_URL" in found or "address already in use" not in found["printed"]:
            break
        stop(proc)
    try:
        assert "E2B_API_URL" in found, found["printed"]
        yield found["E2B_API_URL"]
    finally:
        stop(proc)


def until(check, what: str, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


@pytest.fixture
def key(monkeypatch):
    from guilds.fronts.e2b.keys import api_key

    monkeypatch.setenv("E2B_API_KEY", api_key(TOKEN, "default"))


def pids(box) -> set[int]:
    return {process.pid for process in box.commands.list()}


def test_a_command_started_through_one_server_is_reached_through_the_other(shared, key):
    from e2b import Sandbox

    with replica(shared, "a") as url_a, replica(shared, "b") as url_b:
        made = Sandbox.create(timeout=300, **on(url_a))
        there = Sandbox.connect(made.sandbox_id, **on(url_b))
        reader = made.commands.run("cat", background=True, stdin=True)
        ticker = made.commands.run("i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done",
                                   background=True, envs={"SEEN": "through-a"}, cwd="/tmp")
        listed = {process.pid: process for process in there.commands.list()}
        assert {reader.pid, ticker.pid} <= listed.keys()
        assert listed[ticker.pid].envs == {"SEEN": "through-a"} and listed[ticker.pid].cwd == "/tmp"
        assert listed[ticker.pid].cmd.endswith("bash")

        there.commands.send_stdin(reader.pid, "sent through b\n")
        there.commands.close_stdin(reader.pid)
        assert reader.wait().stdout == "sent through b\n"  # cat got it, ended at its stdin's end
        until(lambda: reader.pid not in pids(there), "the ended command gone from b's list")
        assert reader.pid not in pids(made)

        followed: list[str] = []
        handle = there.commands.connect(ticker.pid, timeout=60)
        ends: list[BaseException] = []

        def follow() -> None:
            try:
                handle.wait(on_stdout=followed.append)
            except Exception as exc:  # noqa: BLE001 - its end by a signal is the SDK's exception
                ends.append(exc)

        waiting = threading.Thread(target=follow, daemon=True)
        waiting.start()
        until(lambda: any("tick" in line for line in followed), "the ticks followed through b")
        assert there.commands.kill(ticker.pid) is True
        waiting.join(30)
        assert not waiting.is_alive()
        assert [getattr(end, "exit_code", None) for end in ends] == [-1], ends  # its end by the signal, through b
        until(lambda: ticker.pid not in pids(there) | pids(made), "the killed command gone from both lists")
        assert there.commands.kill(ticker.pid) is False  # not found on either server now


def test_a_command_of_a_server_that_stopped_is_not_found_through_the_other(shared, key):
    from e2b import Sandbox

    with replica(shared, "b") as url_b:
        with replica(shared, "a") as url_a:
            made = Sandbox.create(timeout=300, **on(url_a))
            sleeper = made.commands.run("sleep 600", background=True)
            there = Sandbox.connect(made.sandbox_id, **on(url_b))
            assert sleeper.pid in pids(there)
        # a stopped: its process service ended its commands, and its rows went with its owner entry
        assert sleeper.pid not in pids(there)
        assert there.commands.kill(sleeper.pid) is False
        assert there.commands.run("echo still served").stdout == "still served\n"


def test_a_server_that_says_no_address_serves_its_own_commands_only(shared, key):
    """Without GUILDS_ADVERTISE_URL there is nowhere to send a request on to: the other server
    lists the command and answers not found for it, as before, rather than hanging."""
    from e2b import Sandbox

    with replica(shared, "a", advertise=False) as url_a, replica(shared, "b") as url_b:
        made = Sandbox.create(timeout=300, **on(url_a))
        sleeper = made.commands.run("sleep 600", background=True)
        there = Sandbox.connect(made.sandbox_id, **on(url_b))
        assert sleeper.pid in pids(there)
        assert there.commands.kill(sleeper.pid) is False
        assert made.commands.kill(sleeper.pid) is True


@pytest.mark.parametrize("given, own, sent", [
    ("guilds-serve:8765", "http://10.0.0.1:8765", "guilds-serve:8765"),  # the Service's name: every replica's
    ("49983-abc.e2b.example", "http://10.0.0.1:8765", "49983-abc.e2b.example"),  # the E2B domain's
    ("10.0.0.1:8765", "http://10.0.0.1:8765", "10.0.0.2:8765"),  # this replica's own address: the other's
    ("10.0.0.1:8765", None, "10.0.0.1:8765"),  # this server says no address
])
def test_a_request_sent_on_carries_a_host_the_other_server_accepts(given, own, sent):
    from guilds.fronts.e2b.shared_commands import host_for

    assert host_for(given, own, "http://10.0.0.2:8765") == sent
