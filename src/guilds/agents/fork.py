"""Fork: n new agents whose homes start as an agent's home now, or at a checkpoint of it.

    forked = await fork(agents, Source(...), n, checkpoint=None, owner=None, expires_in=None)
    forked.records                       the children, live, their sandboxes started

The children are agents made on demand of the source's template (``registry``),
owned by the source's owner unless another is given, each with its own id, uid,
sandbox and home. They are made whole or not at all: their n rows are admitted
first, within ``agents.max`` and ``agents.max_per_owner`` (a refusal makes none
and leaves nothing), then their homes, then their sandboxes; a failure at any
step removes every child and every layer made for them.

**The source's files, frozen once.** The fork holds the source's call gate
(``guilds.checkpoints.call_gate``, as a rewind does) only while it freezes the
source's home, so no call of it runs meanwhile; one that is running is waited
for (``Forked.waited`` says how long). Its background commands are not stopped:
a file one of them writes meanwhile is frozen as it stood. A checkpoint as the
source needs no gate: the checkpoint store's lock is held while it is read.
Memory is not forked: a child starts with no process of the source running.

**Overlay homes** (root, overlayfs: ``homes``): the child's home is an overlay
over a stack of read-only layers, with an upper of its own that starts empty:

- a source whose home is an overlay: its upper (only what it changed) copied
  into one new layer (``fork_layers``), stacked on the layers it stands on; an
  upper still empty needs no layer. Past ``limits.FORK_MAX_LAYERS`` layers,
  the source's whole home is frozen as one layer instead;
- a source whose home is a plain folder: its whole home, copied once, as a layer;
- a checkpoint: its tree as a layer whose files are hard links to the store's
  objects (both are never written), so it costs a link per file, no content;
- a home kept as layers (``Source.layers``: an E2B snapshot of an overlay home):
  those layers as they are, nothing frozen.

Every layer is shared by all the children and stays while a home names it:
removing the source, or a child, never changes another's files.

**Copies** otherwise (not root, no overlayfs): the first child's home is a
copy of the source's (``cp -a --reflink=auto``), or the checkpoint written
out, while the gate or the store's lock is held; the other children's are
copies of that first one, made once it is let go.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoints.call_gate import CallGate
from ..checkpoints.point_store import Checkpoint, CheckpointError, CheckpointStore
from ..config import agents as known_agents
from ..errors import BadInput, GuildsError
from ..limits import FORK_MAX_CHILDREN, FORK_MAX_LAYERS, FORK_STARTS_AT_ONCE
from ..record.agent_rows import LIVE, AgentRecord, UidTaken
from ..record.statements import utc_now
from . import fork_layers
from .home_layers import LOWER_LINK, copy_tree
from .homes import HOME_MODE, _folders, _mount, overlay_dir, overlay_unavailable, swap_home
from .registry import HOMES_FOLDER, UID_DRAWS, checked_expiry, checked_owner, new_agent_id

if TYPE_CHECKING:
    from ..config.settings import AgentSettings
    from ..sandbox import Sandbox
    from .registry import Adjust, Agents

OVERLAY, COPY = "overlay", "copy"


@dataclass(frozen=True)
class Source:
    """The agent forked: its id, template, owner and home (on this machine)."""

    id: str
    template: str
    owner: str
    home: Path
    points: Path | None = None
    """The folder of the checkpoint store its checkpoints are found in: the agent's own
    (``CheckpointStore.of_agent``) unless given (a store kept apart from any agent, as an
    E2B snapshot's: ``guilds.fronts.e2b.snapshots``)."""
    layers: tuple[str, ...] | None = None
    """A home kept as layers (an E2B snapshot of an overlay home): its fork layers, top
    first, that the children stand on as they are, with no checkpoint and no freeze."""
    lower: str | None = None
    """The template's layer below those layers, if any."""

    def store(self, data_dir: Path) -> CheckpointStore:
        """The store its checkpoints are in."""
        if self.points is None:
            return CheckpointStore.of_agent(data_dir, self.id, self.home)
        return CheckpointStore(self.points, self.home)


@dataclass(frozen=True)
class Forked:
    """What a fork made."""

    source: str
    records: list[AgentRecord]
    how: str
    """``overlay`` (the children's homes stand on shared layers) or ``copy``."""
    layers: tuple[str, ...] = ()
    """The fork layers the children stand on, top first (overlay homes)."""
    checkpoint: str | None = None
    waited: float = 0.0
    """Seconds the fork waited for the source's running calls to end."""

    def lines(self) -> list[str]:
        """The fork in one line (the CLI's first)."""
        point = f" at checkpoint {self.checkpoint}" if self.checkpoint else ""
        wait = f"; waited {self.waited:.2f} s for its running calls" if self.waited >= 0.05 else ""
        return [(f"forked {self.source}{point} into {len(self.records)} agents, homes by {self.how}{wait} "
                 "(files only: no running process is forked)")]


def checked_count(n: Any) -> int:
    """The number of children: a whole number from 1 to FORK_MAX_CHILDREN; BadInput otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= FORK_MAX_CHILDREN:
        raise BadInput(f"n: the number of agents to fork, 1 to {FORK_MAX_CHILDREN}, got {n!r}")
    return n


def find_point(data_dir: Path, source: Source, checkpoint: str) -> Checkpoint:
    """The source's checkpoint named (or with that id); BadInput naming what is kept otherwise."""
    points = source.store(data_dir).points()
    for point in reversed(points):
        if checkpoint in (point.name, point.id):
            return point
    named = ", ".join(sorted({p.name for p in points if p.name})) or "none"
    raise BadInput(f"checkpoint: no checkpoint {checkpoint!r} is kept for agent {source.id} (named: {named})")


@dataclass
class _Child:
    settings: AgentSettings
    sandbox: Sandbox
    row: dict[str, Any]
    toolbox: Any = None
    pooled: bool = False
    """Taken from the template's warm pool: its sandbox and helper run; its home is swapped."""


@dataclass
class _Plan:
    how: str
    above: list[str] = field(default_factory=list)
    lower: str | None = None
    """The template layer's link target, as the source's ``lower`` link holds it."""
    made: str | None = None
    """The layer this fork froze (the top one; removed when the fork fails)."""


async def fork(agents: Agents, source: Source, n: int, *, checkpoint: str | None = None,
               owner: str | None = None, expires_in: float | None = None, adjust: Adjust | None = None) -> Forked:
    """n new agents of the source's template whose homes start as the source's home now (or at
    its checkpoint named ``checkpoint``); their sandboxes started. BadInput for a bad n, owner,
    expiry or checkpoint, ``AgentRefused`` past a cap; a failure leaves nothing. adjust: each
    child's settings changed before its sandbox is made, as ``Agents.make``'s (a narrowed
    network, the source's own: ``guilds.fronts.e2b``)."""
    n = checked_count(n)
    owner = checked_owner(source.owner if owner is None else owner)
    expiry = checked_expiry(expires_in)
    made_from = agents.served.template(source.template)
    point = find_point(agents.data_dir, source, checkpoint) if checkpoint is not None else None
    children = await _taken(agents, made_from, n, owner, expiry, adjust)
    plan: _Plan | None = None
    try:
        if len(children) < n:
            children += await _admit(agents, made_from, n - len(children), owner, expiry, adjust)
        home_owner = children[0].sandbox.home_owner
        how = OVERLAY if overlay_unavailable(agents.data_dir, home_owner) is None else COPY
        (agents.data_dir / HOMES_FOLDER).mkdir(mode=0o700, exist_ok=True)
        started = time.monotonic()
        waited = 0.0
        if source.layers is not None:
            plan = await asyncio.to_thread(_stacked, agents.data_dir, source, how, children)
        elif point is not None:
            plan = await asyncio.to_thread(_freeze_point, agents.data_dir, source, point.id, how, children)
        else:
            async with CallGate(source.store(agents.data_dir).root).alone():
                waited = time.monotonic() - started
                plan = await asyncio.to_thread(_freeze_live, agents.data_dir, source, how, children)
        await _start_all(agents, source, children, plan)
    except BaseException:
        await asyncio.shield(_undo(agents, children, plan))
        raise
    for child in children:
        agents._toolboxes[child.settings.id] = child.toolbox
    return Forked(source.id, [AgentRecord(**{**c.row, "status": LIVE}) for c in children], plan.how,
                  tuple(plan.above), None if point is None else point.id, waited)


async def _taken(agents: Agents, made_from: Any, n: int, owner: str, expiry: float | None,
                 adjust: Adjust | None) -> list[_Child]:
    """Children taken from the template's warm pool, made the owner's (``Pools.take_swappable``):
    agents whose sandbox and resident helper already run and whose homes ``swap_home`` gives
    the fork's tree in place. None when the children's settings are adjusted or sit behind
    the egress proxy (their sandboxes would not be the template's), or homes cannot be overlays."""
    if adjust is not None or made_from.settings.egress:
        return []
    taken = await agents.pools.take_swappable(made_from.name, n, owner, expiry, agents.served.caps.max_per_owner)
    return [_Child(toolbox.settings, toolbox.sandbox, _row(record), toolbox, pooled=True) for record, toolbox in taken]


def _row(record: AgentRecord) -> dict[str, Any]:
    """A recorded agent's fields as a child's row holds them (its status apart)."""
    return {k: v for k, v in dataclasses.asdict(record).items() if k != "status"}


async def _admit(agents: Agents, made_from: Any, n: int, owner: str, expiry: float | None,
                 adjust: Adjust | None) -> list[_Child]:
    """n children's rows admitted within the caps in one transaction, or none (every egress
    folder their sandboxes' objects made removed). A drawn id whose uid a running agent holds
    (or another drawn child) makes them admitted one by one instead, drawing again for it."""
    from ..sandbox import remove_egress_files

    now = utc_now()
    children = [_drawn(agents, made_from, owner, now, expiry, adjust) for _ in range(n)]
    caps = agents.served.caps
    try:
        retired = await agents.store.admit_agents([c.row for c in children], max_total=caps.max,
                                                  max_per_owner=caps.max_per_owner, evictable=agents.pools.evictable())
    except BaseException as exc:
        for child in children:
            remove_egress_files(agents.data_dir, child.settings.id)
        if not isinstance(exc, UidTaken):
            raise
        return await _admit_each(agents, made_from, n, owner, expiry, adjust)
    for agent_id in retired:
        agents.pools.retired(agent_id)
    return children


def _drawn(agents: Agents, made_from: Any, owner: str, now: datetime, expiry: float | None,
           adjust: Adjust | None) -> _Child:
    """A child with a new id (drawn again while its uid is the settings' own agent's), its
    settings, its sandbox's object and its row."""
    from ..sandbox import get_sandbox

    for draw in range(UID_DRAWS, 0, -1):
        agent_id = new_agent_id(made_from.name)
        try:
            uid = agents.uid_of(agent_id)
        except UidTaken:
            if draw == 1:
                raise
            continue
        settings = made_from.for_agent(agent_id, agents.home_of(agent_id))
        if adjust is not None:
            settings = adjust(settings)
        sandbox = get_sandbox(settings, agents.data_dir)
        row = {"id": agent_id, "template": made_from.name, "owner": owner, "sandbox": sandbox.name,
               "home": str(settings.home), "created_at": now, "uid": uid,
               "expires_at": None if expiry is None else now + timedelta(seconds=expiry)}
        return _Child(settings, sandbox, row)
    raise AssertionError("unreachable: the last draw raises")


async def _admit_each(agents: Agents, made_from: Any, n: int, owner: str, expiry: float | None,
                      adjust: Adjust | None) -> list[_Child]:
    """n children's rows admitted one by one within the caps, or none (every admitted row dropped)."""
    from ..sandbox import remove_egress_files

    caps, children = agents.served.caps, []
    now = utc_now()
    try:
        for _ in range(n):
            for draw in range(UID_DRAWS, 0, -1):  # another id while the one drawn gives a uid taken
                child = _drawn(agents, made_from, owner, now, expiry, adjust)
                try:  # at the server's cap a ready agent of a warm pool is retired, as for a make
                    retired = await agents.store.admit_agent(child.row, max_total=caps.max,
                                                             max_per_owner=caps.max_per_owner,
                                                             evictable=agents.pools.evictable())
                except BaseException as exc:
                    remove_egress_files(agents.data_dir, child.settings.id)
                    if isinstance(exc, UidTaken) and draw > 1:
                        continue
                    raise
                break
            if retired is not None:
                agents.pools.retired(retired)
            children.append(child)
    except BaseException:
        for child in children:
            await asyncio.shield(_forget(agents, child))
        raise
    return children


async def _forget(agents: Agents, child: _Child) -> None:
    from ..sandbox import remove_egress_files

    remove_egress_files(agents.data_dir, child.settings.id)
    await agents.store.forget_agent(child.settings.id)


def _source_home(source: Source) -> Path:
    os.makedirs(source.home, HOME_MODE, exist_ok=True)  # an agent not started yet: an empty home
    return source.home


def _freeze_live(data_dir: Path, source: Source, how: str, children: list[_Child]) -> _Plan:
    """The source's home now, frozen as a layer (overlay) or copied into the first child's home."""
    home = _source_home(source)
    if how == COPY:
        os.mkdir(children[0].settings.home, HOME_MODE)
        copy_tree(home, children[0].settings.home)
        return _Plan(COPY)
    own = overlay_dir(data_dir, home)
    if not (own / "upper").is_dir():
        return _plan(data_dir, [fork_layers.freeze_home(data_dir, home)], None, children)
    frozen = fork_layers.freeze_overlay(data_dir, own, home)
    lower = None if frozen.lower is None else fork_layers.lower_link(frozen.lower)
    return _plan(data_dir, frozen.above, lower, children, froze=frozen.made is not None)


def _stacked(data_dir: Path, source: Source, how: str, children: list[_Child]) -> _Plan:
    """Each child's overlay over the layers the source names (frozen before, and held by it)."""
    if how == COPY:
        raise CheckpointError("a home kept as layers starts only overlay homes, and none can be mounted here")
    lower = None if source.lower is None else fork_layers.lower_link(source.lower)
    return _plan(data_dir, list(source.layers or ()), lower, children, froze=False)


def _freeze_point(data_dir: Path, source: Source, point_id: str, how: str, children: list[_Child]) -> _Plan:
    store = source.store(data_dir)
    stood_on = store.layers_of(point_id)
    if stood_on is not None:  # an overlay home's checkpoint: its upper, frozen above the same layers
        if how == COPY:
            raise CheckpointError(f"checkpoint {point_id} of an overlay home forks only into overlay homes, "
                                  "and none can be mounted here")
        names = [os.path.basename(layer) for layer in stood_on]
        lower = None if not names or names[-1].startswith(fork_layers.FORK_PREFIX) else names.pop()
        if len(names) + 2 > FORK_MAX_LAYERS:
            raise CheckpointError(f"checkpoint {point_id} stands on {len(names)} fork layers: a fork of it "
                                  f"would pass {FORK_MAX_LAYERS}")
        layer = fork_layers.freeze_point(data_dir, store, point_id)
        return _plan(data_dir, [layer, *names], None if lower is None else fork_layers.lower_link(lower),
                     children)
    if how == COPY:
        with store.holding():
            fork_layers.write_point(str(children[0].settings.home), str(store.objects), store.tree_of(point_id))
        return _Plan(COPY)
    return _plan(data_dir, [fork_layers.freeze_point(data_dir, store, point_id)], None, children)


def _plan(data_dir: Path, above: list[str], lower: str | None, children: list[_Child], *,
          froze: bool = True) -> _Plan:
    """Each child's own overlay folders made, naming the layers (under the forks' lock, so no
    removal of the source prunes a layer between its freeze and the children's links)."""
    plan = _Plan(OVERLAY, above, lower, above[0] if froze else None)
    try:
        with fork_layers.forks_lock(data_dir):
            for child in children:
                if child.pooled:  # its own folders are there: swap_home names the layers
                    continue
                own = overlay_dir(data_dir, child.settings.home)
                own.parent.mkdir(mode=0o700, exist_ok=True)
                os.mkdir(own, 0o700)
                if lower is not None:
                    os.symlink(lower, own / LOWER_LINK)
                fork_layers.link(own, above)
                _folders(own, child.sandbox.home_owner or (0, 0))
    except BaseException:
        _drop_layer(data_dir, plan)
        raise
    return plan


def _drop_layer(data_dir: Path, plan: _Plan | None) -> None:
    if plan is not None and plan.made is not None:
        fork_layers.prune(data_dir, [plan.made])


def _home(data_dir: Path, child: _Child, plan: _Plan, first: _Child) -> None:
    """The child's home: its overlay mounted, or a copy of the first child's."""
    home = child.settings.home
    if plan.how == OVERLAY:
        os.makedirs(home, HOME_MODE, exist_ok=True)
        _mount(home, overlay_dir(data_dir, home))
    elif child is not first:
        os.mkdir(home, HOME_MODE)
        copy_tree(first.settings.home, home)


def _home_remembered(data_dir: Path, child: _Child, plan: _Plan, first: _Child) -> None:
    """The child's home (``_home``), then its entry among the known agents: both off the event
    loop, whose one thread would otherwise serialize a fork's children on their file work."""
    _home(data_dir, child, plan, first)
    known_agents.remember(data_dir, child.settings, None)


async def _start_all(agents: Agents, source: Source, children: list[_Child], plan: _Plan) -> None:
    """Every child's home, entry and sandbox, FORK_STARTS_AT_ONCE at a time; then each is live.
    A child behind the egress proxy keeps its source's pinned repository origins, taken before
    its sandbox starts (its sandbox's object, made before its home, pinned nothing)."""
    from ..sandbox import inherit_egress_origins

    limit = asyncio.Semaphore(FORK_STARTS_AT_ONCE)

    async def start(child: _Child) -> None:
        async with limit:
            if child.pooled:
                await asyncio.to_thread(swap_home, agents.data_dir, child.settings.home, plan.above, plan.lower)
                return
            if child.sandbox.egress is not None:
                inherit_egress_origins(agents.data_dir, source.id, child.settings.id)
            await asyncio.to_thread(_home_remembered, agents.data_dir, child, plan, children[0])
            started = time.monotonic()
            await child.sandbox.start()
            child.toolbox = agents.toolbox_for(child.settings, child.sandbox)
            child.toolbox.started_by_maker(time.monotonic() - started)

    results = await asyncio.gather(*(start(c) for c in children), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    await agents.store.mark_agents([child.settings.id for child in children if not child.pooled], LIVE)


async def _undo(agents: Agents, children: list[_Child], plan: _Plan | None) -> None:
    """Every child gone (its sandbox, home, entry and row), and the layer made for them."""
    for child in children:
        if child.toolbox is not None:
            with contextlib.suppress(GuildsError, OSError):
                await child.toolbox.close()
        with contextlib.suppress(GuildsError, OSError):
            await agents._remove_files(child.settings, child.sandbox)
        shutil.rmtree(child.settings.home, ignore_errors=True)
        await agents.store.forget_agent(child.settings.id)
    await asyncio.to_thread(_drop_layer, agents.data_dir, plan)
