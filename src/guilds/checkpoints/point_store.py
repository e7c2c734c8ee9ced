"""An agent's checkpoints on disk: ``<data>/checkpoints/<agent id>/``, in the
orchestrator's private data folder, which no sandbox can see (bwrap hides it,
docker and kubernetes never mount it).

    objects/        each kept file's content once, named at random, never changed
    trees/<id>.json one checkpoint's tree (``tree.Tree``) and the objects it owns
    index.json      the checkpoints, oldest first: id, name, run, seq, moment, at,
                    files, bytes (what its own objects hold)
    take.lock       flock'd while a checkpoint is taken, pruned or rewound to

For an overlay home (``guilds.agents.homes``) a checkpoint keeps only the home's
upper folder, and its tree names the layers it stands on (``layers``):
``overlay_tree`` walks and rewinds it. A plain folder's home is walked whole.

A checkpoint shares the objects of the one before it for files that did not
change (``tree.save``), so an object is named by a run of consecutive
checkpoints and owned by the oldest of them: pruning the oldest hands the
objects its successor still names over to it, and removes the rest. The size
of the store is the sum of what each checkpoint owns.

A take that fails (a full disk) removes what it wrote and leaves the index as
it was: the earlier checkpoints are whole. CheckpointError says so in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from ..errors import GuildsError
from . import home_tree as trees
from . import overlay_tree

OVERLAYS_FOLDER = "agent-overlays"
"""Under the data folder: each overlay home's own folders (``guilds.agents.home_layers``)."""

HOME_MODE = 0o700
"""A home made by the first checkpoint (the sandbox gives it to the agent when it starts)."""


class CheckpointError(GuildsError):
    """A checkpoint that cannot be taken or rewound to: one line saying why."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint as the index holds it."""

    id: str
    at: float
    """Seconds since the epoch when it was taken."""
    files: int
    bytes: int
    """What its own objects hold (shared ones count once, with the oldest holder)."""
    name: str | None = None
    run_id: str | None = None
    seq: int | None = None
    moment: str = "named"
    """before (a call's start), after (code_task's end), named (asked for by name)."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class CheckpointStore:
    """One agent's checkpoints, at ``root``; ``home`` is the host folder they keep."""

    def __init__(self, root: str | os.PathLike, home: str | os.PathLike, overlay: Path | None = None):
        self.root = Path(root)
        self.home = str(home)
        self.overlay = overlay
        """The home's own overlay folders (upper, work, its layers' names) when it may be one."""
        self.objects = self.root / "objects"
        self.trees = self.root / "trees"
        self._newest: tuple[str, trees.Tree] | None = None

    @classmethod
    def of_agent(cls, data_dir: str | os.PathLike, agent_id: str, home: str | os.PathLike) -> CheckpointStore:
        return cls(Path(data_dir) / "checkpoints" / agent_id, home,
                   Path(data_dir) / OVERLAYS_FOLDER / Path(home).name)

    def layers(self) -> list[str] | None:
        """The layers the home stands on, top first, when it is a mounted overlay; else None."""
        found = overlay_tree.overlay_of(self.overlay, self.home)
        return None if found is None else found.layers

    def layers_of(self, point_id: str) -> list[str] | None:
        """The layers the checkpoint's tree (an upper's) stands on; None: a whole home's tree."""
        return self._load(point_id).get("layers")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        for folder in (self.objects, self.trees):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / "take.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """The store's lock held: no checkpoint is taken, pruned or rewound to meanwhile."""
        return self._locked()

    def points(self) -> list[Checkpoint]:
        """Every checkpoint kept, oldest first."""
        try:
            rows = json.loads((self.root / "index.json").read_text())
        except FileNotFoundError:
            return []
        return [Checkpoint(**row) for row in rows]

    def _write_index(self, points: list[Checkpoint]) -> None:
        self._write_json(self.root / "index.json", [asdict(p) for p in points])

    @staticmethod
    def _write_json(path: Path, value: object) -> None:
        part = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            part.write_text(json.dumps(value, separators=(",", ":")))
            os.replace(part, path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise

    def _load(self, point_id: str) -> dict:
        return json.loads((self.trees / f"{point_id}.json").read_text())

    def tree_of(self, point_id: str) -> trees.Tree:
        """The checkpoint's tree; the newest one this store took or read is kept in memory."""
        if self._newest is not None and self._newest[0] == point_id:
            return self._newest[1]
        tree = {rel: trees.Entry.from_row(row) for rel, row in self._load(point_id)["entries"].items()}
        self._newest = (point_id, tree)
        return tree

    def take(self, *, name: str | None = None, run_id: str | None = None, seq: int | None = None,
             moment: str = "named", max_count: int, max_bytes: int) -> Checkpoint:
        """Keep the home now; prune the oldest past max_count checkpoints or max_bytes."""
        try:
            with self._locked():
                points = self.points()
                previous = self.tree_of(points[-1].id) if points else {}
                made: list[str] = []
                try:
                    point = self._save(points, previous, made, name=name, run_id=run_id, seq=seq, moment=moment)
                except BaseException:
                    self._drop_objects(made)
                    raise
                self._prune(points, max_count, max_bytes)
                return point
        except OSError as exc:
            raise CheckpointError(f"cannot take a checkpoint of {self.home}: {_reason(exc)}") from None

    def _save(self, points: list[Checkpoint], previous: trees.Tree, made: list[str], **about) -> Checkpoint:
        at = time.time()
        os.makedirs(self.home, HOME_MODE, exist_ok=True)  # before a sandbox's first start: an empty home
        overlay = overlay_tree.overlay_of(self.overlay, self.home)
        layers = None if overlay is None else overlay.layers
        if overlay is None:
            kept = trees.save(self.home, str(self.objects), previous, made)
        else:
            kept = overlay_tree.save(overlay.upper, str(self.objects), previous, made, merged=str(self.home))
        self._newest = None
        owned = set(made)
        size = sum(e.size for e in kept.values() if e.kind == "f" and e.ref in owned)
        point = Checkpoint(id=f"k{secrets.token_hex(6)}", at=at, files=len(kept), bytes=size, **about)
        about_tree = {"entries": {rel: e.row() for rel, e in kept.items()}, "owned": sorted(owned)}
        if layers is not None:
            about_tree["layers"] = layers
        self._write_json(self.trees / f"{point.id}.json", about_tree)
        try:
            self._write_index([*points, point])
        except BaseException:
            (self.trees / f"{point.id}.json").unlink(missing_ok=True)
            raise
        points.append(point)
        self._newest = (point.id, kept)
        return point

    def _drop_objects(self, names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.objects / name).unlink()

    def _prune(self, points: list[Checkpoint], max_count: int, max_bytes: int) -> None:
        """Drop the oldest until at most max_count are kept and they hold at most max_bytes
        (the newest is always kept)."""
        while len(points) > 1 and (len(points) > max_count or sum(p.bytes for p in points) > max_bytes):
            self._drop_oldest(points)

    def _drop_oldest(self, points: list[Checkpoint]) -> None:
        oldest, heir = points[0], points[1]
        old, new = self._load(oldest.id), self._load(heir.id)
        named = {row[6] for row in new["entries"].values() if row[0] == "f"}
        handed = [name for name in old["owned"] if name in named]
        sizes = {row[6]: row[5] for row in new["entries"].values() if row[0] == "f"}
        new["owned"] = sorted({*new["owned"], *handed})
        self._write_json(self.trees / f"{heir.id}.json", new)
        points[1] = Checkpoint(**{**asdict(heir), "bytes": heir.bytes + sum(sizes[n] for n in handed)})
        del points[0]
        self._write_index(points)
        (self.trees / f"{oldest.id}.json").unlink(missing_ok=True)
        self._drop_objects([name for name in old["owned"] if name not in named])

    def rewind(self, point_id: str) -> int:
        """Make the home what it was at the checkpoint; the paths written or removed."""
        try:
            with self._locked():
                if point_id not in {p.id for p in self.points()}:
                    raise CheckpointError(f"no checkpoint {point_id!r} is kept for {self.home}")
                kept, stood_on = self.tree_of(point_id), self.layers_of(point_id)
                if stood_on is None:
                    return trees.restore(self.home, str(self.objects), kept)
                return self._rewind_overlay(kept, stood_on)
        except OSError as exc:
            raise CheckpointError(f"cannot rewind {self.home}: {_reason(exc)}") from None

    def _rewind_overlay(self, kept: trees.Tree, stood_on: list[str]) -> int:
        overlay = overlay_tree.overlay_of(self.overlay, self.home)
        if overlay is None or overlay.layers != stood_on:
            raise CheckpointError(f"cannot rewind {self.home}: it is not mounted on the layers "
                                  "its checkpoint was taken on")
        upper = overlay.upper
        owner = os.stat(upper)
        view = overlay.view(stood_on, (owner.st_uid, owner.st_gid))
        try:
            now = overlay_tree.save(upper, "", {}, [], copy=False)
            return overlay_tree.restore(self.home, f"/proc/self/fd/{view}", str(self.objects), kept, now)
        finally:
            os.close(view)

    def find(self, *, name: str | None = None, run_id: str | None = None, seq: int | None = None,
             moment: str | None = None) -> Checkpoint | None:
        """The newest checkpoint matching every given field."""
        for point in reversed(self.points()):
            if ((name is None or point.name == name) and (run_id is None or point.run_id == run_id)
                    and (seq is None or point.seq == seq) and (moment is None or point.moment == moment)):
                return point
        return None
