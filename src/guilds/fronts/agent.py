"""``guilds.open``: one agent's tools in a line, for a Python agent loop.

    async with guilds.open("agent.toml") as agent:
        agent.tools(format="anthropic")                  # or "openai", "mcp"
        result = await agent.call("run-1", "shell", {"command": "make test"})
        run = agent.run()                                # a new run id; agent.run("run-1") names one
        result = await run.call("file_read", {"path": "README.md"})

        await agent.checkpoint("before-refactor")        # the home kept by name (docs/checkpoints.md)
        await agent.rewind("run-1", 3)                   # the files as before call 3 of run-1
        await agent.rewind(None, name="before-refactor")

        made = await agent.make_agent(template="python", owner="alice")   # an agent of its own
        await made.call("run-1", "shell", {"command": "ls"})
        await agent.list_agents(owner="alice"); await agent.remove_agent(made.id)
        forked = await agent.fork(made.id, 5)              # 5 agents whose homes start as made's now
        await agent.fork(None, 2, checkpoint="before-refactor")   # this agent's, at its checkpoint

The toolbox behind it is the one every front opens (``guilds.fronts.wiring``): the
settings file (or an ``AgentSettings``, or the data folder's default), the
data folder, the environment and checked overrides. Leaving the block closes
the run record; the sandbox is left to its idle stop (``guilds sandbox stop``
ends it at once). The agents made on demand (``guilds.agents.registry``) come
from the templates the settings file serves (``guilds.config.templates``) and
share the agent's run record; they live until removed or expired, past the block.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInput
from .wiring import SettingsSource, Wired, open_toolbox, resolve

if TYPE_CHECKING:
    from ..agents.fork import Forked, Source
    from ..agents.registry import Agents
    from ..checkpoints import Checkpoint
    from ..config.settings import AgentSettings
    from ..record.agent_rows import AgentRecord
    from ..toolbox import CallResult, Toolbox
    from ..toolbox.checkpointing import AgentCheckpoints, Rewound

RUN_PREFIX = "py-"


def new_run_id() -> str:
    """A fresh run id: py-<UTC time>-<random>."""
    return f"{RUN_PREFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Run:
    """One run of an agent: its calls share the working directory, the read ledger and the budget."""

    agent: Tools
    id: str

    async def call(self, tool: str, args: Any) -> CallResult:
        return await self.agent.call(self.id, tool, args)

    async def rewind(self, seq: int) -> Rewound:
        """The files as they were before this run's call seq."""
        return await self.agent.rewind(self.id, seq)


class Tools:
    """An agent's tools and calls, through its ``toolbox``."""

    @property
    def toolbox(self) -> Toolbox:
        raise NotImplementedError

    @property
    def settings(self) -> AgentSettings:
        return self.toolbox.settings

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

    def _checkpoints(self) -> AgentCheckpoints:
        """The agent's checkpoints; BadInput naming why where there are none (on kubernetes, what
        the cluster lacks, asked of it: a refusal's few milliseconds, once per refused request)."""
        from ..sandbox import checkpoints_refusal

        found = self.toolbox.checkpoints
        if found is None:
            raise BadInput(checkpoints_refusal(self.settings, "checkpoints")
                           or f"checkpoints: not served on {self.settings.sandbox}")
        return found

    async def checkpoint(self, name: str) -> Checkpoint:
        """A checkpoint of the home now, kept under name (docs/checkpoints.md)."""
        from ..config.checks import name as checked_name

        return await self._checkpoints().take(checked_name(name, "checkpoint name"))

    def checkpoints(self) -> list[Checkpoint]:
        """The agent's checkpoints kept, oldest first."""
        return self._checkpoints().files.points()

    async def rewind(self, run_id: str | None, seq: int | None = None, *, name: str | None = None) -> Rewound:
        """The files as they were before call seq of run run_id (or at the checkpoint called name)."""
        from ..toolbox.toolbox import check_run_id

        if name is not None:
            return await self._checkpoints().rewind_to(name)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise BadInput(f"seq: must be a call's number (1 or more), got {seq!r}")
        return await self._checkpoints().rewind(check_run_id(run_id), seq)


@dataclass(frozen=True, kw_only=True)
class MadeAgent(Tools):
    """An agent made on demand: its record (id, template, owner, home, expiry) and its tools."""

    record: AgentRecord
    opened: Toolbox

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def toolbox(self) -> Toolbox:
        return self.opened


@dataclass(frozen=True)
class ForkedAgents:
    """A fork's children and what it did (``guilds.agents.fork.Forked``)."""

    forked: Forked
    agents: list[MadeAgent]


class Agent(Tools):
    """An open agent: its tools, its calls, and the agents made on demand from the templates
    its settings serve. Made by ``guilds.open``; use it in ``async with``."""

    def __init__(self, wired: Wired, *, pool: bool = False):
        self.wired = wired
        self.pool = pool
        """Run the templates' warm pools while the agent is open (``guilds.agents.pool``)."""
        self._opened: Any = None
        self._toolbox: Toolbox | None = None
        self._agents: Agents | None = None

    async def __aenter__(self) -> Agent:
        self._opened = open_toolbox(self.wired)
        self._toolbox = await self._opened.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        opened, self._opened, self._toolbox = self._opened, None, None
        agents, self._agents = self._agents, None
        try:
            if agents is not None:
                await agents.close()
        finally:
            await opened.__aexit__(*exc)

    @property
    def toolbox(self) -> Toolbox:
        if self._toolbox is None:
            raise BadInput("the agent is not open: use `async with guilds.open(...) as agent`")
        return self._toolbox

    @property
    def settings(self) -> AgentSettings:
        return self.wired.settings

    async def agents(self) -> Agents:
        """The agents made on demand of these settings' templates (the expired reaped at first use;
        with ``pool``, the warm pools started then, and their agents removed when the agent closes)."""
        if self._agents is None:
            from ..agents.registry import Agents
            from ..config.templates import served_by

            served = served_by(self.wired.settings, self.wired.settings_file, self.wired.env)
            agents = await Agents.open(served, self.wired.data_dir, self.toolbox.store, self.toolbox.observer)
            if self.pool:
                await agents.pools.start()
            self._agents = agents
        return self._agents

    async def make_agent(self, template: str = "default", *, owner: str = "local",
                         expires_in: float | None = None) -> MadeAgent:
        """A new agent of the template, its sandbox started. ``ConfigError`` for a template not
        served (naming those served), ``BadInput`` past a cap; a failed make leaves nothing."""
        agents = await self.agents()
        record = await agents.make(template, owner=owner, expires_in=expires_in)
        return MadeAgent(record=record, opened=await agents.toolbox(record.id))

    async def made_agent(self, agent_id: str, *, owner: str | None = None) -> MadeAgent:
        """A live agent made on demand (by this process or another, before a restart too)."""
        agents = await self.agents()
        toolbox = await agents.toolbox(agent_id, owner=owner)
        record = (await agents.store.agents(agent_id=toolbox.settings.id))[0]
        return MadeAgent(record=record, opened=toolbox)

    async def fork(self, agent_id: str | None, n: int, *, checkpoint: str | None = None,
                   owner: str | None = None, expires_in: float | None = None) -> ForkedAgents:
        """n new agents of the source's template whose homes start as the source's home now, or at
        its checkpoint (a name or an id); the source is an agent made on demand (agent_id), or
        this agent (None: its template ``default``, its owner ``local``). Their owner is the
        source's unless given. Only files are forked, never a running process. BadInput for bad
        input, ``AgentRefused`` past a cap: a failed fork makes nothing (docs/checkpoints.md)."""
        from ..agents.fork import fork

        agents = await self.agents()
        forked = await fork(agents, await self._fork_source(agents, agent_id), n, checkpoint=checkpoint,
                            owner=owner, expires_in=expires_in)
        children = [MadeAgent(record=r, opened=await agents.toolbox(r.id)) for r in forked.records]
        return ForkedAgents(forked, children)

    async def _fork_source(self, agents: Agents, agent_id: str | None) -> Source:
        from ..agents.fork import Source
        from ..agents.registry import DEFAULT_OWNER, no_such_agent
        from ..config.settings import CHECKPOINT_SANDBOXES
        from ..config.templates import DEFAULT_TEMPLATE

        if agent_id is None:
            self._checkpoints()  # the home on this machine, or BadInput naming the sandbox
            return Source(self.settings.id, DEFAULT_TEMPLATE, DEFAULT_OWNER, self.settings.home)
        from ..record.agent_rows import LIVE

        found = await agents.store.agents(agent_id=str(agent_id), statuses=(LIVE,))
        if not found:
            raise no_such_agent(agent_id)
        record = found[0]
        if record.sandbox not in CHECKPOINT_SANDBOXES:
            raise BadInput(f"fork: not served on {record.sandbox} (the home of agent {record.id} is not on "
                           "this machine)")
        return Source(record.id, record.template, record.owner, Path(record.home))

    async def list_agents(self, *, owner: str | None = None) -> list[AgentRecord]:
        """The live agents made on demand (of one owner when given), oldest first."""
        return await (await self.agents()).live(owner=owner)

    async def expire_agent(self, agent_id: str, expires_in: float | None, *, owner: str | None = None) -> AgentRecord:
        """Give a live agent made on demand a new expiry, ``expires_in`` seconds from now (None: never)."""
        return await (await self.agents()).expire_in(agent_id, expires_in, owner=owner)

    async def remove_agent(self, agent_id: str, *, owner: str | None = None) -> list[str]:
        """Remove an agent made on demand and everything of it; what was removed, one line each."""
        return await (await self.agents()).remove(agent_id, owner=owner)


def open(settings: SettingsSource = None, *, data_dir: str | os.PathLike | None = None,
         env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None,
         pool: bool = False) -> Agent:
    """An agent to enter with ``async with``; the other arguments are ``guilds.fronts.wiring.resolve``'s.

    ``pool``: run the warm pools of the settings' templates (``[templates.NAME.pool]``)
    from the first use of the agents made on demand until the ``async with`` ends, which
    removes the pooled agents (docs/agents.md). Bad settings or overrides raise
    ``ConfigError`` here, naming the key.
    """
    return Agent(resolve(settings, data_dir=data_dir, env=env, overrides=overrides), pool=pool)
