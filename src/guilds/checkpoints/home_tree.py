"""A home's files as a checkpoint holds them, and putting them back.

    walk(home) -> {path: Entry}            every folder, file and link, links never followed
    save(home, objects, previous) -> Tree  the walk, each file's content kept in ``objects``
    restore(home, objects, tree)           the home made what the tree says, byte for byte

An ``Entry`` holds a path's kind (``d``, ``f``, ``l``), mode, owner, mtime and
size, a link's target, a file's object (the name of its content's copy in
``objects``) and its stat key (device, inode, ctime): the kernel moves ctime on
every write, chmod and rename, and no call can set it back, so a file whose key,
size and mtime are those of an earlier checkpoint holds the same bytes and its
object is shared instead of copied again. A file that changed while it was copied
(a background command writing) keeps the copy as read but no key, so the next
checkpoint copies it again, and a rewind always writes it back.

Objects are copies, never hard links to the home's files (a command writing in
place would change the checkpoint): a reflink (FICLONE) where the filesystem
shares blocks, else an in-kernel copy (copy_file_range). They are written once
and never changed; a tree only names them.

A restore touches only what differs: a file whose key still matches is left
alone, a changed or missing one is written from its object to a new name beside
it and renamed over, what the tree does not hold is removed, and modes, owners
and times are set last, folders deepest first; the home folder's own owner and
mode stay as the sandbox set them. A running process's memory is
not part of any of this.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shutil
import stat
from dataclasses import dataclass
from typing import Iterator

FICLONE = 0x40049409
"""linux/fs.h: share the source's blocks (btrfs, XFS, bcachefs); ext4 answers EOPNOTSUPP."""
COPY_CHUNK = 1 << 30
"""copy_file_range's request size: the kernel copies in one call what it can."""
_IS_ROOT = os.geteuid() == 0


@dataclass(frozen=True)
class Entry:
    kind: str
    """d (a folder), f (a regular file), l (a symbolic link); other kinds are not kept."""
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    ref: str = ""
    """A file's object name; a link's target."""
    key: tuple[int, int, int] | None = None
    """A file's (st_dev, st_ino, st_ctime_ns) when it was kept; None: copied while it changed."""

    def row(self) -> list:
        return [self.kind, self.mode, self.uid, self.gid, self.mtime_ns, self.size, self.ref,
                list(self.key) if self.key else None]

    @classmethod
    def from_row(cls, row: list) -> Entry:
        kind, mode, uid, gid, mtime_ns, size, ref, key = row
        return cls(kind, mode, uid, gid, mtime_ns, size, ref, tuple(key) if key else None)

    def same_file(self, st: os.stat_result) -> bool:
        """st is this entry's file, untouched since it was kept."""
        return (self.key is not None and stat.S_ISREG(st.st_mode)
                and (st.st_dev, st.st_ino, st.st_ctime_ns) == self.key
                and st.st_size == self.size and st.st_mtime_ns == self.mtime_ns)


Tree = dict[str, Entry]
"""Path relative to the home ("" is the home itself) -> its entry."""


def kind_of(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISLNK(mode):
        return "l"
    return None


def walk(home: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of the home and everything under it, parents first."""
    yield "", os.lstat(home)
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(home, rel) if rel else home) as entries:
            for item in entries:
                path = f"{rel}/{item.name}" if rel else item.name
                st = item.stat(follow_symlinks=False)
                yield path, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(path)


def entry_of(st: os.stat_result, kind: str, **extra) -> Entry:
    return Entry(kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, **extra)


def copy_content(src: int, dst: int) -> None:
    """src's bytes into the empty dst: a reflink where the filesystem has them, else in the
    kernel (copy_file_range; sendfile between filesystems that cannot share it)."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
            raise
    try:
        while os.copy_file_range(src, dst, COPY_CHUNK):
            pass
    except OSError as exc:  # another filesystem (EXDEV), or one without it
        if exc.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        offset = os.lseek(dst, 0, os.SEEK_END)
        while os.sendfile(dst, src, offset, COPY_CHUNK):
            offset = os.lseek(dst, 0, os.SEEK_END)


def _keep_file(home: str, rel: str, st: os.stat_result, objects: str, made: list[str],
               read_from: str | None = None) -> Entry | None:
    """A copy of the file into objects; None when it went away before it could be opened.
    read_from: the folder its content is read in instead (the same rel), its key and
    stability still home's file's (an overlay's upper file holding its metadata only)."""
    try:
        src = os.open(os.path.join(read_from or home, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        name = secrets.token_hex(12)
        dst = os.open(os.path.join(objects, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(name)
        try:
            copy_content(src, dst)
            size = os.fstat(dst).st_size
        finally:
            os.close(dst)
        after = os.fstat(src) if read_from is None else _lstat(os.path.join(home, rel))
    finally:
        os.close(src)
    stable = after is not None and (after.st_ino, after.st_ctime_ns, after.st_size) == (
        st.st_ino, st.st_ctime_ns, size)
    after = after or st
    return entry_of(after if stable else st, "f", size=size, ref=name,
                  key=(st.st_dev, st.st_ino, st.st_ctime_ns) if stable else None)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def save(home: str, objects: str, previous: Tree, made: list[str]) -> Tree:
    """The home's tree, each file's content shared from ``previous`` when its key matches,
    else copied into ``objects`` (each new object's name appended to ``made``, so a
    failure can take them back). A path gone between the walk and its copy is left out."""
    tree: Tree = {}
    for rel, st in walk(home):
        if stat.S_ISDIR(st.st_mode):
            tree[rel] = entry_of(st, "d")
        else:
            keep_path(home, rel, st, objects, previous, made, tree)
    return tree


def keep_path(home: str, rel: str, st: os.stat_result, objects: str, previous: Tree, made: list[str],
              tree: Tree, *, read_from: str | None = None) -> None:
    """A file (its object shared from ``previous`` or copied) or a link into tree; other kinds
    and a path gone meanwhile are left out. read_from: see ``_keep_file``."""
    kind = kind_of(st.st_mode)
    if kind == "f":
        earlier = previous.get(rel)
        if earlier is not None and earlier.same_file(st):
            tree[rel] = earlier
        elif (kept := _keep_file(home, rel, st, objects, made, read_from)) is not None:
            tree[rel] = kept
    elif kind == "l":
        with contextlib.suppress(FileNotFoundError):
            tree[rel] = entry_of(st, "l", ref=os.readlink(os.path.join(home, rel)))


def remove_path(path: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def write_file(path: str, objects: str, entry: Entry, *, source: str | None = None) -> None:
    """The object's bytes (or those of the file at ``source``) to a new name beside path,
    then renamed over it."""
    part = f"{path}.rewind-{secrets.token_hex(4)}"
    src = os.open(source or os.path.join(objects, entry.ref), os.O_RDONLY | os.O_NOFOLLOW)
    try:
        dst = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            copy_content(src, dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.rename(part, path)


def set_attrs(path: str, entry: Entry) -> None:
    if _IS_ROOT:
        os.lchown(path, entry.uid, entry.gid)
    if entry.kind != "l":
        os.chmod(path, entry.mode)
    os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


def restore(home: str, objects: str, tree: Tree) -> int:
    """Make the home hold exactly ``tree``; the number of paths written or removed."""
    now = dict(walk(home))
    changed = 0
    for rel in sorted((r for r in now if r not in tree or kind_of(now[r].st_mode) != tree[r].kind),
                      key=len, reverse=True):
        path = os.path.join(home, rel)
        if os.path.lexists(path):
            remove_path(path, now[rel])
            changed += 1
    for rel, entry in sorted(tree.items()):  # a parent sorts before its children
        path = os.path.join(home, rel) if rel else home
        st = now.get(rel)
        fresh = st is None or kind_of(st.st_mode) != entry.kind
        if entry.kind == "d":
            if fresh:
                os.mkdir(path, 0o700)
        elif entry.kind == "l":
            if fresh or os.readlink(path) != entry.ref:
                if not fresh:
                    os.unlink(path)
                os.symlink(entry.ref, path)
            else:
                continue
        elif fresh or not entry.same_file(st):  # type: ignore[arg-type]
            write_file(path, objects, entry)
        else:
            continue
        changed += 1
    for rel, entry in sorted(tree.items(), key=lambda item: len(item[0]), reverse=True):
        st = now.get(rel)
        if not rel or (entry.kind == "f" and st is not None and entry.same_file(st)):
            continue  # the home itself is the sandbox's: its owner and mode stay as the sandbox set them
        set_attrs(os.path.join(home, rel), entry)
    return changed
