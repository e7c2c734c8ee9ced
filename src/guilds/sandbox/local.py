"""The ``local`` backend: a folder on this machine is the home. It isolates nothing:
commands run as the orchestrator's own user, read and write whatever that user
can (its other files, other agents' homes, the data folder and run record),
reach the network, and are bounded by no limit but the call's timeout.

Layout under the data folder::

    helpers/guilds-code-<hash>.py    the helper, built once per content
    state/                           the state root (GUILDS_STATE_DIR): requests/,
                                     <agent id>/repos.json, <agent id>/background/

Commands run as this user, in the home, with the agent's environment
(``_agent.agent_env``). ``stop()`` ends nothing: without a pid namespace the
backend cannot find what the agent started (a ``setsid`` daemon leaves any
process group), so background commands keep running until they end.
``remove()`` removes the agent's state folder; the home stays.

Doctor's lines: the host's ``rg`` (code_search runs it) and the python that runs
the helpers; the backend runs whatever they say.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from ..config.settings import AgentSettings
from ..errors import SandboxError
from ..limits import DOCTOR_PROBE_SECONDS
from ._host_folder import agent_env, checked_id, locate, real_python, removed, write_beneath, write_repos
from ._spawn import output_of, run_process
from .base import Backend, Check, ExecResult
from .helpers import HELPER_PACKAGES, cached_helper
from .process_channel import LocalProcess

if TYPE_CHECKING:
    from .egress_side import Egress

NAME = "local"
STATE_FOLDER = "state"
"""The state root's folder under the data folder."""
MIN_PYTHON = (3, 9)


class LocalSandbox(Backend):
    name = NAME
    isolates = False
    egress: Egress | None = None
    """Never one: local refuses agent.network as a list (``config.egress``)."""

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *, path: str | None = None):
        """path: the agent's PATH (default: this process's PATH)."""
        self.settings = settings
        checked_id(settings)
        self.home = str(settings.home)
        data = os.path.realpath(data_dir)
        self.state_dir = os.path.join(data, STATE_FOLDER)
        self._kept = [Path(data_dir) / STATE_FOLDER / settings.id]
        """What ``remove()`` removes, named under the data folder as it was given."""
        self.python = real_python()
        self._helper_dir = os.path.join(data, "helpers")
        self._helpers: dict[str, str] = {}
        self._env = agent_env(settings, home=self.home, state_dir=self.state_dir,
                              path=path or os.environ.get("PATH"))

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> LocalSandbox:
        return cls(settings, data_dir)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        """rg and the helpers' python, marked needed whatever the configured backend."""
        return [_check_rg(), _check_python()]

    @classmethod
    def can_run(cls, checked: Sequence[Check]) -> bool:
        """Always: without rg only code_search fails."""
        return True

    async def remove(self) -> list[str]:
        """Remove the agent's state folder under the data folder (nothing to stop first)."""
        return await asyncio.to_thread(lambda: list(removed(self._kept)))

    def helper_path(self, name: str) -> str:
        if name not in self._helpers:
            raise SandboxError(f"helper {name} is not installed (start() the sandbox first)")
        return self._helpers[name]

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def _start(self) -> None:
        os.makedirs(self.home, exist_ok=True)
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        for name in HELPER_PACKAGES:
            self._helpers[name] = str(cached_helper(Path(self._helper_dir), name))
        write_repos(self.settings, state_root=self.state_dir, home=self.home)

    async def exec(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float
    ) -> ExecResult:
        return await run_process(argv, env={**self._env, **(env or {})}, cwd=self.home, timeout=timeout)

    async def open_process(self, argv: Sequence[str]) -> LocalProcess:
        return LocalProcess(argv, env=self._env, cwd=self.home)

    async def write_file(self, path: str, data: bytes) -> None:
        root, rel = locate(path, {self.state_dir: self.state_dir, self.home: self.home})
        await asyncio.to_thread(write_beneath, root, rel, data)

    async def stop(self) -> list[str]:
        """Nothing to end: see the module docstring."""
        return []


def _check_rg() -> Check:
    found = shutil.which("rg")
    version = output_of([found, "--version"], timeout=DOCTOR_PROBE_SECONDS) if found else None
    if not version:
        return Check("rg", False, "not found on PATH (code_search needs it)",
                     "install ripgrep (Debian: apt-get install ripgrep)")
    return Check("rg", True, version.splitlines()[0])


def _check_python() -> Check:
    python = real_python()
    version = sys.version_info[:3] if python == os.path.realpath(sys.executable) else None
    text = ".".join(map(str, version)) if version else "?"
    ok = version is not None and version[:2] >= MIN_PYTHON
    return Check("sandbox python", ok, f"{python} ({text}; the helpers need {'.'.join(map(str, MIN_PYTHON))}+)",
                 "run guilds with a Python of 3.9 or later")
