"""The agents one server makes on demand from its templates, and removes.

    agents = await Agents.open(served, data_dir, store)   # the expired ones reaped first
    made = await agents.make("python", owner="alice", expires_in=600)
    toolbox = await agents.toolbox(made.id)               # a live agent's tools, also after a restart
    await agents.live(owner="alice")
    await agents.expire_in(made.id, 60)                   # a new expiry, from now (None: never)
    await agents.remove(made.id)                          # what was removed, one line each

An agent made on demand has an id of its own (``<template>-<12 hex>``), a home of
its own (``<data folder>/agent-homes/<id>``, the template's, copy-on-write:
``guilds.agents.homes``; in kubernetes' claim mode its claimed pod's, at the
template's home path, and nothing of it on this machine), a uid of its own on bwrap under a root orchestrator
(derived from its id, recorded in its row: an id whose uid a running agent or
the settings file's own agent holds is drawn again), a sandbox and an egress proxy of its own, and a row in
the run record (``guilds.record.agent_rows``) with its template, its owner and
its expiry. It is made whole or not at all: the record's row first (within the
caps), then the home, the entry that hides it from every other sandbox of the
data folder (``guilds.config.agents``), then its sandbox, started; a failure
at any step undoes every step before it, and the error is raised.

Removing it stops and removes its sandbox, its egress proxy's files, its home
and its entry, and records it removed (its row and its runs stay, for the
record). The record is what a restarted server reads: the live agents are found
again there, and ``reap`` removes those whose expiry has passed, and those a
stopped server left half made.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import shutil
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoints.point_store import CheckpointStore
from ..config import agents as known_agents
from ..config.templates import DEFAULT_TEMPLATE, Served, Template, in_claim_mode
from ..config.uids import agent_uid
from ..errors import BadInput, GuildsError, SandboxError
from ..limits import AGENT_MAKING_STALE_SECONDS, AGENT_MAX_EXPIRY_SECONDS
from ..record.agent_rows import LIVE, MAKING, POOLED, REMOVED, RETIRING, AgentRecord, AgentRefused, UidTaken
from ..record.statements import utc_now
from .homes import make_home, mount_home, mount_homes, remove_home
from .pool import Pools
from .pooled import HOLDER_PREFIX, POOLED_BACKENDS, SWAPPABLE_BACKEND

if TYPE_CHECKING:
    from ..config.settings import AgentSettings
    from ..record.store import Store
    from ..sandbox import Sandbox
    from ..toolbox import Toolbox
    from ..toolbox.observer import Observer

log = logging.getLogger(__name__)
Adjust = Callable[["AgentSettings"], "AgentSettings"]
"""Changes a new agent's settings (``Agents.make``'s ``adjust``)."""
HOMES_FOLDER = "agent-homes"
"""Under the data folder: one home per agent made on demand, named by its id."""
DEFAULT_OWNER = "local"
"""The owner of an agent made through the Python API or the CLI without one named."""
ID_HEX_CHARS = 12
UID_DRAWS = 16
"""Ids drawn for one make until one gives a uid no running agent holds (one in 10^5 collides at 1,000 agents)."""
MAX_OWNER_CHARS = 128


def new_agent_id(template: str) -> str:
    """A fresh id: the template's name, '-', 12 hex digits (cut to fit 128 characters)."""
    return f"{template[:128 - ID_HEX_CHARS - 1]}-{secrets.token_hex(ID_HEX_CHARS // 2)}"


def checked_owner(owner: str) -> str:
    """An owner name: 1 to 128 printable characters, not the warm pool's (``pool:``); BadInput otherwise."""
    if not isinstance(owner, str) or not 0 < len(owner) <= MAX_OWNER_CHARS or not owner.isprintable():
        raise BadInput(f"owner: 1 to {MAX_OWNER_CHARS} printable characters, got {str(owner)[:40]!r}")
    if owner.startswith(HOLDER_PREFIX):
        raise BadInput(f"owner: {HOLDER_PREFIX!r} begins the names of the warm pools' holders, got {owner[:40]!r}")
    return owner


def checked_expiry(expires_in: float | None) -> float | None:
    """Seconds until the agent expires: None (never), or more than 0 and at most a year."""
    if expires_in is None:
        return None
    if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)) \
            or not 0 < expires_in <= AGENT_MAX_EXPIRY_SECONDS:
        raise BadInput(f"expires_in: seconds, more than 0 and at most {AGENT_MAX_EXPIRY_SECONDS}, got {expires_in!r}")
    return float(expires_in)


def no_such_agent(agent_id: str) -> BadInput:
    """The one answer for an agent that is not there and for another owner's: a key sees only its own."""
    return BadInput(f"agent {str(agent_id)[:140]!r}: no such agent")


class Agents:
    """The agents made on demand of one server: made, found, listed (live), removed, reaped."""

    def __init__(self, served: Served, data_dir: Path, store: Store, observer: Observer | None = None):
        from ..toolbox.observer import NO_OBSERVER

        self.served = served
        self.observer = observer or NO_OBSERVER
        """Hears of the calls and sandboxes of these agents' toolboxes (``guilds.toolbox.observer``)."""
        self.data_dir = Path(data_dir)
        self.store = store
        self._toolboxes: dict[str, Toolbox] = {}
        self._removing: dict[str, asyncio.Future[list[str]]] = {}
        self._teardowns = asyncio.Lock()
        """The teardowns after a ``retire`` run one at a time: they never crowd out makes."""
        self.pools = Pools(self)
        """The warm pools of the templates that have one; they run once ``pools.start()`` is awaited."""

    @classmethod
    async def open(cls, served: Served, data_dir: Path, store: Store, observer: Observer | None = None) -> Agents:
        """The agents of the record, the expired and the half-made ones reaped first, then
        the live ones' overlay homes mounted where they are not (after a reboot)."""
        agents = cls(served, data_dir, store, observer)
        await agents.reap(retired=True)
        homes = [Path(r.home) for r in await agents.live() if not in_claim_mode(agents.settings_of(r))]
        await asyncio.to_thread(mount_homes, agents.data_dir, homes)
        return agents

    async def close(self) -> None:
        """Remove the pooled agents (``Pools.close``), end the resident helpers this process
        opened (the live agents' sandboxes stay to their idle stop)."""
        await self.pools.close()
        with contextlib.suppress(GuildsError, OSError):
            await asyncio.gather(*self._removing.values())  # the retired ones' teardowns finish
        toolboxes, self._toolboxes = self._toolboxes, {}
        for toolbox in toolboxes.values():
            with contextlib.suppress(GuildsError, OSError):
                await toolbox.close()

    new_id = staticmethod(new_agent_id)

    def home_of(self, agent_id: str) -> Path:
        return self.data_dir / HOMES_FOLDER / agent_id

    async def make(self, template: str = DEFAULT_TEMPLATE, *, owner: str = DEFAULT_OWNER,
                   expires_in: float | None = None, adjust: Adjust | None = None) -> AgentRecord:
        """A new agent of the template, its sandbox started: one of its warm pool's when one is
        ready (``guilds.agents.pool``), else made now. ConfigError for a template not served,
        ``AgentRefused`` past a cap, the failure itself (with nothing left) otherwise.
        adjust: the agent's settings changed before its sandbox is made (a narrower network:
        ``guilds.fronts.e2b.network_options``; never a pooled agent, made with the template's);
        this process keeps them for the agent's life."""
        made_from = self.served.template(template)
        owner, expiry = checked_owner(owner), checked_expiry(expires_in)
        self.pools.claims.made(made_from.name)
        taken = None
        if adjust is None:
            taken = await self.pools.take(made_from.name, owner, expiry, self.served.caps.max_per_owner)
        if taken is None:
            expires_at = None if expiry is None else utc_now() + timedelta(seconds=expiry)
            taken = await self._made(made_from, owner, expires_at, evictable=self.pools.evictable(), adjust=adjust)
        record, toolbox = taken
        self._toolboxes[record.id] = toolbox
        return record

    async def make_pooled(self, made_from: Template, agent_id: str, holder: str,
                          prepare: Callable[[Toolbox], Awaitable[None]]) -> tuple[AgentRecord, Toolbox]:
        """An agent of the template made ahead for its pool: owned by holder, counted against the
        server's cap only, ``prepare``d (its resident helper opened, the pool's hook), then ``pooled``;
        AgentRefused when a make at the server's cap retired it meanwhile (nothing of it stays)."""
        return await self._made(made_from, holder, None, then=POOLED, prepare=prepare, agent_id=agent_id)

    async def _made(self, made_from: Template, owner: str, expires_at: datetime | None, *,
                    evictable: Sequence[str] = (), then: str = LIVE, agent_id: str | None = None,
                    adjust: Adjust | None = None,
                    prepare: Callable[[Toolbox], Awaitable[None]] | None = None) -> tuple[AgentRecord, Toolbox]:
        """The row within the caps and with a uid of its own (another id drawn while the one
        drawn gives a uid taken, ``UidTaken`` for an id given), then the agent built
        (``_build``), then its row ``then``."""
        for _ in range(UID_DRAWS):
            try:
                return await self._made_as(agent_id or new_agent_id(made_from.name), made_from, owner, expires_at,
                                           evictable=evictable, then=then, adjust=adjust, prepare=prepare)
            except UidTaken:
                if agent_id is not None:
                    raise
        raise UidTaken(f"template {made_from.name}: no id drawn gave a uid of its own in {UID_DRAWS} draws")

    def uid_of(self, agent_id: str) -> int:
        """The uid an agent made on demand with this id runs as; UidTaken when it is the settings
        file's own agent's (the default template's), never an agent's made on demand."""
        uid, own = agent_uid(agent_id), self.served.templates.get(DEFAULT_TEMPLATE)
        if own is not None and uid == (own.settings.bwrap.uid or agent_uid(own.settings.id)):
            raise UidTaken(f"uid {uid}: the settings file's own agent runs as it")
        return uid

    async def _made_as(self, agent_id: str, made_from: Template, owner: str, expires_at: datetime | None, *,
                       evictable: Sequence[str], then: str, adjust: Adjust | None,
                       prepare: Callable[[Toolbox], Awaitable[None]] | None) -> tuple[AgentRecord, Toolbox]:
        from ..sandbox import get_sandbox, remove_egress_files

        uid = self.uid_of(agent_id)
        settings = made_from.for_agent(agent_id, self.home_of(agent_id))
        if adjust is not None:
            settings = adjust(settings)
        sandbox = get_sandbox(settings, self.data_dir)
        row: dict[str, Any] = {"id": agent_id, "template": made_from.name, "owner": owner, "sandbox": sandbox.name,
                               "home": str(settings.home), "created_at": utc_now(), "expires_at": expires_at,
                               "uid": uid}
        caps = self.served.caps
        try:
            if then == POOLED and sandbox.name not in POOLED_BACKENDS:
                raise SandboxError(f"template {made_from.name}: a warm pool runs on bwrap or docker, "
                                   f"not {sandbox.name}")
            retired = await self.store.admit_agent(row, max_total=caps.max, evictable=evictable,
                                                   max_per_owner=caps.max if then == POOLED else caps.max_per_owner)
        except BaseException:  # refused: the egress folder its sandbox's object made goes too
            remove_egress_files(self.data_dir, agent_id)
            raise
        if retired is not None:
            self.pools.retired(retired)
        try:
            toolbox = await self._build(made_from, settings, sandbox, started=prepare is None,
                                        swappable=then == POOLED and sandbox.name == SWAPPABLE_BACKEND)
            if prepare is not None:
                await prepare(toolbox)
            if not await self.store.mark_agent(agent_id, then, only_from=(MAKING,)):
                raise AgentRefused(f"agent {agent_id}: retired while it was made, for a make at the server's cap")
        except BaseException:
            await asyncio.shield(self._undo(settings, sandbox))
            raise
        return AgentRecord(**{**row, "status": then}), toolbox

    async def _build(self, made_from: Template, settings: AgentSettings, sandbox: Sandbox, *,
                     started: bool = True, swappable: bool = False) -> Toolbox:
        """The home made, the agent remembered, its sandbox started (``started``; else the
        caller starts it through the toolbox): its toolbox. In claim mode the home is the pod's:
        nothing is made here. Checkpoints per call where the backend keeps none are refused first.
        swappable (a pooled agent on bwrap): an overlay home is made swappable (``make_home``),
        its sandbox started on the bare point and the overlay mounted after, so that a fork can
        give the agent another home in place (``swap_home``)."""
        from ..sandbox import refuse_unkept_checkpoints

        await refuse_unkept_checkpoints(settings)
        if not in_claim_mode(settings):
            (self.data_dir / HOMES_FOLDER).mkdir(mode=0o700, exist_ok=True)
            swappable = await asyncio.to_thread(self._home_remembered, made_from, settings, sandbox, swappable)
        if swappable:
            await sandbox.start()
            await asyncio.to_thread(mount_home, self.data_dir, settings.home)
        elif started:
            await sandbox.start()
        return self.toolbox_for(settings, sandbox)

    def _home_remembered(self, made_from: Template, settings: AgentSettings, sandbox: Sandbox,
                         swappable: bool = False) -> bool:
        """The agent's home made from its template's, then its entry among the known agents (in a
        thread: a burst of makes would otherwise queue on the event loop for their file work);
        True when the home was made swappable."""
        made = make_home(made_from.home, settings.home, self.data_dir, sandbox.home_owner, swappable=swappable)
        known_agents.remember(self.data_dir, settings, None)
        return made

    def toolbox_for(self, settings: AgentSettings, sandbox: Sandbox) -> Toolbox:
        """An agent's toolbox, with its checkpoints and call gate where its home is on this machine."""
        from ..config.settings import CHECKPOINT_SANDBOXES
        from ..toolbox import Toolbox
        from ..toolbox.checkpointing import AgentCheckpoints

        toolbox = Toolbox(settings, sandbox, self.store, observer=self.observer)
        if settings.sandbox in CHECKPOINT_SANDBOXES:
            toolbox.checkpoints = AgentCheckpoints(toolbox, self.data_dir)
        return toolbox

    async def _undo(self, settings: AgentSettings, sandbox: Sandbox) -> None:
        """Everything of a make that failed, gone: nothing of it stays, its row neither."""
        with contextlib.suppress(GuildsError, OSError):
            await self._remove_files(settings, sandbox)
        await self.store.forget_agent(settings.id)

    async def _remove_files(self, settings: AgentSettings, sandbox: Sandbox) -> list[str]:
        """The agent's sandbox, egress files, home and entry removed; each named. A sandbox
        that cannot be removed (its engine gone) is raised once the rest is removed."""
        from ..sandbox import remove_egress_files

        failed: GuildsError | OSError | None = None
        try:
            gone = [f"the {sandbox.name} sandbox of agent {settings.id}", *await sandbox.remove()]
        except (GuildsError, OSError) as exc:
            gone, failed = [], exc
        gone += remove_egress_files(self.data_dir, settings.id)
        if not in_claim_mode(settings) and await asyncio.to_thread(remove_home, settings.home, self.data_dir):
            gone.append(f"its home {settings.home}")
        points = CheckpointStore.of_agent(self.data_dir, settings.id, settings.home).root
        if points.is_dir():  # its checkpoints and call gate (guilds.toolbox.checkpointing)
            await asyncio.to_thread(shutil.rmtree, points)
            gone.append(f"its checkpoints {points}")
        entry = known_agents.forget(self.data_dir, settings.id)
        if entry is not None:
            gone.append(entry)
        if failed is not None:
            raise failed
        return gone

    async def _recorded(self, agent_id: str, owner: str | None, statuses: tuple[str, ...] = (LIVE,)) -> AgentRecord:
        found = await self.store.agents(agent_id=str(agent_id), owner=owner, statuses=statuses)
        if not found:
            raise no_such_agent(agent_id)
        return found[0]

    def settings_of(self, record: AgentRecord) -> AgentSettings:
        """A recorded agent's settings: its template's (the default template's when that is no
        longer served), its id, home and the sandbox it was made on."""
        made_from = self.served.templates.get(record.template) or self.served.template(DEFAULT_TEMPLATE)
        return dataclasses.replace(made_from.for_agent(record.id, Path(record.home)), sandbox=record.sandbox)

    async def toolbox(self, agent_id: str, *, owner: str | None = None) -> Toolbox:
        """A live agent's toolbox (made from the record when this process did not make it)."""
        if agent_id in self._toolboxes and owner is None:
            return self._toolboxes[agent_id]
        record = await self._recorded(agent_id, owner)
        if record.id not in self._toolboxes:
            self._toolboxes[record.id] = self.toolbox_of(record)
        return self._toolboxes[record.id]

    def toolbox_of(self, record: AgentRecord) -> Toolbox:
        """A new toolbox of a recorded agent (its sandbox not started by this process)."""
        from ..sandbox import get_sandbox

        settings = self.settings_of(record)
        return self.toolbox_for(settings, get_sandbox(settings, self.data_dir))

    async def expire_in(self, agent_id: str, expires_in: float | None, *, owner: str | None = None) -> AgentRecord:
        """Give a live agent (of owner, when given) a new expiry, counted from now (None: never)."""
        record = await self._recorded(agent_id, owner)
        seconds = checked_expiry(expires_in)
        expires_at = None if seconds is None else utc_now() + timedelta(seconds=seconds)
        if not await self.store.expire_agent(record.id, expires_at):
            raise no_such_agent(agent_id)  # removed meanwhile
        return dataclasses.replace(record, expires_at=expires_at)

    async def live(self, *, owner: str | None = None) -> list[AgentRecord]:
        """The live agents (of one owner when given), oldest first."""
        return await self.store.agents(owner=owner, statuses=(LIVE,))

    async def remove(self, agent_id: str, *, owner: str | None = None) -> list[str]:
        """Remove a live agent (of owner, when given) and everything of it; what was removed."""
        return await self._remove(await self._recorded(agent_id, owner))

    async def retire(self, agent_id: str, *, owner: str | None = None) -> None:
        """Remove a live agent (of owner, when given), answered once nothing of it is reachable:
        its row ``retiring`` (no longer live: not found, not listed, not counted), its sandbox
        stopped (bwrap: its init SIGKILLed, the kernel ends every process of it). Its files
        are removed after, one retired agent at a time, and its row marked ``removed`` then;
        a process stopped before that leaves the row ``retiring``, and the next ``open``
        removes what is left of it."""
        record = await self._recorded(agent_id, owner)
        if not await self.store.mark_agent(record.id, RETIRING, only_from=(LIVE,)):
            raise no_such_agent(agent_id)  # removed meanwhile
        toolbox = self._toolboxes.pop(record.id, None)
        sandbox = toolbox.sandbox if toolbox is not None else self.toolbox_of(record).sandbox
        try:
            await sandbox.stop()
        except (GuildsError, OSError) as exc:  # its engine out of reach: the teardown tries again
            log.warning("agent %s: its sandbox not stopped yet: %s", record.id, exc)
        torn = self._removing[record.id] = asyncio.ensure_future(self._teardown(record, toolbox))
        torn.add_done_callback(lambda _: self._removing.pop(record.id, None))

    async def _teardown(self, record: AgentRecord, toolbox: Toolbox | None) -> list[str]:
        async with self._teardowns:
            try:
                return await self._remove_now(record, toolbox)
            except (GuildsError, OSError) as exc:  # left retiring: the next open removes it
                log.warning("agent %s: retired, not removed yet: %s", record.id, exc)
                return []

    async def remove_pooled(self, record: AgentRecord, toolbox: Toolbox | None) -> list[str]:
        """Remove an agent of a warm pool (pooled, being made or retired: never one adopted)."""
        return await self._remove(record, toolbox)

    async def _remove(self, record: AgentRecord, toolbox: Toolbox | None = None) -> list[str]:
        """One removal of an agent at a time: a second (the reaper's, a kill's) waits for the first.
        toolbox: the agent's, when this process holds it elsewhere than among the live (a pool's)."""
        removing = self._removing.get(record.id)
        if removing is None:
            removing = self._removing[record.id] = asyncio.ensure_future(self._remove_now(record, toolbox))
            removing.add_done_callback(lambda _: self._removing.pop(record.id, None))
        return await asyncio.shield(removing)

    async def _remove_now(self, record: AgentRecord, toolbox: Toolbox | None = None) -> list[str]:
        from ..sandbox import get_sandbox

        toolbox = self._toolboxes.pop(record.id, None) or toolbox
        if toolbox is not None:
            with contextlib.suppress(GuildsError, OSError):
                await toolbox.close()
        settings = toolbox.settings if toolbox is not None else self.settings_of(record)
        sandbox = toolbox.sandbox if toolbox is not None else get_sandbox(settings, self.data_dir)
        gone = await self._remove_files(settings, sandbox)
        self.observer.sandbox_removed(record.id, sandbox.name)
        await self.store.mark_agent(record.id, REMOVED, utc_now())
        return gone

    async def reap(self, now: datetime | None = None, *, retired: bool = False) -> list[str]:
        """Remove the live agents whose expiry has passed and those left half made; their ids.
        retired: also those a stopped process left retired but not torn down (at ``open``:
        a pool's own are its ``Pools.start``'s).
        One that cannot be removed now (its engine gone) is logged and tried again next time."""
        now = now or utc_now()
        stale = now - timedelta(seconds=AGENT_MAKING_STALE_SECONDS)
        reaped = []
        for record in await self.store.agents(statuses=(LIVE, MAKING, RETIRING)):
            left_retired = retired and record.status == RETIRING and not record.owner.startswith(HOLDER_PREFIX)
            if left_retired or (record.status != RETIRING and record.expired(now)) or \
                    (record.status == MAKING and record.created_at <= stale):
                try:
                    await self._remove(record)
                except (GuildsError, OSError) as exc:
                    log.warning("agent %s: expired, not removed yet: %s", record.id, exc)
                    continue
                reaped.append(record.id)
        return reaped

    async def reap_every(self, seconds: float) -> None:
        """``reap`` every ``seconds`` until cancelled (a server's background task)."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.reap()
            except GuildsError as exc:  # the record out of reach a while: the next round tries again
                log.warning("agents: the expired ones not reaped: %s", exc)
