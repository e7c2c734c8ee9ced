"""E2B's snapshots and fork on the agents' checkpoints and fork (``guilds.agents.fork``).

    forks = Forks(sandboxes, Snapshots.open(data_dir))
    await forks.snapshot(box, name)            a snapshot of the sandbox's files
    await forks.create_from(snapshot, asked)   a new sandbox whose files start as the snapshot's
    await forks.fork(box, count, timeout)      count new sandboxes whose files start as box's now

A sandbox made from a snapshot is an agent forked from the snapshot, of the snapshot's
template, owned by the key that asks: its home an overlay over the snapshot's layers as they
are (a snapshot of an overlay home: ``snapshots``), or, for a snapshot kept as a checkpoint,
an overlay over the checkpoint's files (hard links to them) or a copy of them. A fork's children are agents forked from
the source's agent now (its changes frozen once into a layer the children share, or copies):
the source runs on, its commands untouched (a kill, pause or resume of it waits for the
fork's children to be made, or the snapshot to be taken); each child has its own home, sandbox, uid,
process service and access token, its source's ``envVars``, ``metadata`` and network (a
narrowed one stays narrowed), and its own timer (``timeout``). Removing the source or any
child never changes another's files.

Only files are kept and forked: no running process, no memory. A child starts with no
command running (a command of the source, running at the fork, goes on in the source alone);
a sandbox made from a snapshot likewise. Snapshots and fork need the agent's home on this
machine (bwrap, docker, local): on kubernetes they are answered ``unimplemented`` (501).

Caps: the children count against ``agents.max_per_owner`` (the key) and ``agents.max`` as
creates do, all admitted or none: a fork past a cap starts none, and each of its entries is
that 429 (E2B reports each fork's own error; the SDKs give each as a ``RateLimitException``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ...agents.fork import Source, fork
from ...agents.homes import overlay_dir
from ...checkpoints.call_gate import CallGate
from ...checkpoints.point_store import CheckpointError, CheckpointStore
from ...config.settings import CHECKPOINT_SANDBOXES, AgentSettings
from ...egress.rules import RuleSet
from ...errors import SandboxError
from ...record.agent_rows import LIVE, AgentRecord, AgentRefused
from ...sandbox import backend_of
from .connect import ConnectError
from .network_options import Entries, narrowing
from .sandboxes import OWNER_PREFIX, E2BSandbox, Made, Sandboxes
from .snapshots import Snapshot, Snapshots, Taken

if TYPE_CHECKING:
    from ...agents.registry import Adjust, Agents


class Forks:
    def __init__(self, sandboxes: Sandboxes, snapshots: Snapshots):
        self.sandboxes, self.snapshots = sandboxes, snapshots
        self.agents = sandboxes.agents

    def named(self, key_name: str, template_id: str) -> Snapshot | None:
        """The key's snapshot a create's ``templateID`` names; None for a template served."""
        if template_id in self.sandboxes.templates():
            return None
        return self.snapshots.find(key_name, template_id)

    def settings_of(self, snapshot: Snapshot) -> AgentSettings:
        """The settings of its template (``not_found`` when the server no longer serves it)."""
        made_from = self.agents.served.templates.get(snapshot.template)
        if made_from is None:
            raise ConnectError("not_found", f"snapshot '{snapshot.id}': its template '{snapshot.template}' is not "
                                            "served by this server")
        return made_from.settings

    async def _record(self, box: E2BSandbox) -> AgentRecord:
        """Its agent's row; ``unimplemented`` where the agent's home is not on this machine."""
        found = await self.agents.store.agents(agent_id=box.agent_id, statuses=(LIVE,))
        if not found:
            raise ConnectError("not_found", f"sandbox '{box.id}' not found")
        if found[0].sandbox not in CHECKPOINT_SANDBOXES:
            raise ConnectError("unimplemented", f"snapshots and fork are not supported on {found[0].sandbox}: "
                                                "the sandbox's files are not on this server's machine")
        return found[0]

    async def snapshot(self, box: E2BSandbox, name: str | None) -> Snapshot:
        """A snapshot of its files now (no call of its agent rewinds them meanwhile)."""
        record = await self._record(box)
        home = box.agent.settings.home
        taken = Taken(box.key_name, name, box.id, box.agent_id, record.template, home,
                      overlay_dir(self.agents.data_dir, home))
        gate = CallGate(CheckpointStore.of_agent(self.agents.data_dir, box.agent_id, home).root)
        async with self._held(box), gate.call():
            try:
                return await self.snapshots.take(taken)
            except (CheckpointError, SandboxError) as exc:
                raise ConnectError("internal", f"the snapshot could not be taken: {exc}") from None
            except OSError as exc:
                raise ConnectError("internal", f"the snapshot could not be taken: {exc.strerror or exc}") from None

    @contextlib.asynccontextmanager
    async def _held(self, box: E2BSandbox) -> AsyncIterator[None]:
        """Its changes held off (a kill, a pause or a resume waits, as for E2B's sandbox paused
        while it is snapshotted); ``not_found`` when a kill came first."""
        async with box.changing:
            self.sandboxes.get(box.key_name, box.id)
            yield

    def _adjust(self, settings: AgentSettings, network: Entries, rules: RuleSet) -> Adjust | None:
        return narrowing(network, settings, backend_of(settings), rules)

    def adjust_of(self, snapshot: Snapshot, network: Entries, rules: RuleSet) -> Adjust | None:
        """How an agent made from the snapshot is made: as its template's, its network narrowed
        as asked (its header rules given); a built template's on the image its build made
        (``template_homes``)."""
        narrow = self._adjust(self.settings_of(snapshot), network, rules)
        image = snapshot.built.get("image")
        if not image:
            return narrow

        def on_image(settings: AgentSettings) -> AgentSettings:
            settings = dataclasses.replace(settings, docker=dataclasses.replace(settings.docker, image=image))
            return settings if narrow is None else narrow(settings)

        return on_image

    async def create_from(self, snapshot: Snapshot, asked: Made) -> E2BSandbox:
        """A new sandbox, an agent forked from the snapshot's checkpoint, its network as asked
        (a built template's environment under the create's own ``envVars``)."""
        adjust = self.adjust_of(snapshot, asked.network, asked.rules)
        asked = dataclasses.replace(asked, env_vars={**snapshot.built.get("envs", {}), **asked.env_vars})
        return await self.sandboxes.under_way(self._create_from(snapshot, asked, adjust))

    async def _create_from(self, snapshot: Snapshot, asked: Made, adjust: Adjust | None) -> E2BSandbox:
        made = await self.agent_from(snapshot, asked.key_name, asked.timeout, adjust)
        return await self.sandboxes.adopt(made, asked)

    async def agent_from(self, snapshot: Snapshot, key_name: str, timeout: int,
                         adjust: Adjust | None = None) -> AgentRecord:
        """An agent of the key whose home starts as the snapshot's (``resource_exhausted`` past a cap)."""
        async with self.snapshots.using(snapshot) as points:
            if snapshot.layered:
                source = Source(snapshot.agent_id, snapshot.template, _owner(key_name), Path(),
                                layers=snapshot.layers, lower=snapshot.lower)
                made = await _forked(self.agents, source, 1, timeout, adjust=adjust)
            else:
                source = Source(snapshot.agent_id, snapshot.template, _owner(key_name), Path(), points=points)
                made = await _forked(self.agents, source, 1, timeout, checkpoint=snapshot.point, adjust=adjust)
        return made[0]

    async def fork(self, box: E2BSandbox, count: int, timeout: int) -> list[E2BSandbox | ConnectError]:
        """count new sandboxes whose files start as box's now; each one's sandbox, or the error
        that ended it after its agent was made (its agent removed)."""
        record = await self._record(box)
        adjust = self._adjust(self.agents.served.template(record.template).settings, box.network, box.rules)
        source = Source(box.agent_id, record.template, _owner(box.key_name), box.agent.settings.home)
        asked = Made(box.key_name, box.template, timeout, dict(box.metadata), dict(box.env_vars), box.network,
                     datetime.now(UTC), ingress=box.ingress, rules=box.rules)
        return await self.sandboxes.under_way(self._fork(box, source, count, asked, adjust))

    async def _fork(self, box: E2BSandbox, source: Source, count: int, asked: Made,
                    adjust: Adjust | None) -> list[E2BSandbox | ConnectError]:
        try:
            async with self._held(box):
                made = await _forked(self.agents, source, count, asked.timeout, adjust=adjust)
        except ConnectError as exc:
            if exc.code != "resource_exhausted":
                raise
            return [exc] * count  # each fork's own 429, as E2B reports a fork past a limit
        ends = await asyncio.gather(*(self.sandboxes.adopt(record, asked) for record in made),
                                    return_exceptions=True)
        return [end if isinstance(end, E2BSandbox) else _failed(end) for end in ends]


def _owner(key_name: str) -> str:
    return f"{OWNER_PREFIX}{key_name}"


async def _forked(agents: Agents, source: Source, n: int, timeout: int, *, checkpoint: str | None = None,
                  adjust: Adjust | None = None) -> list[AgentRecord]:
    """The agents forked (``guilds.agents.fork``): ``resource_exhausted`` past a cap."""
    try:
        forked = await fork(agents, source, n, checkpoint=checkpoint, owner=source.owner,
                            expires_in=timeout or None, adjust=adjust)
    except AgentRefused as exc:
        raise ConnectError("resource_exhausted", f"sandbox limit reached: {exc}") from None
    return forked.records


def _failed(exc: BaseException) -> ConnectError:
    """A child's failure as E2B's per-fork error (a cancellation goes on up)."""
    if not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, ConnectError):
        return exc
    return ConnectError("unavailable", f"the forked sandbox could not be started: {exc}")

