"""An overlay home's checkpoint: its upper folder only, and a rewind of what differs.

    save(upper, objects, previous, made) -> Tree   the upper's entries, overlayfs's marks read
    restore(home, view, objects, kept, upper) -> n the merged home made what it was at ``kept``

An overlay home (``guilds.agents.homes``) is its layers, which never change, under
its own upper folder, which holds everything the agent changed since the home was
made: files copied up or new, a whiteout (a character device 0:0) for each path
deleted from the layers, and folders overlayfs marks with extended attributes: an
opaque one (``trusted.overlay.opaque``: the layers' folder of that name is hidden)
and a renamed one (``trusted.overlay.redirect``: its contents are the layers' folder
the redirect names). A checkpoint walks the upper only and keeps its entries as
``home_tree`` does (``w`` a whiteout; a folder's ``ref`` is ``opaque`` or
``redirect:<path>``); the layers it stands on are named beside the tree.

A rewind never writes the upper: overlayfs leaves changes to an upper under a
mounted overlay undefined. It writes through the merged home, and only the paths
whose merged state can differ between now and the checkpoint: every path the two
uppers hold differently, the folders above them (their times), and, below a
folder whose layers' contents differ between the two (deleted, made opaque,
renamed), the layers' own paths there. A path in neither upper under a folder
that draws on the same layers' folder in both is the layers' and already right.
The layers are read through ``view``: a read-only view of them as the home shows
them (owners mapped as in the home), never the home itself.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from . import home_tree as trees
from .home_tree import Entry, Tree


@dataclass(frozen=True)
class OverlayHome:
    """A mounted overlay home as its checkpoints see it."""

    upper: str
    layers: list[str]
    """Its layers' real paths, the top one first."""
    view: Callable[[list[str], tuple[int, int]], int]
    """A read-only view of layers as the home shows them (files root's on disk shown as the
    owner's): a detached mount's fd, read through ``/proc/self/fd/<fd>``, closed by the caller."""


Finder = Callable[[Path, str], "OverlayHome | None"]
"""(the home's own overlay folder, the home) -> the overlay, or None: not a mounted one."""
_finders: list[Finder] = []


def serve_overlays(finder: Finder) -> None:
    """The agents' homes tell the checkpoints which homes are overlays (they stand on the
    checkpoints, never the reverse): one finder per process."""
    if finder not in _finders:
        _finders.append(finder)


def overlay_of(own: Path | None, home: str) -> OverlayHome | None:
    """The home's overlay when it is a mounted one, else None (a plain folder's home)."""
    if own is None:
        return None
    for finder in _finders:
        if (found := finder(own, home)) is not None:
            return found
    return None


OPAQUE_XATTR = "trusted.overlay.opaque"
REDIRECT_XATTR = "trusted.overlay.redirect"
OPAQUE, REDIRECT = "opaque", "redirect:"
WHITEOUT = "w"


def _folder_mark(path: str) -> str:
    """The folder's ref: ``opaque``, ``redirect:<path>``, or "" (a plain folder)."""
    try:
        if os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y":
            return OPAQUE
    except OSError:
        pass
    try:
        return REDIRECT + os.fsdecode(os.getxattr(path, REDIRECT_XATTR, follow_symlinks=False))
    except OSError:
        return ""


def mark_folder(path: str, entry: Entry) -> None:
    """The folder's overlayfs mark set again, as its entry keeps it (a layer frozen from it)."""
    if entry.ref == OPAQUE:
        os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)
    elif entry.ref.startswith(REDIRECT):
        os.setxattr(path, REDIRECT_XATTR, os.fsencode(entry.ref[len(REDIRECT):]), follow_symlinks=False)


METACOPY_XATTR = "trusted.overlay.metacopy"
"""On an upper's file whose data is still the layers' (a change of its metadata only)."""
LAYER_DATA = "@layers"
"""A file entry's ref for such a file: its data is the layers' at the path the home shows
there (no object is kept; an object's name is hex)."""


def is_metacopy(path: str) -> bool:
    """The upper's file holds its metadata only (``METACOPY_XATTR``)."""
    try:
        os.getxattr(path, METACOPY_XATTR, follow_symlinks=False)
    except OSError:
        return False
    return True


def write_metacopy(path: str, size: int) -> None:
    """A file of size bytes holding no data, marked as holding its metadata only: in a layer
    frozen from a checkpoint, its data is read in the layers below, as in the upper it came from."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    os.setxattr(path, METACOPY_XATTR, b"", follow_symlinks=False)


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def save(upper: str, objects: str, previous: Tree, made: list[str], *, copy: bool = True,
         merged: str | None = None) -> Tree:
    """The upper's tree (``home_tree.save``'s, whiteouts and folders' marks included);
    copy=False: no content kept, a file's entry holds its stat key only (to compare).
    merged: the mounted home. A file the upper holds the metadata of only (``METACOPY_XATTR``:
    its data still the layers') names the layers' data (``_keep_metacopy``); one also renamed
    is read through merged, which must then be given."""
    tree: Tree = {}
    for rel, st in trees.walk(upper):
        if is_whiteout(st):
            tree[rel] = Entry(WHITEOUT, 0, st.st_uid, st.st_gid, st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode):
            mark = _folder_mark(os.path.join(upper, rel) if rel else upper) if rel else ""
            tree[rel] = trees.entry_of(st, "d", ref=mark)
        elif copy and stat.S_ISREG(st.st_mode) and is_metacopy(os.path.join(upper, rel)):
            _keep_metacopy(upper, rel, st, objects, previous, made, tree, merged)
        elif copy:
            trees.keep_path(upper, rel, st, objects, previous, made, tree)
        elif (kind := trees.kind_of(st.st_mode)) is not None:
            ref = os.readlink(os.path.join(upper, rel)) if kind == "l" else ""
            tree[rel] = trees.entry_of(st, kind, size=st.st_size, ref=ref,
                                       key=(st.st_dev, st.st_ino, st.st_ctime_ns) if kind == "f" else None)
    return tree


def _keep_metacopy(upper: str, rel: str, st: os.stat_result, objects: str, previous: Tree, made: list[str],
                   tree: Tree, merged: str | None) -> None:
    """A file the upper holds the metadata of only: its data is the layers' at the path the home
    shows there, which never change, so the entry names them (``LAYER_DATA``) and keeps no copy;
    one renamed (its own redirect) is read through the mounted home and kept as any file."""
    try:
        os.getxattr(os.path.join(upper, rel), REDIRECT_XATTR, follow_symlinks=False)
    except OSError:
        tree[rel] = trees.entry_of(st, "f", size=st.st_size, ref=LAYER_DATA,
                                   key=(st.st_dev, st.st_ino, st.st_ctime_ns))
        return
    if merged is None:
        raise OSError(f"{rel} holds its metadata only, and no mounted home to read its data through")
    trees.keep_path(upper, rel, st, objects, previous, made, tree, read_from=merged)


def _same(a: Entry | None, b: Entry | None) -> bool:
    """Both uppers hold the path alike (a file: the same inode, untouched since it was kept)."""
    if a is None or b is None or a.kind != b.kind:
        return a is b
    if a.kind == "f":
        return a.key is not None and (a.key, a.size, a.mtime_ns, a.mode, a.uid, a.gid) == (
            b.key, b.size, b.mtime_ns, b.mode, b.uid, b.gid)
    return a == b


def _join(folder: str | None, name: str) -> str | None:
    if folder is None:
        return None
    return f"{folder}/{name}" if folder else name


class _Side:
    """One upper (the checkpoint's or the current one) and what it makes of the layers."""

    def __init__(self, upper: Tree):
        self.upper = upper
        self._sources: dict[str, str | None] = {"": ""}

    def source(self, rel: str) -> str | None:
        """The layers' folder whose contents show at rel (None: none do)."""
        if rel in self._sources:
            return self._sources[rel]
        parent, name = posixpath.split(rel)
        above = self.source(parent)
        entry = self.upper.get(rel)
        if entry is None:
            found = _join(above, name)
        elif entry.kind != "d" or entry.ref == OPAQUE:
            found = None
        elif entry.ref.startswith(REDIRECT):
            target = entry.ref[len(REDIRECT):]
            found = target.lstrip("/") if target.startswith("/") else _join(above, target)
        else:
            found = _join(above, name)
        self._sources[rel] = found
        return found


class _Layers:
    """The layers' paths, read through the view; a path is looked up only below folders
    (never through a link: a link of the layers may name anything on the host). The layers
    never change, so what was looked up once stays true."""

    def __init__(self, view: str):
        self.view = os.path.join(view, ".")  # the folder itself, were view a link (/proc/self/fd/N)
        self._seen: dict[str, os.stat_result | None] = {}

    def stat(self, rel: str) -> os.stat_result | None:
        if rel in self._seen:
            return self._seen[rel]
        found = None
        parent = posixpath.dirname(rel) if rel else None
        if parent is None or ((above := self.stat(parent)) is not None and stat.S_ISDIR(above.st_mode)):
            try:
                found = os.lstat(self.path(rel))
            except (FileNotFoundError, NotADirectoryError):
                found = None
        self._seen[rel] = found
        return found

    def path(self, rel: str) -> str:
        return os.path.join(self.view, rel) if rel else self.view

    def entry(self, rel: str | None) -> tuple[Entry, str] | None:
        """The layers' entry at rel (as the home shows it) and its path in the view."""
        st = None if rel is None else self.stat(rel)
        kind = None if st is None else trees.kind_of(st.st_mode)
        if st is None or kind is None or rel is None:
            return None
        path = self.path(rel)
        ref = os.readlink(path) if kind == "l" else ""
        return trees.entry_of(st, kind, size=st.st_size, ref=ref), path

    def names(self, rel: str | None) -> list[str]:
        st = None if rel is None else self.stat(rel)
        if rel is None or st is None or not stat.S_ISDIR(st.st_mode):
            return []
        return os.listdir(self.path(rel))


def _differing(kept: _Side, now: _Side, view: _Layers) -> Iterator[str]:
    """Every path whose merged state may differ between the two sides."""
    pending = sorted({rel for rel in {*kept.upper, *now.upper} if not _same(kept.upper.get(rel), now.upper.get(rel))})
    seen: set[str] = set()
    while pending:
        rel = pending.pop()
        if rel in seen:
            continue
        seen.add(rel)
        yield rel
        a, b = kept.source(rel), now.source(rel)
        if a != b:  # the layers' contents below rel differ: their paths there are in play too
            for name in {*view.names(a), *view.names(b)}:
                pending.append(_join(rel, name) or name)


def _target(kept: _Side, view: _Layers, rel: str) -> tuple[Entry, str | None] | None:
    """What rel was at the checkpoint: its entry and, for a file of the layers, its path."""
    entry = kept.upper.get(rel)
    if entry is not None:
        return None if entry.kind == WHITEOUT else (entry, None)
    parent = posixpath.dirname(rel)
    if rel and (kept.source(parent) is None or (parent and _target(kept, view, parent) is None)):
        return None
    found = view.entry(_join(kept.source(parent), posixpath.basename(rel)) if rel else "")
    return None if found is None else found


def _layers_file(kept: _Side, view: _Layers, rel: str) -> str:
    """The layers' file whose data a ``LAYER_DATA`` entry at rel holds, as the checkpoint's upper
    showed the layers there; OSError when the layers hold no file there."""
    found = view.entry(_join(kept.source(posixpath.dirname(rel)), posixpath.basename(rel)))
    if found is None or found[0].kind != "f":
        raise OSError(f"{rel}: its data is the layers', and they hold no file there")
    return found[1]


def restore(home: str, view: str, objects: str, kept: Tree, upper_now: Tree) -> int:
    """Make the merged home what it was when ``kept`` (an upper's tree) was taken; ``upper_now``
    is the upper's tree now. The number of paths written or removed."""
    old, new, layers = _Side(kept), _Side(upper_now), _Layers(view)
    paths = set(_differing(old, new, layers))
    for rel in list(paths):
        above = rel
        while above:
            above = posixpath.dirname(above)
            paths.add(above)
    targets = {rel: _target(old, layers, rel) for rel in paths}
    now: dict[str, os.stat_result] = {}
    for rel in paths:
        try:
            now[rel] = os.lstat(os.path.join(home, rel) if rel else home)
        except (FileNotFoundError, NotADirectoryError):
            pass
    changed = 0
    for rel in sorted(paths, key=len, reverse=True):
        st, want = now.get(rel), targets[rel]
        if rel and st is not None and (want is None or trees.kind_of(st.st_mode) != want[0].kind):
            path = os.path.join(home, rel)
            if os.path.lexists(path):
                trees.remove_path(path, st)
                changed += 1
            del now[rel]
    for rel in sorted(paths):  # a parent sorts before its children
        want = targets[rel]
        if want is None or not rel:
            continue
        entry, lower_file = want
        path, st = os.path.join(home, rel), now.get(rel)
        if entry.kind == "d":
            if st is None:
                os.mkdir(path, 0o700)
                changed += 1
        elif entry.kind == "l":
            if st is None or os.readlink(path) != entry.ref:
                if st is not None:
                    os.unlink(path)
                os.symlink(entry.ref, path)
                changed += 1
        else:
            if lower_file is None and entry.ref == LAYER_DATA:
                lower_file = _layers_file(old, layers, rel)
            if lower_file is None:
                trees.write_file(path, objects, entry)
            else:
                trees.write_file(path, "", entry, source=lower_file)
            changed += 1
    for rel in sorted(paths, key=len, reverse=True):
        want = targets[rel]
        if rel and want is not None:
            trees.set_attrs(os.path.join(home, rel), want[0])
    return changed
