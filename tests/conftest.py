"""Shared fixtures: the built one-file helper, run as the orchestrator runs it.

The ``sandbox`` fixture runs each test on both transports: ``exec`` (one helper
process per call) and ``resident`` (one ``guilds-code serve`` per test, its
calls as frames). ``run_raw`` is the one-shot process on either.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import backend_kit
import parallel_kit
import rerun_report
from guilds.sandbox.helpers import build_helper
from guilds_code.protocol import decode_envelope
from resident_kit import ResidentServer

PYTHON = os.path.realpath(sys.executable)


@pytest.hookimpl(tryfirst=True)  # before the tmp_path factory reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    parallel_kit.short_basetemp(config)
    parallel_kit.own_postgres()
    config.pluginmanager.register(parallel_kit.Groups(), "parallel_kit.groups")
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) prints them
        config.pluginmanager.register(rerun_report.FirstFailures(), "rerun_report")


def pytest_unconfigure(config: pytest.Config) -> None:
    parallel_kit.drop_own_postgres()


@pytest.fixture(scope="session", autouse=True)
def no_overlay_home_left(tmp_path_factory):
    """Every overlay home a test left mounted under this run's temporary folders (an agent
    left live keeps its home mounted on the host) unmounted when the run ends."""
    yield
    from guilds.agents import mounts

    base = str(tmp_path_factory.getbasetemp()) + "/"
    for point in sorted(mounts.overlay_homes(), reverse=True):
        if point.startswith(base):
            mounts.unmount(point)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backend_kit.parametrize(metafunc)


@contextlib.contextmanager
def sized_tmpfs(folder: Path, size: int | str, mode: str | None = "0700"):
    """A tmpfs of size (bytes, or tmpfs's "64k") mounted on folder while the block runs:
    what a test fills is its own, never the disk under the host's /tmp. Skipped
    where it cannot be mounted (not root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    options = f"size={size}" + (f",mode={mode}" if mode else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             check=False, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture(scope="session")
def helper_path(tmp_path_factory) -> Path:
    """The one-file guilds-code, built once per test session."""
    return build_helper(tmp_path_factory.mktemp("helper") / "guilds-code")


@dataclass
class Sandbox:
    """A plain-folder sandbox for helper tests: a home and a state root."""

    helper: Path
    home: Path
    state: Path
    run_id: str = "run1"
    agent_id: str = "agent1"
    env: dict[str, str] = field(default_factory=dict)
    transport: str = "exec"
    _calls: int = 0
    _server: ResidentServer | None = None

    def request(self, op: str, args: dict[str, Any], **extra: Any) -> dict[str, Any]:
        self._calls += 1
        req = {
            "op": op,
            "args": args,
            "run_id": self.run_id,
            "agent_id": self.agent_id,
            "call_id": f"c{self._calls}",
            "home": str(self.home),
            "cwd": str(self.home),
            "max_bytes": 8192,
            "seq": self._calls,
        }
        req.update(extra)
        return req

    def process_env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "GUILDS_STATE_DIR": str(self.state),
            "LANG": "C.UTF-8",
        }
        env.update(self.env)
        return env

    def run_raw(self, arg: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "-I", "-S", str(self.helper), arg],
            check=False, env=self.process_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )

    def server(self) -> ResidentServer:
        """The resident helper, started with the current helper and environment."""
        env = self.process_env()
        if self._server is not None and self._server.env != env:
            self.close()
        if self._server is None:
            self._server = ResidentServer(PYTHON, str(self.helper), env)
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def call_request(self, req: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        if self.transport == "resident":
            return self.server().call(req, timeout)
        arg = base64.b64encode(json.dumps(req).encode()).decode()
        proc = self.run_raw(arg, timeout=timeout)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        lines = proc.stdout.splitlines()
        assert len(lines) == 1, proc.stdout[:500]
        return decode_envelope(lines[0])

    def call(self, op: str, args: dict[str, Any], timeout: float = 60, **extra: Any) -> dict[str, Any]:
        return self.call_request(self.request(op, args, **extra), timeout=timeout)


@pytest.fixture(params=["exec", "resident"])
def sandbox(request, helper_path, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    box = Sandbox(helper=helper_path, home=home, state=state, transport=request.param)
    yield box
    box.close()


def ok_text(envelope: dict[str, Any]) -> str:
    assert envelope["ok"] is True, envelope
    return envelope["text"]


def error_text(envelope: dict[str, Any]) -> str:
    assert envelope["ok"] is False, envelope
    return envelope["error"]


def write(sandbox: Sandbox, name: str, data) -> Path:
    """A file under the sandbox's home (folders made), from text or bytes."""
    path = sandbox.home / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path
