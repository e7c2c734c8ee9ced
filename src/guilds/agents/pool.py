"""Warm pools: agents of a template made ahead, adopted when an agent is made.

    pools = agents.pools                            # one per Agents (guilds.agents.registry)
    pools.prepare_with(hook, template=None)         # before start: run in each pooled agent's sandbox
    await pools.start()                             # take back what a stopped process left, then fill
    taken = await pools.take(...)                   # Agents.make's: a pooled agent made the owner's, or None
    taken = await pools.take_swappable(...)         # a fork's: up to n whose homes it swaps in place
    pools.counts()                                  # {template: PoolCounts}: ready, making, target, hits, misses
    await pools.keep()                              # each ready agent asked whether it answers (background)
    await pools.close()                             # the pooled agents removed

A template with ``[templates.NAME.pool]`` (``PoolSettings``; bwrap or docker) has
a pool; one in kubernetes' claim mode has agent-sandbox's instead, sized by ``claims``
(``guilds.agents.claim_pools``), and none here. A pooled agent is made as every agent is (``Agents``: its id, its home,
its entry, its sandbox started), then its resident helper opened and asked whether it
answers (so a worker of it waits for the first call, ``guilds_code.resident``),
the pool's hook run in it, and recorded ``pooled``: owned by the pool
(``pool:<this process's record owner id>``), counted against the server's cap,
never an owner's (``guilds.record.agent_rows``).

- **Adopted** by ``Agents.make``: the oldest ready agent of the template is
  looked at (``pooled.alive``: on bwrap, from the host, its sandbox's init
  running and not being killed and its resident helper's channel open; on
  docker a request through its resident helper, at most POOL_PROBE_SECONDS;
  one found dead is removed and the next is tried), then made ``live``, the
  owner's, with its expiry and its making time now, in the transaction that
  checks the owner's cap. Its toolbox, its resident helper
  open, is the agent's: the first call starts nothing. A make that finds no
  ready agent is a miss and makes one as without a pool; it never waits for a
  refill under way.
- **Sized** from demand (``guilds.agents.demand``), refilled in the background
  (after a fork's take, from POOL_FORK_REFILL_PAUSE_SECONDS on):
  at most POOL_MAKES_AT_ONCE made at once across the pools, each admitted within
  the server's cap (a refill at the cap makes nothing); shrunk oldest first.
  A template whose make fails is not refilled for POOL_FAILURE_PAUSE_SECONDS.
- **Kept**: every POOL_KEEP_SECONDS (at most a quarter of the sandbox's idle
  time, and half the resident helper's sleep time) each ready agent is asked
  whether it answers; that request holds off its resident helper's idle exit and
  its sleep (``guilds_code.asleep``: a pooled agent's first call wakes nothing),
  and the sandbox's start then moves its idle clock, so the backend's idle stop
  never ends a pooled sandbox; a pool's hook (``prepare_with``) runs again, so
  what it started ahead is held awake too (within its ``keep_within``). One that does
  not answer (its sandbox killed) is removed and replaced.
- **A make at the server's cap** takes the place of this process's oldest ready
  agent (any template): that one is retired in the make's transaction and removed
  in the background, so the pools never keep an owner's make out.
- **Start**: the pooled agents a stopped process of this data folder left (its
  record owner gone) are taken back when their template still has a pool and their
  sandbox still answers; every other one of them, and those it left being made
  or retired, is removed. Pooled agents of a process still running are left alone.
- **Close** (the server's stop): the makes under way are waited for, then every
  pooled agent is removed; a server killed leaves them to the next start.

The hook (``prepare_with``) is an async callable given the pooled agent's
toolbox once its sandbox runs and its resident helper is open; it may start
something in the sandbox (``toolbox.sandbox``). It runs once for each agent the
pool makes and again on each it takes back at a start: it must bear running twice.
A hook that fails fails that pooled agent, which is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guilds_code.limits import SERVE_SLEEP_IDLE_SECONDS

from ..errors import GuildsError, SandboxError
from ..limits import (
    POOL_FAILURE_PAUSE_SECONDS,
    POOL_FORK_REFILL_PAUSE_SECONDS,
    POOL_KEEP_SECONDS,
    POOL_MAKES_AT_ONCE,
    POOL_TICK_SECONDS,
)
from ..record.agent_rows import LIVE, MAKING, POOLED, RETIRING, AgentRecord, AgentRefused
from ..record.statements import utc_now
from .claim_pools import ClaimPools, sized_by_demand
from .homes import mount_homes
from .pooled import (
    HOLDER_PREFIX,
    POOLED_BACKENDS,
    Hook,
    PoolCounts,
    Pooled,
    TemplatePool,
    alive,
    answers,
    still_runs,
    swappable,
)

if TYPE_CHECKING:
    from ..toolbox import Toolbox
    from .registry import Agents

log = logging.getLogger(__name__)


class Pools:
    """The warm pools of one ``Agents`` (see the module docstring)."""

    def __init__(self, agents: Agents):
        self.agents = agents
        self.pools = {name: TemplatePool(template) for name, template in agents.served.templates.items()
                      if template.pool.on and not sized_by_demand(template)}
        self.claims = ClaimPools(agents)
        """The warm pools of the claim-mode templates: SandboxWarmPools, started and closed with these."""
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(POOL_MAKES_AT_ONCE)
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._keep_within = float(POOL_KEEP_SECONDS)

    @property
    def holder(self) -> str:
        """The owner of this process's pooled agents: ``pool:`` and its record owner id."""
        return f"{HOLDER_PREFIX}{self.agents.store.owner.id}"

    @property
    def running(self) -> bool:
        return self._started

    def prepare_with(self, hook: Hook, template: str | None = None, *, keep_within: float | None = None) -> None:
        """Run hook in each pooled agent of template (None: of every pool) before it is ready,
        and again each time the agent is kept, at least every ``keep_within`` seconds (what
        the hook started ahead must not fall asleep before a make takes the agent)."""
        if self._started:
            raise RuntimeError("prepare_with: the pools have started; set the hook before start()")
        for name, pool in self.pools.items():
            if template is None or name == template:
                pool.hook = hook
        if keep_within is not None:
            self._keep_within = min(self._keep_within, keep_within)

    async def start(self) -> None:
        """Take back what a stopped process left, then fill the pools in the background."""
        await self.claims.start()
        if self._started or not self.pools:
            return
        self._started = True
        await self._take_back()
        self._loop_task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop filling, wait for the makes under way, remove every pooled agent."""
        await self.claims.close()
        if not self._started:
            return
        self._started = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        held = [pooled for pool in self.pools.values() for pooled in pool.ready]
        for pool in self.pools.values():
            pool.ready.clear()
        await asyncio.gather(*(self._remove(pooled) for pooled in held))

    def counts(self) -> dict[str, PoolCounts]:
        now = time.monotonic()
        return {name: pool.counts(now) for name, pool in self.pools.items()}

    # --- adoption --------------------------------------------------------------
    async def take(self, template: str, owner: str, expires_in: float | None,
                   max_per_owner: int) -> tuple[AgentRecord, Toolbox] | None:
        """A ready agent of template made the owner's (live, its expiry from now), or None (a
        miss, counted); AgentRefused past the owner's cap, the agent left in the pool."""
        pool = self.pools.get(template) if self._started else None
        if pool is None:
            return None
        pool.made_at.append(time.monotonic())
        self._wake.set()  # the refill: started by the background, after this make's own steps
        taken = await self._take_ready(pool, owner, expires_in, max_per_owner)
        if taken is None:
            pool.misses += 1
        else:
            pool.hits += 1
        return taken

    async def take_swappable(self, template: str, n: int, owner: str, expires_in: float | None,
                             max_per_owner: int) -> list[tuple[AgentRecord, Toolbox]]:
        """Up to n ready agents of template whose homes can be swapped in place (``swappable``),
        oldest first, each made the owner's (live, its expiry from now) as ``take`` makes one; a
        fork gives them its children's home. Each child counts as a make of the template (the
        pool's demand); those taken are hits, the rest misses. They are made the owner's in one
        transaction; past the owner's cap it stops, leaving the rest in the pool (the fork's own
        admission then refuses past the cap)."""
        pool = self.pools.get(template) if self._started else None
        if pool is None:
            return []
        pool.made_at.extend([time.monotonic()] * n)
        pool.refill_from = time.monotonic() + POOL_FORK_REFILL_PAUSE_SECONDS
        candidates: list[Pooled] = []
        passed: list[Pooled] = []
        try:
            while pool.ready and len(candidates) < n:
                pooled = pool.ready.popleft()
                if not swappable(pooled):
                    passed.append(pooled)
                elif await alive(pooled.toolbox):
                    candidates.append(pooled)
                else:
                    self._later(self._remove(pooled))
        except BaseException:  # cancelled while looking: every one looked at stays in the pool
            pool.ready.extendleft(reversed(passed + candidates))
            raise
        if not candidates:
            pool.ready.extendleft(reversed(passed))
            pool.misses += n
            return []
        now = utc_now()
        change: dict[str, Any] = {"owner": owner, "created_at": now,
                                  "expires_at": None if expires_in is None else now + timedelta(seconds=expires_in)}
        try:
            adopted, looked = await self.agents.store.adopt_agents([p.id for p in candidates], change,
                                                                   max_per_owner=max_per_owner, n=n)
        except AgentRefused:
            adopted, looked = [], 0
        except BaseException:  # the record failed: nothing was taken
            pool.ready.extendleft(reversed(passed + candidates))
            raise
        ids = set(adopted)
        taken = [p for p in candidates[:looked] if p.id in ids]
        for pooled in candidates[:looked]:
            if pooled.id not in ids:  # retired meanwhile by a make at the server's cap
                self._later(self._remove(pooled))
        pool.ready.extendleft(reversed(passed + candidates[looked:]))
        pool.hits += len(taken)
        pool.misses += n - len(taken)
        return [(replace(p.record, **change, status=LIVE), p.toolbox) for p in taken]

    async def _take_ready(self, pool: TemplatePool, owner: str, expires_in: float | None,
                          max_per_owner: int) -> tuple[AgentRecord, Toolbox] | None:
        while pool.ready:
            pooled = pool.ready.popleft()
            if not await alive(pooled.toolbox):
                self._later(self._remove(pooled))
                continue
            now = utc_now()
            change: dict[str, Any] = {"owner": owner, "created_at": now,
                      "expires_at": None if expires_in is None else now + timedelta(seconds=expires_in)}
            try:
                taken = await self.agents.store.adopt_agent([pooled.id], change, max_per_owner=max_per_owner)
            except BaseException:
                pool.ready.appendleft(pooled)
                raise
            if taken is None:  # retired meanwhile by a make at the server's cap
                self._later(self._remove(pooled))
                continue
            return replace(pooled.record, **change, status=LIVE), pooled.toolbox
        return None

    def evictable(self) -> list[str]:
        """The agents a make at the server's cap may retire: the ready ones, oldest first, then
        those being made."""
        ready = sorted((p for pool in self.pools.values() for p in pool.ready), key=lambda p: p.record.created_at)
        return [pooled.id for pooled in ready] + [i for pool in self.pools.values() for i in pool.making_ids]

    def retired(self, agent_id: str) -> None:
        """A make at the server's cap retired this ready agent: remove it in the background."""
        for pool in self.pools.values():
            for pooled in list(pool.ready):
                if pooled.id == agent_id:
                    pool.ready.remove(pooled)
                    self._later(self._remove(pooled))
                    self._wake.set()
                    return

    # --- the background: sizing, refilling, keeping ---------------------------
    async def _run(self) -> None:
        kept_at = time.monotonic()
        while self._started:
            self._wake.clear()
            now = time.monotonic()
            for pool in self.pools.values():
                self._size(pool, now)
            if now - kept_at >= self._keep_every():
                kept_at = now
                self._later(self.keep())
            waking = asyncio.ensure_future(self._wake.wait())
            try:  # not wait_for: on 3.11 it can swallow a cancel that meets the wake
                await asyncio.wait({waking}, timeout=POOL_TICK_SECONDS)
            finally:
                waking.cancel()

    def _keep_every(self) -> float:
        idle = min((getattr(p.toolbox.sandbox, "idle_seconds", None) or POOL_KEEP_SECONDS
                    for pool in self.pools.values() for p in pool.ready), default=POOL_KEEP_SECONDS)
        # its resident helper never sleeps, nor what the hook started ahead
        return min(self._keep_within, idle / 4, SERVE_SLEEP_IDLE_SECONDS / 2)

    def _size(self, pool: TemplatePool, now: float) -> None:
        """Start the makes that bring the pool to its target, or retire the ready past it."""
        goal = pool.target(now)
        have = len(pool.ready) + pool.making
        if have < goal:
            if pool.failed_at is not None and now - pool.failed_at < POOL_FAILURE_PAUSE_SECONDS:
                return
            if now < pool.refill_from:
                return
            for _ in range(goal - have):
                pool.making += 1
                self._later(self._refill(pool))
        while len(pool.ready) + pool.making > goal and pool.ready:
            self._later(self._remove(pool.ready.popleft()))

    async def _refill(self, pool: TemplatePool) -> None:
        try:
            async with self._slots:
                if not self._started or len(pool.ready) + pool.making > pool.target(time.monotonic()):
                    return  # the target fell while this make waited for its turn
                agent_id = self.agents.new_id(pool.template.name)
                pool.making_ids.add(agent_id)
                try:
                    record, toolbox = await self.agents.make_pooled(pool.template, agent_id, self.holder,
                                                                    self._preparer(pool))
                finally:
                    pool.making_ids.discard(agent_id)
        except AgentRefused:
            return  # the server's cap: the next round tries again
        except (GuildsError, OSError) as exc:
            pool.failed_at = time.monotonic()
            log.warning("pool %s: an agent could not be made ahead: %s", pool.template.name, exc)
            return
        finally:
            pool.making -= 1
        pool.failed_at = None
        await self._ready(pool, Pooled(record, toolbox))

    @staticmethod
    async def _ready(pool: TemplatePool, pooled: Pooled) -> None:
        """pooled made ready, whether a fork may swap its home looked at now (``swappable``)."""
        await asyncio.to_thread(swappable, pooled)
        pool.ready.append(pooled)

    def _preparer(self, pool: TemplatePool) -> Hook:
        async def prepare(toolbox: Toolbox) -> None:
            await toolbox.warm()
            if not await answers(toolbox):  # and so its helper has a worker waiting: a first call forks none
                raise SandboxError("its resident helper does not answer")
            if pool.hook is not None:
                await pool.hook(toolbox)
        return prepare

    async def keep(self) -> None:
        """Ask each ready agent whether it still answers, and hold off its idle stops (the
        background does so every POOL_KEEP_SECONDS); the ones that do not are removed."""
        for pool in self.pools.values():
            for pooled in list(pool.ready):
                await self._keep(pool, pooled)

    async def _keep(self, pool: TemplatePool, pooled: Pooled) -> None:
        """Ask it whether it answers, then move its sandbox's idle clock; remove it if it does not."""
        try:
            alive = await answers(pooled.toolbox)
            if alive:
                await pooled.toolbox.sandbox.start()
                if pool.hook is not None:
                    await pool.hook(pooled.toolbox)
        except (GuildsError, OSError):
            alive = False
        if not alive and pooled in pool.ready:
            pool.ready.remove(pooled)
            log.warning("pool %s: agent %s no longer answers: removed", pool.template.name, pooled.id)
            self._later(self._remove(pooled))
            self._wake.set()

    def _later(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove(self, pooled: Pooled) -> None:
        await self._remove_record(pooled.record, pooled.toolbox)

    async def _remove_record(self, record: AgentRecord, toolbox: Toolbox | None = None) -> None:
        try:
            await self.agents.remove_pooled(record, toolbox)
        except (GuildsError, OSError) as exc:
            log.warning("pool: agent %s not removed yet: %s", record.id, exc)

    # --- a start: what a stopped process left ----------------------------------
    async def _take_back(self) -> None:
        store = self.agents.store
        alive = {f"{HOLDER_PREFIX}{owner_id}" for owner_id in await store.owner_ids()}
        homes = self.agents.home_of("x").parent
        left = [record for record in await store.agents(statuses=(POOLED, MAKING, RETIRING))
                if record.owner.startswith(HOLDER_PREFIX) and record.owner not in alive
                and Path(record.home).parent == homes]
        await asyncio.gather(*(self._take_back_one(record) for record in left))

    async def _take_back_one(self, record: AgentRecord) -> None:
        pool = self.pools.get(record.template)
        if record.status == POOLED and pool is not None and \
                await self.agents.store.hand_over_agent(record.id, record.owner, self.holder):
            record = replace(record, owner=self.holder)
            toolbox = self.agents.toolbox_of(record)
            await asyncio.to_thread(mount_homes, self.agents.data_dir, [Path(record.home)])
            if toolbox.sandbox.name in POOLED_BACKENDS and await still_runs(toolbox, self.agents.data_dir):
                try:
                    await self._preparer(pool)(toolbox)
                    if await answers(toolbox):
                        await self._ready(pool, Pooled(record, toolbox))
                        return
                except (GuildsError, OSError) as exc:
                    log.warning("pool %s: agent %s not taken back: %s", pool.template.name, record.id, exc)
            await self._remove_record(record, toolbox)
            return
        await self._remove_record(record)
