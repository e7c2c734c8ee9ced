"""Folder watchers of ``guilds-code envd`` (envd.py): inotify through ctypes on the C library.

Ops:

- ``watch_create`` {path, recursive, include_entry, allow_network_mounts, notify}: a
  watcher of the folder path names (confined to the home, as every file op).
  A path that is not there: not_found; not a folder: invalid_argument; a folder on a
  network filesystem (NFS, CIFS/SMB, FUSE) without allow_network_mounts: invalid_argument;
  limits.ENVD_WATCHERS_MAX open already: resource_exhausted. Recursive: every folder
  beneath it too, those made later as well (what a new folder already holds when its
  watch begins is reported as created). Reply {watcher}: its id. With notify, an event
  {"ev": "watch", "watcher": ID} is sent when events wait and none was sent since the last ``watch_events``.
- ``watch_events`` {watcher}: the events since the last call, oldest first, each
  {name, type, entry?}: name relative to the watched folder ("." the folder itself),
  type EVENT_TYPE_CREATE|WRITE|REMOVE|RENAME|CHMOD, entry (with include_entry, for create,
  write and chmod, when the path can still be read) an EntryInfo. A watcher that failed
  answers its error: more than limits.ENVD_WATCH_EVENTS_MAX events waiting, more than
  limits.ENVD_WATCH_FOLDERS_MAX folders, or the kernel's own queue overflowed. A failed
  watcher has let go of its inotify descriptor and its events already.
- ``watch_remove`` {watcher}: the watcher stopped, its descriptor and thread freed.

Events are read as they come by each watcher's thread, and before every request
(``settle``): what a request changed is seen by the next one, and a folder made by
one request is watched before the next one writes into it.
"""

import ctypes
import errno
import os
import secrets
import select
import struct
import threading

from . import limits
from .envd_files import Failed, Files, entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
WATCHED = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
HEADER = struct.Struct("iIII")
TYPES = (  # (mask, type), in the order one inotify event's several types are reported
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"), (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"), (IN_MODIFY, "EVENT_TYPE_WRITE"), (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
)
WITH_ENTRY = ("EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD")
SYSTEM_LIMIT = "the machine's limit of inotify watches for this user is reached"
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "fuse", "fuseblk")


class Inotify:
    """The C library's inotify calls."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)

    def open(self) -> int:
        fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise _os_error("inotify_init1")
        return fd

    def add(self, fd: int, path: str) -> int:
        wd = self.libc.inotify_add_watch(fd, os.fsencode(path), WATCHED | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            raise _os_error(path)
        return wd

    def remove(self, fd: int, wd: int) -> None:
        self.libc.inotify_rm_watch(fd, wd)


def _os_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), what)


class WatcherFailed(Exception):
    """A watcher's end by a limit: its error, answered to every later ``watch_events``."""


class Watcher:
    """One watched folder: its inotify descriptor, its folders by watch, its waiting events."""

    def __init__(self, inotify: Inotify, root: str, config: "Dict[str, Any]",
                 notify: "Optional[Callable[[], None]]"):
        self.inotify, self.root, self.notify = inotify, root, notify
        self.recursive, self.include_entry = bool(config.get("recursive")), bool(config.get("include_entry"))
        self.lock = threading.Lock()
        self.events = []  # type: List[Dict[str, Any]]
        self.folders = {}  # type: Dict[int, str]
        self.error = None  # type: Optional[str]
        self.notified = False
        self.fd = inotify.open()  # type: Optional[int]
        wake = os.pipe()
        self.wake_r, self.wake_w = wake[0], wake[1]  # type: Optional[int], Optional[int]
        try:
            self._watch(root, "", announce=False)
        except (OSError, WatcherFailed):
            self._close()
            raise
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        fd, wake = self.fd, self.wake_r  # closed by this thread only, at its end
        while self.fd is not None and fd is not None and wake is not None:
            ready, _, _ = select.select([fd, wake], [], [])
            if wake in ready:
                break
            self.drain()
        with self.lock:
            self._close()

    def _close(self) -> None:
        for fd in (self.fd, self.wake_r, self.wake_w):
            if fd is not None:
                os.close(fd)
        self.fd = self.wake_r = self.wake_w = None

    def stop(self) -> None:
        with self.lock:
            if self.wake_w is not None:
                os.write(self.wake_w, b"x")
                self.events = []

    def drain(self) -> None:
        """The events the kernel holds for it, read now (never waits)."""
        with self.lock:
            while self.fd is not None and self.error is None:
                try:
                    data = os.read(self.fd, 64 * 1024)
                except BlockingIOError:
                    return
                try:
                    self._read(data)
                except WatcherFailed as exc:
                    self._fail(str(exc))

    def take(self) -> "List[Dict[str, Any]]":
        self.drain()
        with self.lock:
            if self.error is not None:
                raise Failed("resource_exhausted", self.error)
            events, self.events, self.notified = self.events, [], False
            return events

    def _fail(self, message: str) -> None:
        self.error, self.events = message, []
        if self.wake_w is not None:
            os.write(self.wake_w, b"x")  # its thread closes the descriptor
        self._notify()

    def _read(self, data: bytes) -> None:
        at = 0
        while at + HEADER.size <= len(data):
            wd, mask, _cookie, size = HEADER.unpack_from(data, at)
            name = data[at + HEADER.size: at + HEADER.size + size].split(b"\0", 1)[0]
            at += HEADER.size + size
            self._event(wd, mask, os.fsdecode(name))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            raise WatcherFailed("watcher error: the kernel's event queue overflowed")
        folder = self.folders.get(wd)
        if folder is None:
            return
        if mask & IN_IGNORED:
            del self.folders[wd]
            return
        if not name and folder:
            return  # a folder beneath the root: its parent's watch reports it
        relative = os.path.join(folder, name) if name else "."
        for bits, kind in TYPES:
            if mask & bits:
                self._put(relative, kind)
        if mask & IN_ISDIR and self.recursive:
            if mask & (IN_CREATE | IN_MOVED_TO):
                self._watch(os.path.join(self.root, relative), relative, announce=True)
            elif mask & IN_MOVED_FROM:
                self._unwatch(relative)

    def _watch(self, path: str, relative: str, announce: bool) -> None:
        """Watch path's folder (and, recursive, those beneath it); with announce, what it holds
        is reported as created (it was made before its watch began)."""
        if len(self.folders) >= limits.ENVD_WATCH_FOLDERS_MAX:
            raise WatcherFailed(f"watcher error: more than {limits.ENVD_WATCH_FOLDERS_MAX} folders to watch")
        try:
            wd = self.inotify.add(self.fd, path)  # type: ignore[arg-type]
        except OSError as exc:
            if relative and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # gone again, or replaced: its parent's watch reports that
            if exc.errno == errno.ENOSPC:
                raise WatcherFailed(f"watcher error: {SYSTEM_LIMIT} (fs.inotify.max_user_watches)") from None
            if not relative:
                raise
            raise WatcherFailed(f"watcher error: {path}: {exc.strerror}") from None
        self.folders[wd] = relative
        if not self.recursive:
            return
        try:
            names = sorted(os.scandir(path), key=lambda item: item.name)
        except OSError:
            return
        for item in names:
            inner = os.path.join(relative, item.name)
            if announce:
                self._put(inner, "EVENT_TYPE_CREATE")
            if item.is_dir(follow_symlinks=False):
                self._watch(item.path, inner, announce)

    def _unwatch(self, relative: str) -> None:
        """A folder moved away: its watches (and those beneath it) end."""
        for wd, folder in list(self.folders.items()):
            if folder == relative or folder.startswith(relative + "/"):
                self.inotify.remove(self.fd, wd)  # type: ignore[arg-type]
                del self.folders[wd]

    def _put(self, relative: str, kind: str) -> None:
        if len(self.events) >= limits.ENVD_WATCH_EVENTS_MAX:
            raise WatcherFailed(f"watcher error: more than {limits.ENVD_WATCH_EVENTS_MAX} events were not taken")
        event = {"name": relative, "type": kind}  # type: Dict[str, Any]
        if self.include_entry and kind in WITH_ENTRY:
            path = os.path.normpath(os.path.join(self.root, relative))
            try:
                event["entry"] = entry(path, os.lstat(path))
            except OSError:
                pass  # gone already: the event without its entry
        self.events.append(event)
        self._notify()

    def _notify(self) -> None:
        if self.notify is not None and not self.notified:
            self.notified = True
            self.notify()


class Watchers:
    """The service's watchers by id (the module docstring's ops)."""

    def __init__(self, files: Files, send: "Callable[[Dict[str, Any]], None]"):
        self.files, self.send = files, send
        self.inotify = None  # type: Optional[Inotify]
        self.all = {}  # type: Dict[str, Watcher]

    def watch_create(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        with self.files.folder(req.get("path")) as found:
            root = found.path
        if not req.get("allow_network_mounts") and on_network_filesystem(root):
            raise Failed("invalid_argument", f"cannot watch path on network filesystem: {root}")
        if len(self.all) >= limits.ENVD_WATCHERS_MAX:
            raise Failed("resource_exhausted", f"{limits.ENVD_WATCHERS_MAX} watchers are open: stop one first")
        if self.inotify is None:
            self.inotify = Inotify()
        ident = "w" + secrets.token_hex(8)
        notify = (lambda: self.send({"ev": "watch", "watcher": ident})) if req.get("notify") else None
        try:
            self.all[ident] = Watcher(self.inotify, root, req, notify)
        except WatcherFailed as exc:
            raise Failed("resource_exhausted", str(exc)) from None
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise Failed("resource_exhausted", f"{SYSTEM_LIMIT} (fs.inotify.max_user_instances)") from None
            raise Failed("internal", f"cannot watch {root}: {exc.strerror}") from None
        return {"watcher": ident}

    def watcher(self, req: "Dict[str, Any]") -> Watcher:
        ident = req.get("watcher")
        found = self.all.get(ident) if isinstance(ident, str) else None
        if found is None:
            raise Failed("not_found", f"watcher with id {ident} not found")
        return found

    def watch_events(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        return {"events": self.watcher(req).take()}

    def watch_remove(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        self.watcher(req).stop()
        del self.all[req["watcher"]]
        return {}

    def settle(self) -> None:
        """Every watcher's waiting events read (before each request)."""
        for watcher in list(self.all.values()):
            watcher.drain()

    def stop_all(self) -> None:
        for watcher in self.all.values():
            watcher.stop()
        self.all.clear()


def on_network_filesystem(path: str) -> bool:
    """Whether path's filesystem (its longest mount point in /proc/self/mountinfo) is a network one."""
    best, kind = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split(" - ", 1)
                point = fields[0].split(" ")[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best) and len(fields) == 2:
                    best, kind = point, fields[1].split(" ")[0]
    except (OSError, IndexError):
        return False
    return kind.split(".")[0] in NETWORK_FILESYSTEMS
