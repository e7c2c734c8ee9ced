"""The filesystem ops of ``guilds-code envd`` (envd.py), each confined to the home
(``read`` serves one path outside it too: BOOT_ID).

Every path is resolved as ``file_read`` resolves it (``paths``): ``~`` and relative
paths from the home, absolute ones only inside it, links followed only inside
it. What is changed is changed beneath a held descriptor of its folder (``mkdir``,
``open``, ``unlink``, ``rename`` with ``dir_fd``, the last name never followed),
so a folder swapped for a link after the check is not followed out of the home.
"""

import base64
import errno
import grp
import os
import pwd
import shutil
import stat
import sys
import time

from . import limits, paths, protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

FILE_TYPES = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "link": "FILE_TYPE_SYMLINK"}
METADATA_PREFIX = "user.e2b."
"""A file's metadata: its extended attributes under this name, the name after it the key (E2B's)."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
"""The one path outside the home ``read`` serves: the kernel's boot id, as the
sandbox sees it (its own where the backend gives it one)."""
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def _boot_id(size: int) -> "Dict[str, Any]":
    with open(BOOT_ID, "rb") as file:
        data = file.read(size)
    return {"b64": b64(data), "eof": True, "size": len(data)}


class Failed(Exception):
    """A request's error: a Connect code and one line."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def text(value: "Any", name: str) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise Failed("invalid_argument", f"{name}: a string without NUL characters is needed")
    return value


def path_failure(message: str) -> Failed:
    if message.endswith("not found"):
        return Failed("not_found", message)
    if "outside the home" in message:
        return Failed("permission_denied", message)
    return Failed("invalid_argument", message)


class Files:
    def __init__(self, home: str):
        self.home = home

    def resolve(self, given: "Any") -> paths.Resolved:
        try:
            return paths.resolve(self.home, self.home, text(given, "path"))
        except protocol.OpError as exc:
            raise path_failure(str(exc)) from None

    def folder(self, given: "Any") -> paths.Resolved:
        """The folder given names, held open (close it, or use it in a ``with`` block)."""
        found = self.resolve(given)
        if found.kind != "directory":
            found.close()
            raise Failed("invalid_argument", f"path: {given} is not a directory")
        return found

    def parent(self, given: "Any", create: bool) -> "Tuple[paths.Resolved, str]":
        """(the folder that holds given, held open; given's last name), the folders made when create."""
        head, name = os.path.split(paths.absolute(self.home, self.home, text(given, "path").rstrip("/")))
        if not name or name in (".", ".."):
            raise Failed("invalid_argument", f"path: {given} names no file")
        return (self._made(head) if create else self.folder(head)), name

    def _made(self, path: str) -> paths.Resolved:
        """The folder path, made with any missing folders above it, one at a time beneath the
        last; at most limits.PATH_MAX_DEPTH of them (a loop, never a recursion)."""
        missing = []  # type: List[str]
        while True:
            try:
                found = self.folder(path)
                break
            except Failed as exc:
                if exc.code != "not_found":
                    raise
            head, name = os.path.split(path)
            if not name or len(missing) >= limits.PATH_MAX_DEPTH:
                raise Failed("invalid_argument" if name else "not_found",
                             f"path: {path} not found" if not name else
                             f"path: more than {limits.PATH_MAX_DEPTH} folders to make")
            missing.append(name)
            path = head
        for name in reversed(missing):
            with found:
                try:
                    os.mkdir(name, 0o755, dir_fd=found.fd)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise Failed("invalid_argument", f"path: {path} cannot be made: {exc.strerror}") from None
            path = os.path.join(path, name)
            found = self.folder(path)
        return found

    def stat(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        """What the path leads to; a link is named as itself, with ``symlinkTarget`` the
        absolute path it leads to (E2B's answer)."""
        given = req.get("path")
        with self.resolve(given) as found:
            info = entry(found.path, found.st)
        link = self._link_at(given)
        if link is not None:
            info.update(name=os.path.basename(link), path=link, symlinkTarget=found.path)
        return {"entry": info}

    def _link_at(self, given: "Any") -> "Optional[str]":
        """given's own absolute path when its last name is a symlink; else None."""
        try:
            folder, name = self.parent(given, create=False)
        except Failed:
            return None
        with folder:
            try:
                st = os.lstat(name, dir_fd=folder.fd)
            except OSError:
                return None
            return os.path.join(folder.path, name) if stat.S_ISLNK(st.st_mode) else None

    def list_dir(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        depth = req.get("depth") or 1
        entries = []  # type: List[Dict[str, Any]]
        with self.folder(req.get("path")) as root:
            _walk(root.path, min(depth, limits.PATH_MAX_DEPTH) if isinstance(depth, int) else 1, entries)
        return {"entries": entries}

    def make_dir(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        folder, name = self.parent(req.get("path"), create=True)
        with folder:
            try:
                os.mkdir(name, 0o755, dir_fd=folder.fd)
            except FileExistsError:
                raise Failed("already_exists", f"path: {req.get('path')} already exists") from None
            return {"entry": entry(os.path.join(folder.path, name), os.lstat(name, dir_fd=folder.fd))}

    def remove(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        """The file, link or folder (with all it holds) removed; a path that is not there is
        answered as removed, as E2B's envd answers it."""
        try:
            folder, name = self.parent(req.get("path"), create=False)
        except Failed as exc:
            if exc.code == "not_found":
                return {}
            raise
        with folder:
            try:
                st = os.lstat(name, dir_fd=folder.fd)
            except FileNotFoundError:
                return {}
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=folder.fd)
            elif sys.version_info >= (3, 11):
                shutil.rmtree(name, dir_fd=folder.fd)
            else:  # its fd-based walk never follows a link; only the folder's own path is named
                shutil.rmtree(os.path.join(folder.path, name))
        return {}

    def move(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        with self.resolve(req.get("source")) as found:
            source = found.path
        origin, old = self.parent(source, create=False)
        with origin:
            folder, name = self.parent(req.get("destination"), create=True)
            with folder:
                os.rename(old, name, src_dir_fd=origin.fd, dst_dir_fd=folder.fd)
                return {"entry": entry(os.path.join(folder.path, name), os.lstat(name, dir_fd=folder.fd))}

    def read(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        size = min(int(req.get("size") or limits.ENVD_CHUNK_BYTES), limits.ENVD_CHUNK_BYTES)
        if req.get("path") == BOOT_ID:
            return _boot_id(size)
        with self.resolve(req.get("path")) as found:
            try:
                fd = found.open_regular(text(req.get("path"), "path"))
            except protocol.OpError as exc:
                raise path_failure(str(exc)) from None
            try:
                data = os.pread(fd, size, int(req.get("offset") or 0))
            finally:
                os.close(fd)
        return {"b64": b64(data), "eof": len(data) < size, "size": found.st.st_size}

    def write(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        """The file given names (a link followed only inside the home), or a new one (folders made).
        A write that is not an append replaces the file's metadata with ``metadata`` (none: cleared)."""
        given = req.get("path")
        try:
            with self.resolve(given) as found:
                given = found.path
        except Failed as exc:
            if exc.code != "not_found":
                raise
        folder, name = self.parent(given, create=True)
        with folder:
            flags = _WRITE_FLAGS | (os.O_APPEND if req.get("append") else os.O_TRUNC)
            try:
                fd = os.open(name, flags, 0o644, dir_fd=folder.fd)
            except OSError as exc:
                raise Failed("invalid_argument", f"path: {req.get('path')} cannot be written: {exc.strerror}") from None
            try:
                if not req.get("append"):
                    _own(fd)
                    replace_metadata(fd, req.get("metadata") or {})
                view = memoryview(base64.b64decode(req.get("b64") or "", validate=True))
                while view:
                    view = view[os.write(fd, view):]
                st = os.fstat(fd)
            finally:
                os.close(fd)
            return {"entry": entry(os.path.join(folder.path, name), st)}


def _own(fd: int) -> None:
    """The file made the service's user's, as E2B's upload makes it its user's (a watcher sees a chmod)."""
    try:
        os.fchown(fd, os.getuid(), os.getgid())
    except OSError:
        pass  # another user's file this user may write: it stays theirs


def _walk(folder: str, depth: int, entries: "List[Dict[str, Any]]") -> None:
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise Failed("permission_denied", f"path: {folder}: {exc.strerror}") from None
    for name in names[: limits.ENVD_LIST_MAX_ENTRIES]:
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        entries.append(entry(path, st))
        if depth > 1 and stat.S_ISDIR(st.st_mode):
            _walk(path, depth - 1, entries)


def entry(path: str, st: os.stat_result) -> "Dict[str, Any]":
    """A filesystem.EntryInfo, as its JSON names it."""
    info = {
        "name": os.path.basename(path), "type": FILE_TYPES.get(paths.kind(st), "FILE_TYPE_UNSPECIFIED"),
        "path": path, "size": str(st.st_size), "mode": stat.S_IMODE(st.st_mode),
        "permissions": stat.filemode(st.st_mode), "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
        "modifiedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
    }  # type: Dict[str, Any]
    if stat.S_ISLNK(st.st_mode):
        info["isSymlink"] = True
        try:
            info["symlinkTarget"] = os.readlink(path)
        except OSError:
            pass
    else:
        found = metadata(path)
        if found:
            info["metadata"] = found
    return info


def metadata(path: str) -> "Dict[str, str]":
    """The file's metadata (a link is not followed): its ``user.e2b.`` attributes, those whose
    name or value is not UTF-8 left out; none where the filesystem keeps no such attributes."""
    found = {}  # type: Dict[str, str]
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return found
    for name in names:
        if not name.startswith(METADATA_PREFIX):
            continue
        try:
            found[name[len(METADATA_PREFIX):]] = os.getxattr(path, name, follow_symlinks=False).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return found


def replace_metadata(fd: int, wanted: "Dict[str, str]") -> None:
    """The open file's ``user.e2b.`` attributes made exactly ``wanted`` (checked by the host:
    printable ASCII, within E2B's sizes). A filesystem that keeps no user attributes keeps
    none (the file's entry then shows none, as E2B's envd answers)."""
    try:
        for name in os.listxattr(fd):
            if name.startswith(METADATA_PREFIX) and name[len(METADATA_PREFIX):] not in wanted:
                os.removexattr(fd, name)
        for key, value in wanted.items():
            os.setxattr(fd, METADATA_PREFIX + text(key, "metadata key"), text(value, "metadata value").encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.E2BIG):
            raise Failed("resource_exhausted", f"no room for the file's metadata: {exc.strerror}") from None
        raise Failed("invalid_argument", f"the file's metadata cannot be written: {exc.strerror}") from None


def _name(lookup: "Any", ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
