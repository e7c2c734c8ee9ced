"""One template's warm pool and its agents, and how a pooled agent is asked whether it answers
(``guilds.agents.pool`` runs them).

    TemplatePool(template)          its ready agents, makes under way, demand (``target``), hits, misses
    await answers(toolbox)          a request through the agent's open resident helper
    await alive(toolbox)            a take's look: from the host where the sandbox tells so, else answers
    await still_runs(toolbox, dir)  its sandbox running, as the backend lists it (never started anew)
    swappable(pooled)               its home can be given another in place (a fork's child)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.templates import Template
from ..errors import HelperFailed, SandboxError
from ..limits import POOL_PROBE_SECONDS
from ..record.agent_rows import AgentRecord
from ..toolbox.tools import SHELL_STATUS
from . import demand

if TYPE_CHECKING:
    from ..toolbox import Toolbox

HOLDER_PREFIX = "pool:"
"""A pooled agent's owner: this prefix and the record owner id of the process holding it."""
POOLED_BACKENDS = ("bwrap", "docker")
SWAPPABLE_BACKEND = "bwrap"
"""Where a pooled agent's overlay home is made swappable (``homes.make_home``): a fork takes
the agent and gives it the forked home in place, its sandbox and resident helper as they run."""
PROBE_RUN = "pool-probe"
Hook = Callable[["Toolbox"], Awaitable[None]]


@dataclass
class Pooled:
    """One agent held ready: its record and its toolbox (its resident helper open)."""

    record: AgentRecord
    toolbox: Toolbox
    swaps_in: int | None = None
    """The pid of the sandbox's init its home was last found swappable in (``swappable``)."""

    @property
    def id(self) -> str:
        return self.record.id


@dataclass(frozen=True)
class PoolCounts:
    """One pool, as the metrics read it."""

    ready: int
    making: int
    target: int
    hits: int
    misses: int


@dataclass
class TemplatePool:
    """The pool of one template: its ready agents, its makes under way, its demand and counts."""

    template: Template
    ready: deque[Pooled] = field(default_factory=deque)
    making: int = 0
    """Makes started, waiting for their turn or under way."""
    making_ids: set[str] = field(default_factory=set)
    """The ids of the makes under way."""
    made_at: deque[float] = field(default_factory=deque)
    """The template's makes (hits and misses), monotonic times, as far back as the target needs."""
    hits: int = 0
    misses: int = 0
    failed_at: float | None = None
    refill_from: float = 0.0
    """No make starts before this monotonic time (a fork's take: ``POOL_FORK_REFILL_PAUSE_SECONDS``)."""
    hook: Hook | None = None

    def target(self, now: float) -> int:
        settings = self.template.pool
        while self.made_at and self.made_at[0] < demand.kept_since(now, settings):
            self.made_at.popleft()
        return demand.target(self.made_at, now, settings)

    def counts(self, now: float) -> PoolCounts:
        return PoolCounts(len(self.ready), self.making, self.target(now), self.hits, self.misses)


async def answers(toolbox: Toolbox) -> bool:
    """Whether the pooled agent's sandbox answers: a request through its open resident helper
    (none open: it does not), or with ``agent.transport = "exec"`` a ``true`` in the sandbox."""
    try:
        if toolbox.transport.mode == "exec":
            done = await toolbox.sandbox.exec(["true"], timeout=POOL_PROBE_SECONDS)
            return done.exit_code == 0
        channel = toolbox.transport.channel
        if channel is None or channel.dead:
            return False
        request = toolbox.request(SHELL_STATUS.name, {}, run_id=PROBE_RUN, call_id="probe")
        envelope = await channel.call(request, POOL_PROBE_SECONDS)
        return isinstance(envelope, dict)
    except (HelperFailed, SandboxError, OSError):
        return False


async def alive(toolbox: Toolbox) -> bool:
    """Whether a pooled agent may be handed out: where its sandbox tells from the host whether
    it runs (bwrap: its init running, not being killed), that and its resident helper's channel
    open, without a request; elsewhere ``answers``."""
    runs = toolbox.sandbox.runs_now()
    if runs is None:
        return await answers(toolbox)
    if not runs or toolbox.transport.mode == "exec":
        return runs
    channel = toolbox.transport.channel
    return channel is not None and not channel.dead


async def still_runs(toolbox: Toolbox, data_dir: Path) -> bool:
    """Whether the sandbox of a pooled agent a stopped process left still runs (never started anew)."""
    kind = type(toolbox.sandbox)
    boxes = await asyncio.to_thread(kind.boxes, toolbox.settings, data_dir, chosen=False)  # type: ignore[attr-defined]
    return any(box.agent == toolbox.settings.id and _running(box.state) for box in boxes)


def _running(state: str) -> bool:
    """A box's state as bwrap ("running") and docker ("Up 3 minutes") say it."""
    return state == "running" or state.startswith("Up")


def swappable(pooled: Pooled) -> bool:
    """The pooled agent's home was made swappable and its running sandbox bound the bare point,
    so a mount on the home here appears inside (``mounts.propagates_to``): a fork may give it
    another home in place (``homes.swap_home``). Reads /proc only: both mount tables once per
    sandbox init (the pool looks when it makes the agent), then whether that init still runs."""
    from .mounts import propagates_to

    sandbox = pooled.toolbox.sandbox
    pid = sandbox.init_pid() if sandbox.name == SWAPPABLE_BACKEND else None  # type: ignore[attr-defined]
    if pid is None:
        return False
    if pooled.swaps_in != pid:
        pooled.swaps_in = pid if propagates_to(pooled.record.home, pid, sandbox.home) else None
    return pooled.swaps_in == pid
