"""A real `guilds serve --e2b` for the E2B SDKs' tests: started on a free port with a
sandbox backend, its printed E2B variables read back, stopped at the end."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kube_kit

BACKENDS = ("local", "bwrap", "docker")
"""The backends the E2B suite runs on (``pytest.mark.backends``, tests/backend_kit.py)."""
LOG_LINES_KEPT = 200
"""The server's last stderr lines kept (``E2BServer.log``) once its variables are read."""


@dataclass
class E2BServer:
    proc: subprocess.Popen
    url: str
    key: str
    other_key: str
    data: Path
    pid: int
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_LINES_KEPT))
    """Its last stderr lines (a line per call, uvicorn's): read on as it writes, so that its
    writes never fill the pipe and stop the server."""
    printed: str = ""
    """The lines it printed up to its E2B variables."""
    domain: str | None = None
    """E2B_DOMAIN when the server printed it (``--e2b-domain``) instead of the two URLs."""

    def rss_mb(self) -> float:
        """The server process's resident memory now, in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def env(self, key: str | None = None) -> dict[str, str]:
        """The variables `guilds serve --e2b` printed, as an E2B program exports them."""
        if self.domain is not None:
            return {"E2B_DOMAIN": self.domain, "E2B_API_KEY": key or self.key}
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_API_KEY": key or self.key}

    def export(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The variables set for the test, as an E2B program's shell has them."""
        for name, value in self.env().items():
            monkeypatch.setenv(name, value)


def _settings(folder: Path, backend: str, more: str, max_tool_calls: int = 1000) -> Path:
    """The agent's settings file, its agent an id of its own (no two servers share a sandbox);
    ``more``: TOML lines after the agent's (``network = ...`` belongs to [agent]; a table of
    its own follows)."""
    lines = ["[agent]", f'id = "e2b{secrets.token_hex(3)}"', f'home = "{folder / "home"}"',
             f'sandbox = "{backend.split("-")[0]}"', f"max_tool_calls = {max_tool_calls}", more]
    if backend.startswith("kubernetes"):  # the test cluster's namespace and image; claim mode's pool of 0
        table: dict[str, Any] = {**kube_kit.settings_table()}
        if backend == "kubernetes-claim":
            table.update(mode="claim", warm=0)
        lines += ["[kubernetes]", *(f"{key} = {json.dumps(value)}" for key, value in table.items())]
    path = folder / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def _read_exports(proc: subprocess.Popen, timeout: float = 120) -> dict[str, str]:
    """The variables the server printed (key "OTHER": the key named other); "printed": all its
    lines, up to the last of them (the sandboxes' ports)."""
    found: dict[str, str] = {"printed": ""}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        if not line:
            break
        found["printed"] += line
        if line.startswith("# a sandbox's port"):
            break
        if line.startswith("# key other: export E2B_API_KEY="):
            found["OTHER"] = line.split("=", 1)[1].strip()
        elif line.startswith("export "):
            name, value = line[len("export "):].strip().split("=", 1)
            found[name] = value
    return found


@contextmanager
def e2b_server(folder: Path, backend: str, settings: str = "", *, max_tool_calls: int = 1000,
               options: tuple[str, ...] = ()) -> Iterator[E2BServer]:
    """``settings``: more lines of the agent's settings file (see ``_settings``); ``options``:
    more options of `guilds serve`."""
    data = folder / "data"
    env = {**os.environ, "GUILDS_DATA": str(data)}
    env.pop("GUILDS_DATABASE_URL", None)
    config = str(_settings(folder, backend, settings, max_tool_calls))
    proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--config",
                             config, "--e2b", "--e2b-key", "other", *options],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    reader: threading.Thread | None = None
    try:
        found = _read_exports(proc)
        assert {"E2B_API_KEY", "OTHER"} <= found.keys(), found["printed"]
        if "E2B_DOMAIN" in found:
            url = f"https://api.{found['E2B_DOMAIN']}"
        else:
            assert found.get("E2B_API_URL") == found.get("E2B_SANDBOX_URL") is not None, found["printed"]
            url = found["E2B_API_URL"]
        server = E2BServer(proc, url, found["E2B_API_KEY"], found["OTHER"], data, proc.pid,
                           printed=found["printed"], domain=found.get("E2B_DOMAIN"))
        reader = threading.Thread(target=server.log.extend, args=(proc.stderr,), daemon=True)
        reader.start()
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if reader is not None:
            reader.join(5)
        if reader is None or not reader.is_alive():
            proc.stderr.close()  # type: ignore[union-attr]
        subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "sandbox", "rm", "--config", config], env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=120)


def home_of(box: Any, data: Path) -> Path:
    """An E2B sandbox's home on this machine: its agent's own (``<data>/agent-homes/<agent id>``),
    found by a file of a name of its own written into it (inside, the home is /home/user)."""
    marker = f".home-of-{secrets.token_hex(6)}"
    box.files.write(marker, "")
    found = list((data / "agent-homes").glob(f"*/{marker}"))
    assert len(found) == 1, found
    found[0].unlink()
    return found[0].parent


def folder_key(path: Path | str) -> tuple[int, int]:
    """A folder as the kernel tells it apart (device, inode): the same inside a sandbox, where
    it has another path (every E2B home is /home/user inside), and after its removal."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def pids_in(key: tuple[int, int]) -> list[int]:
    """Processes on this machine whose working folder is that folder (``folder_key``)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if folder_key(f"/proc/{entry}/cwd") == key:
                found.append(int(entry))
        except OSError:
            continue
    return found


def services_of(data: Path) -> dict[str, set[int]]:
    """The process services (guilds-code envd) running in agents' homes under data: their pids
    by the home's path on this machine (each runs in its home)."""
    root = data / "agent-homes"
    homes = {folder_key(home): str(home) for home in (root.iterdir() if root.exists() else [])}
    found: dict[str, set[int]] = {}
    for pid in pids_alive("envd\0"):
        with contextlib.suppress(OSError):
            home = homes.get(folder_key(f"/proc/{pid}/cwd"))
            if home is not None:
                found.setdefault(home, set()).add(pid)
    return found


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


@pytest.fixture(name="sbx")
def made_sandbox(server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``sbx``: a sandbox made through the SDK on the test module's ``server`` fixture, killed
    after the test (a module takes it with ``from e2b_kit import made_sandbox``)."""
    from e2b import Sandbox

    server.export(monkeypatch)
    box = Sandbox.create(timeout=120)
    yield box
    box.kill()


@pytest.fixture(name="client")
def made_sandboxes(server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``client``: makes sandboxes through the SDK (``Sandbox.create``'s options) on the test
    module's ``server`` fixture, each killed after the test (a module takes it with
    ``from e2b_kit import made_sandboxes``)."""
    from e2b import Sandbox

    server.export(monkeypatch)
    made: list[Any] = []

    def create(**options: Any) -> Any:
        box = Sandbox.create(timeout=120, **options)
        made.append(box)
        return box

    yield create
    for box in made:
        box.kill()
