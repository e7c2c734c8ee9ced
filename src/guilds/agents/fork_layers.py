"""The layers a fork freezes, stacked above a template's layer, kept while a home stands on them.

    name = freeze_upper(data_dir, upper)          what an overlay home changed (its upper), as a layer
    name = freeze_home(data_dir, home)            a whole home (a copy home, or a stack grown too tall)
    name = freeze_point(data_dir, store, point)   a checkpoint's tree (its objects linked, not copied)
    stack(data_dir, own) -> [path]                an overlay home's layers, the top one first
    with forks_lock(data_dir): link(own, names)   an overlay home's fork layers named, under the lock
    prune(data_dir, names)                        each removed once no home names it

Under the data folder::

    agent-layers/fork-<16 hex>/     one frozen layer: every file root's, as in a template's layer
    agent-layers/forks.lock         held (flock) while homes name fork layers or one is pruned
    agent-overlays/<agent>/above    the fork layers the agent's home stands on, top first, one a
                                    line, above the template's layer its ``lower`` link names

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
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ..checkpoints import home_tree, overlay_tree
from .home_layers import LAYERS_FOLDER, LOWER_LINK, OVERLAYS_FOLDER, all_root, copy_tree

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
    """A layer of what an overlay home changed: a copy of its upper, overlayfs's marks kept."""
    with _made(data_dir) as (part, name):
        copy_tree(upper, part)
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


def in_use(data_dir: Path) -> set[str]:
    """The fork layers some overlay home names."""
    used: set[str] = set()
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
