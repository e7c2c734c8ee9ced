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
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Mapping, Sequence

from ..config.settings import AgentSettings
from ..errors import SandboxError
from ._host_folder import agent_env, checked_id, locate, real_python, write_beneath, write_repos
from ._spawn import run_process
from .base import ExecResult
from .helpers import HELPER_PACKAGES, cached_helper
from .process_channel import LocalProcess


class LocalSandbox:
    name = "local"

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *, path: str | None = None):
        """path: the agent's PATH (default: this process's PATH)."""
        self.settings = settings
        checked_id(settings)
        self.home = str(settings.home)
        data = os.path.realpath(data_dir)
        self.state_dir = os.path.join(data, "state")
        self.python = real_python()
        self._helper_dir = os.path.join(data, "helpers")
        self._helpers: dict[str, str] = {}
        self._env = agent_env(settings, home=self.home, state_dir=self.state_dir,
                              path=path or os.environ.get("PATH"))

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

    async def stop(self) -> None:
        """Nothing to end: see the module docstring."""
