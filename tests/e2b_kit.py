"""A real `guilds serve --e2b` for the E2B SDKs' tests: started on a free port with a
sandbox backend, its printed E2B variables read back, stopped at the end."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable
from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable

BACKENDS = [
    "local",
    pytest.param("bwrap", marks=[pytest.mark.bwrap, pytest.mark.skipif(
        bwrap_unavailable() is not None, reason=f"bwrap: {bwrap_unavailable()}")]),
    pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.skipif(
        docker_unavailable() is not None, reason=f"docker: {docker_unavailable()}")]),
]
"""The backends the E2B suite runs on."""


@dataclass
class E2BServer:
    proc: subprocess.Popen
    url: str
    key: str
    other_key: str
    data: Path

    def env(self, key: str | None = None) -> dict[str, str]:
        """The variables `guilds serve --e2b` printed, as an E2B program exports them."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": key or self.key}


def _settings(folder: Path, backend: str, more: str) -> Path:
    """The agent's settings file, its agent an id of its own (no two servers share a sandbox);
    ``more``: TOML lines after the agent's (``network = ...`` belongs to [agent]; a table of
    its own follows)."""
    lines = ["[agent]", f'id = "e2b{secrets.token_hex(3)}"', f'home = "{folder / "home"}"',
             f'sandbox = "{backend}"', "max_tool_calls = 1000", more]
    path = folder / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def _read_exports(proc: subprocess.Popen, timeout: float = 120) -> dict[str, str]:
    """The variables the server printed (key "OTHER": the key named other); "printed": all its lines."""
    found: dict[str, str] = {"printed": ""}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(found) < 5:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        if not line:
            break
        found["printed"] += line
        if line.startswith("# key other: export E2B_API_KEY="):
            found["OTHER"] = line.split("=", 1)[1].strip()
        elif line.startswith("export "):
            name, value = line[len("export "):].strip().split("=", 1)
            found[name] = value
    return found


@contextmanager
def e2b_server(folder: Path, backend: str, settings: str = "") -> Iterator[E2BServer]:
    """``settings``: more lines of the agent's settings file (see ``_settings``)."""
    data = folder / "data"
    env = {**os.environ, "GUILDS_DATA": str(data)}
    env.pop("GUILDS_DATABASE_URL", None)
    config = str(_settings(folder, backend, settings))
    proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--config",
                             config, "--e2b", "--e2b-key", "other"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        found = _read_exports(proc)
        assert {"E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "OTHER"} <= found.keys(), found["printed"]
        assert found["E2B_API_URL"] == found["E2B_SANDBOX_URL"]
        yield E2BServer(proc, found["E2B_API_URL"], found["E2B_API_KEY"], found["OTHER"], data)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
        subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "sandbox", "rm", "--config", config], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=120)


def pids_alive(marker: str) -> list[int]:
    """Processes on this machine whose command line holds marker (a test's own unique word)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and b"pids_alive" not in cmdline:
            alive.append(int(entry))
    return alive
