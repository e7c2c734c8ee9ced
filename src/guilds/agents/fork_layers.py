"""The layers a fork freezes, stacked above a template's layer, kept while a home stands on them.

    name = freeze_upper(data_dir, upper)          what an overlay home changed (its upper), as a layer
    name = freeze_home(data_dir, home)            a whole home (a copy home, or a stack grown too tall)
    name = freeze_point(data_dir, store, point)   a checkpoint's tree (its objects linked, not copied)
    frozen = freeze_overlay(data_dir, own, home)  an overlay home now: its upper frozen, above its stack
    stack(data_dir, own) -> [path]                an overlay home's layers, the top one first
    with forks_lock(data_dir): link(own, names)   an overlay home's fork layers named, under the lock
    prune(data_dir, names)                        each removed once no home names it
    hold(data_dir, holder, names)                 layers kept for something other than a home
    release(data_dir, holder)                     no longer: each pruned once nothing uses it

Under the data folder::

    agent-layers/fork-<16 hex>/     one frozen layer: every file root's, as in a template's layer
    agent-layers/forks.lock         held (flock) while homes name fork layers or one is pruned
    agent-overlays/<agent>/above    the fork layers the agent's home stands on, top first, one a
                                    line, above the template's layer its ``lower`` link names
    agent-layers/held/<holder>      the layers a holder keeps (fork and template layers), one a
                                    line: an E2B snapshot's (``guilds.fronts.e2b.snapshots``)

A layer frozen from an upper keeps overlayfs's own marks as the upper held
them (whiteouts, opaque folders, renamed folders' redirects), so the same
overlay mounted over it and the layers below it shows the source's tree. A
layer is made beside its place and renamed into it, then never written; a home
changing it copies the file up into its own upper, as from a template's layer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ..checkpoints import home_tree, overlay_tree
from ..limits import FORK_MAX_LAYERS
from . import home_layers
from .home_layers import HELD_FOLDER, LAYERS_FOLDER, LOWER_LINK, OVERLAYS_FOLDER, all_root, copy_tree

if TYPE_CHECKING:
    from ..checkpoints.point_store import CheckpointStore

ABOVE_FILE = "above"
FORK_PREFIX = "fork-"
LOCK_NAME = "forks.lock"


def _overlay_home(own: Path, home: str) -> overlay_tree.OverlayHome | None:
    """The checkpoints' view of an overlay home: its upper and layers, when it is mounted."""
    from . import mounts

    if not (own / "upper").is_dir() or not mounts.mounted(home):
        return None
    layers = [os.path.realpath(layer) for layer in stack(own.parent.parent, own)]
    return overlay_tree.OverlayHome(str(own / "upper"), layers, mounts.layers_view)


overlay_tree.serve_overlays(_overlay_home)


def layers_dir(data_dir: Path) -> Path:
    return data_dir / LAYERS_FOLDER


def stack(data_dir: Path, own: Path) -> list[Path]:
    """The layers an overlay home's own folder names, the top one first: its fork layers,
    then its template's layer (when it has one)."""
    paths = [layers_dir(data_dir) / name for name in above(own)]
    if os.path.lexists(own / LOWER_LINK):
        paths.append(own / LOWER_LINK)
    return paths


def above(own: Path) -> list[str]:
    """The fork layers an overlay home's own folder names, top first (none: a plain home's)."""
    try:
        return (own / ABOVE_FILE).read_text().split()
    except FileNotFoundError:
        return []


def link(own: Path, names: list[str]) -> None:
    """Name the fork layers the home stands on (call under ``forks_lock``)."""
    if names:
        (own / ABOVE_FILE).write_text("".join(f"{name}\n" for name in names))


@contextlib.contextmanager
def forks_lock(data_dir: Path) -> Iterator[None]:
    folder = layers_dir(data_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(folder / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _made(data_dir: Path) -> Iterator[tuple[Path, str]]:
    """A new layer's folder to fill (not made yet), then all root's and renamed into place."""
    name = f"{FORK_PREFIX}{secrets.token_hex(8)}"
    folder = layers_dir(data_dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    part = folder / f".{name}.part"
    try:
        yield part, name
        all_root(part)
        part.rename(folder / name)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise


def freeze_upper(data_dir: Path, upper: Path) -> str:
    """A layer of what an overlay home changed: a copy of its upper, overlayfs's marks kept (a
    file holding its metadata only stays so: its data is the layers' below, read through them)."""
    with _made(data_dir) as (part, name):
        copy_tree(upper, part, holes=True)
    return name


def freeze_home(data_dir: Path, home: Path) -> str:
    """A layer of a whole home as it is now."""
    with _made(data_dir) as (part, name):
        copy_tree(home, part)
    return name


def freeze_point(data_dir: Path, store: CheckpointStore, point_id: str) -> str:
    """A layer of the home as the checkpoint kept it; its files are hard links to the
    checkpoint's objects (which are never written, as a layer's files are not) where the
    filesystem allows, copies elsewhere."""
    with _made(data_dir) as (part, name), store.holding():
        write_point(str(part), str(store.objects), store.tree_of(point_id), link_objects=True)
    return name


def write_point(target: str, objects: str, tree: home_tree.Tree, *, link_objects: bool = False) -> None:
    """The checkpoint's tree into target (made when missing, else empty): every folder, file
    and link, modes and times as kept; an overlay home's (its upper's) with overlayfs's marks."""
    os.makedirs(target, 0o700, exist_ok=True)
    if not link_objects:
        home_tree.restore(target, objects, tree)
        return
    for rel, entry in sorted(tree.items()):
        path = os.path.join(target, rel)
        if not rel:
            continue
        if entry.kind == "d":
            os.mkdir(path, 0o700)
            overlay_tree.mark_folder(path, entry)
        elif entry.kind == overlay_tree.WHITEOUT:
            os.mknod(path, stat.S_IFCHR | 0o600, 0)
        elif entry.kind == "l":
            os.symlink(entry.ref, path)
        elif entry.ref == overlay_tree.LAYER_DATA:
            overlay_tree.write_metacopy(path, entry.size)
        else:
            try:
                os.link(os.path.join(objects, entry.ref), path)
            except OSError:  # another filesystem, or the object's links at their limit
                home_tree.write_file(path, objects, entry)
    for rel, entry in sorted(tree.items(), key=lambda item: len(item[0]), reverse=True):
        path = os.path.join(target, rel) if rel else target
        if entry.kind == overlay_tree.WHITEOUT:
            continue
        if entry.kind != "l":
            os.chmod(path, entry.mode)
        os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


@dataclass(frozen=True)
class Frozen:
    """An overlay home's tree at one moment, as layers."""

    above: list[str]
    """Its fork layers, top first."""
    lower: str | None
    """The template's layer below them (its name), if any."""
    made: str | None
    """The layer frozen for it (None: its upper was empty, its stack is the home's own)."""


def freeze_overlay(data_dir: Path, own: Path, home: Path) -> Frozen:
    """The overlay home (own: its own folders) as it is now: its upper frozen as a new layer
    above the layers it stands on; an empty upper adds none; a stack that would pass
    FORK_MAX_LAYERS is the whole home frozen as one layer instead."""
    lower = os.path.basename(os.readlink(own / LOWER_LINK)) if os.path.lexists(own / LOWER_LINK) else None
    stood_on = above(own)
    if not os.listdir(own / "upper"):
        return Frozen(stood_on, lower, None)
    if len(stood_on) + 2 > FORK_MAX_LAYERS:
        name = freeze_home(data_dir, home)
        return Frozen([name], None, name)
    name = freeze_upper(data_dir, own / "upper")
    return Frozen([name, *stood_on], lower, name)


def lower_link(name: str) -> str:
    """What an overlay home's ``lower`` link holds to name the template layer ``name``."""
    return os.path.join("..", "..", LAYERS_FOLDER, name)


def _held_file(data_dir: Path, holder: str) -> Path:
    return layers_dir(data_dir) / HELD_FOLDER / holder


def hold(data_dir: Path, holder: str, names: list[str]) -> None:
    """Keep the layers names (fork layers and a template's layer) for holder until its
    ``release``: no prune removes them meanwhile. Call while they are in use otherwise (a home
    stands on them, or they were just frozen)."""
    with forks_lock(data_dir):
        folder = layers_dir(data_dir) / HELD_FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        part = folder / f".{holder}.part"
        part.write_text("".join(f"{name}\n" for name in names))
        part.replace(folder / holder)


def holders(data_dir: Path) -> list[str]:
    """Those holding layers."""
    try:
        return sorted(name for name in os.listdir(layers_dir(data_dir) / HELD_FOLDER) if not name.startswith("."))
    except FileNotFoundError:
        return []


def release(data_dir: Path, holder: str) -> None:
    """The holder's layers let go: each removed once no home stands on it and nothing else
    holds it (a template's layer only when a newer one exists: ``home_layers.prune``)."""
    with forks_lock(data_dir):
        try:
            names = _held_file(data_dir, holder).read_text().split()
        except FileNotFoundError:
            return
        _held_file(data_dir, holder).unlink()
    prune(data_dir, [name for name in names if name.startswith(FORK_PREFIX)])
    for name in names:
        if not name.startswith(FORK_PREFIX):
            home_layers.prune(data_dir, name)


def in_use(data_dir: Path) -> set[str]:
    """The fork layers some overlay home names or something holds."""
    used = home_layers.held(data_dir)
    with contextlib.suppress(FileNotFoundError):
        for agent in os.scandir(data_dir / OVERLAYS_FOLDER):
            used.update(above(Path(agent.path)))
    return used


def prune(data_dir: Path, names: list[str]) -> list[str]:
    """Remove each fork layer of names no home names any more; those removed."""
    gone: list[str] = []
    if not names:
        return gone
    with forks_lock(data_dir):
        used = in_use(data_dir)
        for name in names:
            if name.startswith(FORK_PREFIX) and name not in used and (layers_dir(data_dir) / name).is_dir():
                shutil.rmtree(layers_dir(data_dir) / name, ignore_errors=True)
                gone.append(name)
    return gone
