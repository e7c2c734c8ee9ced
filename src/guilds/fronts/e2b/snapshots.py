"""E2B snapshots: a sandbox's files kept, to make new sandboxes from (``Sandbox.create(snapshot_id)``).

    snapshots = Snapshots.open(data_dir)   those kept in the data folder (read back at the server's start)
    await snapshots.take(Taken(...))       a new one (a named one replaces its name's former one)
    snapshots.find(key_name, ref)          the one an id or a name names, or None
    snapshots.of_key(key_name)             a key's, oldest first
    await snapshots.remove(snapshot)

A snapshot of an **overlay home** (``guilds.agents.homes``: bwrap, root, overlayfs) is layers:
what the sandbox changed (its upper) frozen as one new read-only layer, above the layers its
home stands on (``guilds.agents.fork_layers``), held by the snapshot (``fork_layers.hold``,
holder ``e2b-snapshot-<raw id>``) so that no removal of a sandbox prunes them. Its store is
only its ``about.json``, naming them. A sandbox made from it is an overlay over them (no
file copied); a layer stays while a snapshot holds it or a home stands on it, and is removed
when neither does.

A snapshot of a **plain-folder home** (a copy: docker, not root, no overlayfs) is a
checkpoint of the whole home (``guilds.checkpoints.point_store``: every file, folder and
link with its mode and times, in a content store). Its store,
``<data folder>/e2b-snapshots/<raw id>/``:

    points/      the checkpoint store, holding the one checkpoint (a plain-folder home's)
    about.json   its key, name, source sandbox and agent, template, moment and layers; written
                 last, so a folder without it (a take cut short) is removed, and its layers let
                 go, at the server's start

Kept apart from the agent's own checkpoints, it outlives its sandbox, as E2B's do, and no
per-call checkpoint prunes it: only a delete removes it (or the data folder's removal).
A running process's memory is never part of it.

Ids, as E2B's: a snapshot with no name is ``<raw id>:default``; a named one is
``<key name>/<name>:default`` (the key stands for E2B's team). Its name, with or without the
key's part and the ``:default`` tag, names it too, as its raw id does. A name is taken again
by a new snapshot of the same key: the new one replaces the old one under the same id (E2B's
"a new build of the existing template"). A key holds ``E2B_MAX_SNAPSHOTS`` at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from guilds_code.limits import NAME_MAX_CHARS

from ...agents import fork_layers
from ...checkpoints.point_store import CheckpointStore
from ...config.checks import is_safe_name
from ...limits import E2B_MAX_SNAPSHOTS
from .connect import ConnectError

FOLDER = "e2b-snapshots"
"""Under the data folder: one folder per snapshot, named by its raw id."""
ABOUT, POINTS = "about.json", "points"
TAG = "default"
"""The one tag a snapshot has (E2B's tag of a template's newest build)."""
_NEVER_PRUNED = 1 << 62
"""The store's size bound: one checkpoint, never pruned by size."""
HOLDER_PREFIX = "e2b-snapshot-"
"""A snapshot's hold on its layers: this and its raw id."""


@dataclass(frozen=True)
class Snapshot:
    raw: str
    key_name: str
    name: str | None
    sandbox_id: str
    """The sandbox it was taken of."""
    agent_id: str
    template: str
    """The template of its sandbox's agent (the sandboxes made from it are agents of it)."""
    point: str
    """Its checkpoint's id in its store ("" for a snapshot kept as layers)."""
    at: float
    layers: tuple[str, ...] = ()
    """An overlay home's snapshot: its fork layers, top first (the first one its own)."""
    lower: str | None = None
    """An overlay home's snapshot: the template's layer below those, if any."""
    built: dict[str, Any] = field(default_factory=dict)
    """A built template's (``template_homes``): its image, environment and start command."""

    @property
    def layered(self) -> bool:
        """Kept as layers (an overlay home's), not as a checkpoint."""
        return not self.point

    @property
    def holder(self) -> str:
        return f"{HOLDER_PREFIX}{self.raw}"

    @property
    def id(self) -> str:
        """Its E2B ``snapshotID``."""
        return f"{self.key_name}/{self.name}:{TAG}" if self.name else f"{self.raw}:{TAG}"

    @property
    def order(self) -> str:
        """Where it stands in a list, as a string that sorts so: its moment in microseconds,
        then its raw id (a list's next token)."""
        return f"{int(self.at * 1e6):020d}.{self.raw}"

    def info(self) -> dict[str, object]:
        """E2B's SnapshotInfo."""
        return {"snapshotID": self.id, "names": [self.id] if self.name else []}

    def named_by(self, ref: str) -> bool:
        """True when ref names it: its id, its raw id or its name, with or without the key's
        part (``<key>/``) and the tag (``:default``)."""
        ref, _, tag = ref.partition(":")
        if tag not in ("", TAG):
            return False
        space, _, bare = ref.rpartition("/")
        if space and space != self.key_name:
            return False
        return bare == self.raw or (self.name is not None and bare == self.name)


def checked_name(name: object, taken: tuple[str, ...]) -> str | None:
    """A snapshot's name: none, or letters, digits, '.', '_', '-' (at most NAME_MAX_CHARS) that
    no template served here has (``taken``); ``invalid_argument`` otherwise."""
    if name is None or name == "":
        return None
    if not isinstance(name, str) or not is_safe_name(name):
        raise ConnectError("invalid_argument", f"name: letters, digits, '.', '_' or '-' (at most {NAME_MAX_CHARS}, "
                                               f"no '..'), got {str(name)[:40]!r}")
    if name in taken:
        raise ConnectError("invalid_argument", f"name: {name!r} is a template's id on this server")
    return name


@dataclass(frozen=True)
class Taken:
    """What a new snapshot is of."""

    key_name: str
    name: str | None
    sandbox_id: str
    agent_id: str
    template: str
    home: Path
    overlay: Path | None = None
    """The home's own overlay folders (``guilds.agents.homes.overlay_dir``), when it may be one."""
    built: dict[str, Any] = field(default_factory=dict)
    """A built template's (``Snapshot.built``)."""


class Snapshots:
    """Every snapshot kept in one data folder, by raw id."""

    FOLDER, HOLDER_PREFIX, KIND, MAX_KEPT = FOLDER, HOLDER_PREFIX, "snapshot", E2B_MAX_SNAPSHOTS
    """Its folder under the data folder, its holds' prefix, what it keeps, and how many per key
    (a store of another kind: ``template_homes``)."""

    def __init__(self, data_dir: Path, kept: dict[str, Snapshot]):
        self.data_dir = Path(data_dir)
        self.folder = self.data_dir / self.FOLDER
        self._kept = kept
        self._taking: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()
        """Sandboxes being made from each snapshot (by raw id): a delete waits for them to end."""
        self._removed: set[str] = set()

    @classmethod
    def open(cls, data_dir: Path) -> Self:
        """The snapshots kept; the folders of takes cut short removed."""
        folder, kept = Path(data_dir) / cls.FOLDER, {}
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            try:
                about = json.loads((entry / ABOUT).read_text())
                snapshot = Snapshot(**{**about, "layers": tuple(about.get("layers", ()))})
            except (OSError, ValueError, TypeError):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            kept[snapshot.raw] = snapshot
        for holder in fork_layers.holders(Path(data_dir)):
            if holder.startswith(cls.HOLDER_PREFIX) and holder[len(cls.HOLDER_PREFIX):] not in kept:
                fork_layers.release(Path(data_dir), holder)  # a take cut short, or a removal
        return cls(data_dir, kept)

    @contextlib.asynccontextmanager
    async def using(self, snapshot: Snapshot) -> AsyncIterator[Path]:
        """The folder of its checkpoint store, kept while held: a delete meanwhile removes it
        once the last holder lets go."""
        self._users[snapshot.raw] += 1
        try:
            yield self.folder / snapshot.raw / POINTS
        finally:
            self._users[snapshot.raw] -= 1
            if not self._users[snapshot.raw]:
                del self._users[snapshot.raw]
                if snapshot.raw in self._removed:
                    self._removed.discard(snapshot.raw)
                    await asyncio.to_thread(self._drop, snapshot)

    def of_key(self, key_name: str) -> list[Snapshot]:
        """The key's snapshots, oldest first."""
        return sorted((s for s in self._kept.values() if s.key_name == key_name), key=lambda s: s.order)

    def find(self, key_name: str, ref: str) -> Snapshot | None:
        """The key's snapshot that ref names (``Snapshot.named_by``), or None."""
        return next((s for s in self.of_key(key_name) if s.named_by(ref)), None)

    async def take(self, taken: Taken) -> Snapshot:
        """A new snapshot of the home (the caller holds the agent's call gate); past the key's
        ``E2B_MAX_SNAPSHOTS``, ``resource_exhausted``. A take that fails (a full disk) leaves
        nothing of itself and every other snapshot whole."""
        async with self._taking.setdefault(taken.key_name, asyncio.Lock()):
            replaced = self._replaced(taken)
            if not replaced and len(self.of_key(taken.key_name)) >= self.MAX_KEPT:
                raise ConnectError("resource_exhausted", f"{self.KIND} limit reached: key {taken.key_name!r} holds "
                                                         f"{self.MAX_KEPT} {self.KIND}s; delete one first")
            snapshot = await asyncio.to_thread(self._write, taken)
            self._kept[snapshot.raw] = snapshot
            for former in replaced:
                await self.remove(former)
            return snapshot

    def _replaced(self, taken: Taken) -> list[Snapshot]:
        """What a new one replaces: its name's former one."""
        former = None if taken.name is None else self.find(taken.key_name, taken.name)
        return [] if former is None else [former]

    def _write(self, taken: Taken) -> Snapshot:
        raw = secrets.token_hex(10)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        own = self.folder / raw
        os.mkdir(own, 0o700)
        holder = f"{self.HOLDER_PREFIX}{raw}"
        layers: tuple[str, ...]
        try:
            frozen = self._frozen(taken, holder)
            if frozen is None:
                point = CheckpointStore(own / POINTS, taken.home).take(name=taken.name, max_count=1,
                                                                       max_bytes=_NEVER_PRUNED).id
                layers, lower = (), None
            else:
                point, layers, lower = "", tuple(frozen.above), frozen.lower
            snapshot = Snapshot(raw=raw, key_name=taken.key_name, name=taken.name, sandbox_id=taken.sandbox_id,
                                agent_id=taken.agent_id, template=taken.template, point=point, at=time.time(),
                                layers=layers, lower=lower, built=taken.built)
            part = own / f".{ABOUT}"
            part.write_text(json.dumps(asdict(snapshot)))
            os.replace(part, own / ABOUT)
        except BaseException:
            shutil.rmtree(own, ignore_errors=True)
            fork_layers.release(self.data_dir, holder)
            raise
        return snapshot

    def _frozen(self, taken: Taken, holder: str) -> fork_layers.Frozen | None:
        """An overlay home's tree now as layers, held by holder; None for a plain-folder home.
        Its new layer is made unnamed by any home, so none prunes it before the hold."""
        if taken.overlay is None or not (taken.overlay / "upper").is_dir():
            return None
        frozen = fork_layers.freeze_overlay(self.data_dir, taken.overlay, taken.home)
        if not frozen.above and frozen.lower is None:
            return None  # an overlay on nothing: kept as a checkpoint
        try:
            fork_layers.hold(self.data_dir, holder, [*frozen.above, *([frozen.lower] if frozen.lower else [])])
        except BaseException:
            if frozen.made is not None:
                fork_layers.prune(self.data_dir, [frozen.made])
            raise
        return frozen

    async def remove(self, snapshot: Snapshot) -> None:
        """Gone, with its files and its hold on its layers (the sandboxes made from it keep
        theirs: a layer a home stands on stays until that home is removed)."""
        if self._kept.pop(snapshot.raw, None) is None:
            return
        own = self.folder / snapshot.raw
        with contextlib.suppress(FileNotFoundError):
            os.unlink(own / ABOUT)  # no longer read back, even when the rest cannot be removed
        if self._users[snapshot.raw]:
            self._removed.add(snapshot.raw)
        else:
            await asyncio.to_thread(self._drop, snapshot)

    def _drop(self, snapshot: Snapshot) -> None:
        shutil.rmtree(self.folder / snapshot.raw, ignore_errors=True)
        fork_layers.release(self.data_dir, f"{self.HOLDER_PREFIX}{snapshot.raw}")
