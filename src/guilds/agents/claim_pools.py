"""The warm pools of the templates in kubernetes' claim mode: agent-sandbox's SandboxWarmPool,
its replicas set from the template's demand.

    claims = ClaimPools(agents)     # the claim-mode templates with [templates.NAME.pool]
    await claims.start()            # each template's SandboxTemplate and warm pool made, at its target
    claims.made(template)           # a make of the template (Agents.make): the demand
    claims.targets()                # {template: the replicas last set}
    claims.counts()                 # {template: ClaimPoolCounts}: as last set and read (/metrics)
    await claims.close()            # each warm pool set to 0 replicas (its waiting sandboxes deleted)

An agent made on demand from a template whose sandbox is kubernetes in claim mode is a
SandboxClaim of its own on that template's SandboxWarmPool (``kube_claims``): the
controller hands it one of the pool's ready sandboxes, or makes one when none is ready,
and refills the pool to its replicas. Nothing is made ahead on this machine
(``guilds.agents.pool`` leaves these templates alone): the pool's replicas are the
template's target (``guilds.agents.demand``: ``spare`` plus the makes of the window, at
most ``max``, falling only after the cool-down), as an autoscaler sets a warm pool's
replicas from its claim rate. They are set at the start, at once after a make that
raises them, when the target falls, and again every POOL_KEEP_SECONDS (a pool deleted
behind the server is made again). A pool the cluster refuses to set is logged and tried
again POOL_FAILURE_PAUSE_SECONDS later. Without the pools started (``guilds.open`` without ``pool``),
a make finds the pool as it is, or makes it at ``spare``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from ..config.templates import Template, in_claim_mode
from ..errors import GuildsError
from ..limits import POOL_FAILURE_PAUSE_SECONDS, POOL_KEEP_SECONDS, POOL_TICK_SECONDS
from .pooled import TemplatePool

if TYPE_CHECKING:
    from ..sandbox.kubernetes.kube_claims import KubeClaimSandbox
    from .registry import Agents

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ClaimPoolCounts:
    """One template's SandboxWarmPool as this server last set and read it (``guilds.observe.metrics``)."""

    warm_pool: str
    """The SandboxWarmPool's name."""
    target: int
    """The replicas last set."""
    ready: int
    """The pool's ready sandboxes (``status.readyReplicas``), as read at that setting."""
    making: int
    """Its sandboxes not ready yet (``status.replicas`` less the ready), as read then."""
    failures: int
    """The settings the cluster refused since the start."""


def sized_by_demand(template: Template) -> bool:
    """Whether the template's warm pool is a SandboxWarmPool this server sizes."""
    return template.pool.on and in_claim_mode(template.settings)


class ClaimPools:
    """The SandboxWarmPools of one ``Agents``' claim-mode templates (see the module docstring)."""

    def __init__(self, agents: Agents):
        self.data_dir = agents.data_dir
        self.pools = {name: TemplatePool(template) for name, template in agents.served.templates.items()
                      if sized_by_demand(template)}
        self._set: dict[str, int] = {}
        """The replicas last set, by template."""
        self._counts: dict[str, ClaimPoolCounts] = {}
        """Each template's pool as last set and read (kept through a refusal)."""
        self._failures: dict[str, int] = dict.fromkeys(self.pools, 0)
        self._boxes: dict[str, KubeClaimSandbox] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def made(self, template: str) -> None:
        """A make of template: its demand rises (nothing for a template not sized here)."""
        pool = self.pools.get(template)
        if pool is not None:
            pool.made_at.append(time.monotonic())
            self._wake.set()

    def targets(self) -> dict[str, int]:
        return dict(self._set)

    def counts(self) -> dict[str, ClaimPoolCounts]:
        """The pools set at least once since the start, as last set and read."""
        return dict(self._counts)

    async def start(self) -> None:
        if self._task is not None or not self.pools:
            return
        await self._size_all(time.monotonic(), again=True)
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop sizing; each pool set to 0 replicas (the claimed sandboxes stay their agents')."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.gather(*(self._size(name, 0) for name in self.pools))

    async def _run(self) -> None:
        again_at = time.monotonic() + POOL_KEEP_SECONDS
        while True:
            self._wake.clear()
            now = time.monotonic()
            again = now >= again_at
            if again:
                again_at = now + POOL_KEEP_SECONDS
            await self._size_all(now, again=again)
            waking = asyncio.ensure_future(self._wake.wait())
            try:  # not wait_for: on 3.11 it can swallow a cancel that meets the wake
                await asyncio.wait({waking}, timeout=POOL_TICK_SECONDS)
            finally:
                waking.cancel()

    async def _size_all(self, now: float, *, again: bool) -> None:
        """Each pool whose target moved (again: every pool) set to its target, but one that
        failed within POOL_FAILURE_PAUSE_SECONDS."""
        due = {name: pool.target(now) for name, pool in self.pools.items()
               if pool.failed_at is None or now - pool.failed_at >= POOL_FAILURE_PAUSE_SECONDS}
        await asyncio.gather(*(self._size(name, goal) for name, goal in due.items()
                               if again or self._set.get(name) != goal))

    async def _size(self, name: str, replicas: int) -> None:
        try:
            pool, status = await self._box(name).size_pool(replicas)
        except (GuildsError, OSError) as exc:
            self._set.pop(name, None)
            self.pools[name].failed_at = time.monotonic()
            self._failures[name] += 1
            if name in self._counts:
                self._counts[name] = dataclasses.replace(self._counts[name], failures=self._failures[name])
            log.warning("pool %s: its warm pool not set to %d replicas: %s", name, replicas, exc)
            return
        if self._set.get(name) != replicas:
            log.info("pool %s: warm pool %s set to %d replicas", name, pool, replicas)
        self._set[name], self.pools[name].failed_at = replicas, None
        ready = int(status.get("readyReplicas") or 0)  # a count of 0 is left out of the status
        making = max(0, int(status.get("replicas") or 0) - ready)
        self._counts[name] = ClaimPoolCounts(pool, replicas, ready, making, self._failures[name])

    def _box(self, name: str) -> KubeClaimSandbox:
        """The template's own sandbox object, which speaks for its template and pool (never claims)."""
        if name not in self._boxes:
            from ..sandbox.kubernetes.kube_claims import KubeClaimSandbox

            template = self.pools[name].template
            self._boxes[name] = KubeClaimSandbox(template.for_agent(name, template.home), self.data_dir)
        return self._boxes[name]
