"""The Linux mount calls an agent's overlay home needs (root only), through libc.

    layer_fd = layer_mount(layer, owner)    the layer, read-only, its root-owned files shown as owner's
    layer_fds = layer_mounts(layers, owner) the same of each layer, one user namespace for all (kept per owner)
    mount_overlay(home, layer_fds, upper, work)  # the layers top first (one fd: one layer)
    mounted(path) -> bool                   a mount point in this mount namespace?
    overlay_homes() -> [path]               the overlay homes mounted in it
    unmount(path) -> bool                   gone; True when only a lazy detach could do it
    share_point(path)                       path a shared mount point of its own (a home a pool swaps)
    detach_overlay(path) -> bool            the overlay on top of path detached, its point kept
    propagates_to(path, pid, inside) -> bool  a mount on path reaches pid's namespace at inside

``layer_mount`` clones the layer's mount (``open_tree``) and, for an owner other
than root, makes the clone idmapped (``mount_setattr`` with MOUNT_ATTR_IDMAP and
a user namespace mapping 0 to the owner's uid and gid): a file root owns in the
layer is seen as the owner's, and the layer on disk is never written. The
overlay is made with the new mount API (``fsopen``, ``fsconfig``, ``fsmount``,
``move_mount``) and takes that detached clone as its lower layer by file
descriptor, so no mount of the layer is ever attached where a path could reach
it. The numbers are the kernel's generic syscall table's (the same on every
architecture since Linux 5.2).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Sequence

from ..errors import SandboxError

OVERLAY_SOURCE = "guilds-home"
"""The source every overlay home is mounted with (/proc/self/mountinfo shows it)."""
OVERLAY_OPTIONS = (("redirect_dir", "on"), ("metacopy", "on"))
"""redirect_dir: a folder of the layer renamed is a rename, as on any folder (off: EXDEV, and
``rename(2)`` fails). metacopy: a change of a layer file's metadata only (its times, mode or
owner: ``git`` touches every object file it would write again, ``touch``, ``chmod``) copies
up its metadata only, its data staying in the layer until it is written; without it the
whole file was copied into the upper (a commit in a cloned repository copied its packs).
An upper's such file (``trusted.overlay.metacopy``) holds no data of its own: it is read
through the home (checkpoints) or under an overlay with this option (layers frozen from
it), never as a plain file. Only the kernel writes ``trusted.*`` there: the agent's uid has
no capability to."""
_OPEN_TREE, _MOVE_MOUNT, _FSOPEN, _FSCONFIG, _FSMOUNT, _MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
_AT_FDCWD, _AT_EMPTY_PATH, _OPEN_TREE_CLONE = -100, 0x1000, 1
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_IDMAP = 0x1, 0x2, 0x4, 0x100000
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_STRING, _FSCONFIG_SET_FD, _FSCONFIG_CMD_CREATE = 1, 5, 6
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
MAX_STACKED = 8
"""unmount: the most mounts it takes off one path (a home mounted twice over)."""
NAMESPACES_KEPT = 256
"""The user namespaces of idmapped layers kept open, the last used (one per owner): a home
mounted again for an owner seen before (a pooled agent's home swapped by a fork) makes none."""
_libc = ctypes.CDLL(None, use_errno=True)
_namespaces: OrderedDict[tuple[int, int], int] = OrderedDict()
_namespaces_lock = threading.Lock()


class _StatFs(ctypes.Structure):
    """struct statfs: its first field (the filesystem's magic number), room for the rest."""
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


_OVERLAYFS_MAGIC = 0x794C7630


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _call(what: str, nr: int, *args) -> int:
    done = _libc.syscall(nr, *args)
    if done < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return done


def _user_namespace(uid: int, gid: int) -> int:
    """A handle (the caller's to close) on a user namespace mapping 0 to uid and gid: the one
    kept for that owner, else a new one, then kept (the ``NAMESPACES_KEPT`` last used)."""
    with _namespaces_lock:
        kept = _namespaces.get((uid, gid))
        if kept is not None:
            _namespaces.move_to_end((uid, gid))
            return os.dup(kept)
    made = _new_user_namespace(uid, gid)
    with _namespaces_lock:
        kept = _namespaces.setdefault((uid, gid), made)
        if kept != made:
            os.close(made)
        _namespaces.move_to_end((uid, gid))
        while len(_namespaces) > NAMESPACES_KEPT:
            os.close(_namespaces.popitem(last=False)[1])
        return os.dup(kept)


def _new_user_namespace(uid: int, gid: int) -> int:
    """A handle on a new user namespace mapping 0 to uid and gid (a process made it, now gone)."""
    unshare = shutil.which("unshare") or "unshare"
    holder = subprocess.Popen([unshare, "--user", "--", "sh", "-c", "echo; read _"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if not holder.stdout or holder.stdout.readline() != b"\n":
            raise OSError(errno.EPERM, "unshare --user: no user namespace made")
        for name, value in (("uid_map", uid), ("gid_map", gid)):
            with open(f"/proc/{holder.pid}/{name}", "w") as fh:
                fh.write(f"0 {value} 1")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if holder.stdin:
            holder.stdin.close()
        holder.wait()
        if holder.stdout:
            holder.stdout.close()


def layer_mount(layer: str, owner: tuple[int, int]) -> int:
    """A detached read-only clone of the layer's mount, idmapped 0 -> owner unless owner is root."""
    return layer_mounts([layer], owner)[0]


def layer_mounts(layers: Sequence[str], owner: tuple[int, int]) -> list[int]:
    """``layer_mount`` of each layer, in order, their idmaps through one user namespace (the
    owner's kept one, else one process started for all of them; none for root); on a failure
    none is left open."""
    fds: list[int] = []
    userns = -1
    try:
        for layer in layers:
            fds.append(_call("open_tree", _OPEN_TREE, _AT_FDCWD, os.fsencode(layer), _OPEN_TREE_CLONE | os.O_CLOEXEC))
            if userns < 0 and owner != (0, 0):
                userns = _user_namespace(*owner)
            attr = _MountAttr(_MOUNT_ATTR_RDONLY | (_MOUNT_ATTR_IDMAP if userns >= 0 else 0), 0, 0, max(userns, 0))
            _call("mount_setattr", _MOUNT_SETATTR, fds[-1], b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                  ctypes.sizeof(attr))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        if userns >= 0:
            os.close(userns)
    return fds


def mount_overlay(home: str, layer_fds: int | Sequence[int], upper: str, work: str) -> None:
    """Mount an overlay at home: the layers (handles from ``layer_mount``, the top one first)
    under upper, nosuid, nodev."""
    context = _call("fsopen overlay", _FSOPEN, b"overlay", _FSOPEN_CLOEXEC)
    try:
        def config(key: str, value: str) -> None:
            _call(f"overlay {key}", _FSCONFIG, context, _FSCONFIG_SET_STRING, key.encode(), os.fsencode(value), 0)

        config("source", OVERLAY_SOURCE)
        for layer_fd in [layer_fds] if isinstance(layer_fds, int) else layer_fds:
            _call("overlay lowerdir+ as a file descriptor", _FSCONFIG, context, _FSCONFIG_SET_FD, b"lowerdir+", None,
                  layer_fd)
        config("upperdir", upper)
        config("workdir", work)
        for key, value in OVERLAY_OPTIONS:
            config(key, value)
        _call("overlay create", _FSCONFIG, context, _FSCONFIG_CMD_CREATE, None, None, 0)
        mount = _call("fsmount", _FSMOUNT, context, _FSMOUNT_CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        try:
            _call("move_mount", _MOVE_MOUNT, mount, b"", _AT_FDCWD, os.fsencode(home), _MOVE_MOUNT_F_EMPTY_PATH)
        finally:
            os.close(mount)
    finally:
        os.close(context)


def layers_view(layers: Sequence[str], owner: tuple[int, int]) -> int:
    """A detached read-only view of the layers (top first) as an overlay home over them shows
    them, files root's on disk shown as owner's: one layer's idmapped clone, or an overlay of
    several with no upper. Read it through ``/proc/self/fd/<fd>``; close the fd to drop it."""
    fds = layer_mounts(layers, owner)
    try:
        if len(fds) == 1:
            return fds.pop()
        context = _call("fsopen overlay", _FSOPEN, b"overlay", _FSOPEN_CLOEXEC)
        try:
            for layer_fd in fds:
                _call("overlay lowerdir+ as a file descriptor", _FSCONFIG, context, _FSCONFIG_SET_FD, b"lowerdir+",
                      None, layer_fd)
            for key, value in OVERLAY_OPTIONS:
                _call(f"overlay {key}", _FSCONFIG, context, _FSCONFIG_SET_STRING, key.encode(), value.encode(), 0)
            _call("overlay create", _FSCONFIG, context, _FSCONFIG_CMD_CREATE, None, None, 0)
            return _call("fsmount", _FSMOUNT, context, _FSMOUNT_CLOEXEC,
                         _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV)
        finally:
            os.close(context)
    finally:
        for layer_fd in fds:
            os.close(layer_fd)


def _unescaped(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        return {_unescaped(line.split(" ", 5)[4]) for line in fh}


def overlay_homes() -> list[str]:
    """The mount points of every overlay home (mounted with OVERLAY_SOURCE) in this mount namespace."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        found = [line.split(" ", 5)[4] for line in fh if f" - overlay {OVERLAY_SOURCE} " in line]
    return [_unescaped(point) for point in found]


def mounted(path: str | os.PathLike) -> bool:
    return os.path.realpath(path) in mount_points()


_MS_BIND, _MS_SHARED = 0x1000, 1 << 20


def share_point(path: str | os.PathLike) -> None:
    """path made a mount point of its own (a bind of itself), shared: a mount made on it later
    appears in every copy of it made while it was the top mount there (a bwrap sandbox's
    ``--bind`` of the home is such a copy, a slave of it)."""
    where = os.fsencode(os.path.realpath(path))
    for what, source, flags in (("bind", where, _MS_BIND), ("share", None, _MS_SHARED)):
        if _libc.mount(source, where, None, flags, None) != 0:
            code = ctypes.get_errno()
            raise SandboxError(f"cannot {what} {os.fsdecode(where)}: {os.strerror(code)}")


def _tops(mountinfo: str, point: str) -> list[list[str]]:
    """The mountinfo lines (split) of every mount at point, in the order they were stacked."""
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
        return [fields for fields in (line.split() for line in fh) if _unescaped(fields[4]) == point]


def detach_overlay(path: str | os.PathLike) -> bool:
    """Detach the overlay on top of path (``MNT_DETACH``: what still holds it keeps it; a no-op
    when the top mount there is no overlay), leaving what is below it; True when one was."""
    where = os.fsencode(os.path.realpath(path))
    found = _StatFs()
    if _libc.statfs(where, ctypes.byref(found)) != 0 or found.f_type != _OVERLAYFS_MAGIC:
        return False
    if _libc.umount2(where, _UMOUNT_NOFOLLOW | _MNT_DETACH) == 0:
        return True
    code = ctypes.get_errno()
    raise SandboxError(f"cannot unmount {os.fsdecode(where)}: {os.strerror(code)}")


def _field(fields: list[str], tag: str) -> str | None:
    """An optional field of a mountinfo line (``shared:N``, ``master:N``): its value."""
    for field in fields[6:fields.index("-")]:
        if field.startswith(tag):
            return field[len(tag):]
    return None


def propagates_to(path: str | os.PathLike, pid: int, inside: str) -> bool:
    """A mount made on path (here) appears at inside in process pid's mount namespace: path is a
    shared point (``share_point``) and a mount at inside there is a slave of it."""
    point = os.path.realpath(path)
    stacked = _tops("/proc/self/mountinfo", point)
    group = _field(stacked[0], "shared:") if stacked else None
    if group is None:
        return False
    try:
        there = _tops(f"/proc/{pid}/mountinfo", inside)
    except OSError:
        return False
    return any(_field(fields, "master:") == group for fields in there)


def unmount(path: str | os.PathLike) -> bool:
    """Take every mount off path (a no-op when none); True when one was busy (an open file,
    a process's working folder there) and only a lazy detach (MNT_DETACH) took it off."""
    lazy, where = False, os.fsencode(os.path.realpath(path))
    for _ in range(MAX_STACKED):
        if not mounted(path):
            return lazy
        if _libc.umount2(where, _UMOUNT_NOFOLLOW) == 0:
            continue
        code = ctypes.get_errno()
        if code == errno.EINVAL:  # not a mount point after all (gone meanwhile)
            return lazy
        if code != errno.EBUSY:
            raise SandboxError(f"cannot unmount {os.fsdecode(where)}: {os.strerror(code)}")
        lazy = True
        if _libc.umount2(where, _UMOUNT_NOFOLLOW | _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            raise SandboxError(f"cannot detach {os.fsdecode(where)}: {os.strerror(code)}")
    if mounted(path):
        raise SandboxError(f"cannot unmount {os.fsdecode(where)}: still mounted after {MAX_STACKED} tries")
    return lazy
