"""``guilds.open``: one agent's tools in a line, for a Python agent loop.

    async with guilds.open("agent.toml") as agent:
        agent.tools(format="anthropic")                  # or "openai", "mcp"
        result = await agent.call("run-1", "shell", {"command": "make test"})
        run = agent.run()                                # a new run id; agent.run("run-1") names one
        result = await run.call("file_read", {"path": "README.md"})

The toolbox behind it is the one every front opens (``guilds.fronts.wiring``): the
settings file (or an ``AgentSettings``, or the data folder's default), the
data folder, the environment and checked overrides. Leaving the block closes
the run record; the sandbox is left to its idle stop (``guilds sandbox stop``
ends it at once).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from .wiring import SettingsSource, Wired, open_toolbox, resolve

if TYPE_CHECKING:
    from ..config.settings import AgentSettings
    from ..toolbox import CallResult, Toolbox

RUN_PREFIX = "py-"


def new_run_id() -> str:
    """A fresh run id: py-<UTC time>-<random>."""
    return f"{RUN_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Run:
    """One run of an agent: its calls share the working directory, the read ledger and the budget."""

    agent: Agent
    id: str

    async def call(self, tool: str, args: Any) -> CallResult:
        return await self.agent.call(self.id, tool, args)


class Agent:
    """An open agent: its tools, its calls. Made by ``guilds.open``; use it in ``async with``."""

    def __init__(self, wired: Wired):
        self.wired = wired
        self._opened: Any = None
        self._toolbox: Toolbox | None = None

    async def __aenter__(self) -> Agent:
        self._opened = open_toolbox(self.wired)
        self._toolbox = await self._opened.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        opened, self._opened, self._toolbox = self._opened, None, None
        await opened.__aexit__(*exc)

    @property
    def toolbox(self) -> Toolbox:
        if self._toolbox is None:
            raise BadInput("the agent is not open: use `async with guilds.open(...) as agent`")
        return self._toolbox

    @property
    def settings(self) -> AgentSettings:
        return self.wired.settings

    def tools(self, format: str = "anthropic") -> list[dict[str, Any]]:
        """The tool definitions offered now (none while the coding flag is off), in a model API's format."""
        from ..toolbox.tools import FORMATS, export

        if format not in FORMATS:
            raise BadInput(f"format: must be one of {', '.join(sorted(FORMATS))}, got {format!r}")
        return export(self.toolbox.tools(), format)

    async def call(self, run_id: str, tool: str, args: Any) -> CallResult:
        """One tool call of run run_id, through the whole pipeline, recorded."""
        return await self.toolbox.call(run_id, tool, args)

    def run(self, run_id: str | None = None) -> Run:
        """The run named run_id, or a new one."""
        return Run(self, run_id or new_run_id())


def open(settings: SettingsSource = None, *, data_dir: str | os.PathLike | None = None,
         env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Agent:
    """An agent to enter with ``async with``; the arguments are ``guilds.fronts.wiring.resolve``'s.

    Bad settings or overrides raise ``ConfigError`` here, naming the key.
    """
    return Agent(resolve(settings, data_dir=data_dir, env=env, overrides=overrides))
