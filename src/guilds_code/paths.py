"""Path confinement: a path the model gave, resolved with links followed, inside the home.

Which path is meant:

- ``~`` and ``~/x`` start at the home; a relative path starts at the run's
  working directory (which the model controls: after ``cd /`` a relative path
  is outside the home); an absolute path must lie inside the home.
- "Inside" compares whole components, never string prefixes: ``/home/agent-evil``
  is not inside ``/home/agent``. The home may be named as the request gives it
  or by its real path (links in the home's own path are trusted).

How it is resolved (no check/open race): nothing is ever opened by a full path.
The walk starts from an ``O_PATH`` descriptor of the home and opens one component
at a time with ``openat(dir, name, O_PATH | O_NOFOLLOW)``. A link is read and
its target walked in turn: a relative target from the link's folder, an absolute
one only when it lies inside the home, from the home's descriptor. ``..`` pops
the walk's own stack of folder descriptors and is refused at the home's root.
At most limits.PATH_MAX_LINKS links and limits.PATH_MAX_DEPTH folders deep.
/proc's magic links (/proc/self/root, /proc/self/cwd, /proc/self/fd/N) are
outside the home, so they are refused like any other outside path.

The resolved path is the path as walked: the home as the request names it, then
the physical names below it (every link resolved).

Errors are OpError, one line naming the path as given::

    path: <given> is outside the home
    path: <given> not found
    path: <given> is a directory
    path: <given> is not a regular file (fifo)
"""

from __future__ import annotations

import os
import stat

from . import limits, protocol, reach, shaping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_GIVEN_MAX_CHARS = 200
_KINDS = {
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "link",
}


def components(path: str) -> List[str]:
    """The names of a path, without empty and '.' components."""
    return [c for c in path.split("/") if c not in ("", ".")]


def below(comps: List[str], base: List[str]) -> Optional[List[str]]:
    """The components of comps under base (whole components), or None."""
    if comps[: len(base)] != base:
        return None
    return comps[len(base) :]


def kind(st: os.stat_result) -> str:
    """'file', 'directory', 'fifo', 'socket', 'character device'..."""
    if stat.S_ISREG(st.st_mode):
        return "file"
    return _KINDS.get(stat.S_IFMT(st.st_mode), "special file")


def fail(given: str, what: str) -> protocol.OpError:
    """The one-line error 'path: <given> <what>'."""
    return protocol.OpError(f"path: {shaping.clip_line(given, _GIVEN_MAX_CHARS)} {what}")


class Resolved:
    """An object inside the home, held open by O_PATH descriptors until close()
    (or the end of a ``with`` block).

    path    absolute, as walked (see the module docstring)
    fd      an O_PATH descriptor of the object (usable with fchdir for a folder)
    st      its fstat
    """

    def __init__(self, path: str, fd: int, st: os.stat_result, parent_fd: int, name: str, fds: List[int]):
        self.path = path
        self.fd = fd
        self.st = st
        self._parent_fd = parent_fd
        self._name = name
        self._fds = fds

    @property
    def kind(self) -> str:
        return kind(self.st)

    def open_regular(self, given: str) -> int:
        """A descriptor for reading the object, which must be a regular file.

        A folder, FIFO, socket or device is an error and never blocks: the object
        was only opened with O_PATH, and is opened for reading (O_NONBLOCK,
        O_NOFOLLOW, by name beneath its folder) only when regular; the opened file
        must be the same inode. The caller closes the descriptor.
        """
        if self.kind == "directory":
            raise fail(given, "is a directory")
        if self.kind != "file":
            raise fail(given, f"is not a regular file ({self.kind})")
        try:
            fd = os.open(self._name, _READ_FLAGS, dir_fd=self._parent_fd)
        except PermissionError:
            raise fail(given, f"cannot be opened: {reach.unreadable(self.st)}") from None
        except OSError as exc:
            raise fail(given, f"cannot be opened: {exc.strerror}") from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.st.st_dev, self.st.st_ino):
            os.close(fd)
            raise fail(given, "changed while it was opened")
        return fd

    def enter(self, given: str, home: str) -> None:
        """Make the folder this process's working directory; an agent's uid that
        cannot pass it is told which folder stops it (reach.why)."""
        try:
            os.fchdir(self.fd)
        except OSError as exc:
            raise fail(given, f"cannot be entered: {reach.why(exc, self.path, home)}") from None

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> Resolved:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _Walk:
    """One resolution: a stack of (name, folder descriptor) beneath the home."""

    def __init__(self, home: str, given: str):
        self.home = home
        self.given = given
        self.homes = [components(home), components(os.path.realpath(home))]
        self.stack: List[tuple] = []
        self.links = 0
        try:
            self.root = os.open(home, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise protocol.OpError(f"home {home} cannot be opened: {reach.why(exc, home, home)}") from None

    def inside(self, absolute: str) -> List[str]:
        """The components of an absolute path below the home, or the 'outside' error."""
        comps = components(absolute)
        for base in self.homes:
            rest = below(comps, base)
            if rest is not None:
                return rest
        raise fail(self.given, "is outside the home")

    def here(self) -> int:
        return self.stack[-1][1] if self.stack else self.root

    def up(self) -> None:
        if not self.stack:
            raise fail(self.given, "is outside the home")
        os.close(self.stack.pop()[1])

    def reset(self) -> None:
        while self.stack:
            os.close(self.stack.pop()[1])

    def open(self, name: str) -> int:
        try:
            return os.open(name, _PATH_FLAGS, dir_fd=self.here())
        except FileNotFoundError:
            raise fail(self.given, "not found") from None
        except NotADirectoryError:
            raise fail(self.given, "not found (a part of it is not a directory)") from None
        except OSError as exc:
            where = os.path.join(self._path([n for n, _ in self.stack]), name)
            raise fail(self.given, f"cannot be opened: {reach.why(exc, where, self.home)}") from None

    def follow(self, fd: int, pending: List[str]) -> None:
        """Queue a link's target in place of the link (pending is a reversed stack)."""
        self.links += 1
        if self.links > limits.PATH_MAX_LINKS:
            raise fail(self.given, "has too many levels of symbolic links")
        try:
            target = os.readlink("", dir_fd=fd)
        except OSError as exc:
            raise fail(self.given, f"cannot be opened: {exc.strerror}") from None
        if target.startswith("/"):
            rest = self.inside(target)
            self.reset()
        else:
            rest = components(target)
        pending.extend(reversed(rest))

    def push(self, name: str, fd: int) -> None:
        if len(self.stack) >= limits.PATH_MAX_DEPTH:
            os.close(fd)
            raise fail(self.given, f"is more than {limits.PATH_MAX_DEPTH} folders deep")
        self.stack.append((name, fd))

    def walk(self, comps: List[str]) -> Resolved:
        pending = list(reversed(comps))
        while pending:
            name = pending.pop()
            if name == "..":
                self.up()
                continue
            fd = self.open(name)
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                try:
                    self.follow(fd, pending)
                finally:
                    os.close(fd)
            elif stat.S_ISDIR(st.st_mode):
                self.push(name, fd)
            elif pending:
                os.close(fd)
                raise fail(self.given, "not found (a part of it is not a directory)")
            else:
                return self.leaf(name, fd, st)
        return self.folder()

    def _path(self, names: List[str]) -> str:
        return os.path.join(self.home, *names) if names else self.home

    def leaf(self, name: str, fd: int, st: os.stat_result) -> Resolved:
        names = [n for n, _ in self.stack] + [name]
        fds = [self.root] + [f for _, f in self.stack] + [fd]
        return Resolved(self._path(names), fd, st, self.here(), name, fds)

    def folder(self) -> Resolved:
        names = [n for n, _ in self.stack]
        fds = [self.root] + [f for _, f in self.stack]
        fd = fds[-1]
        parent = fds[-2] if len(fds) > 1 else -1
        return Resolved(self._path(names), fd, os.fstat(fd), parent, names[-1] if names else "", fds)

    def close(self) -> None:
        self.reset()
        os.close(self.root)


def absolute(home: str, cwd: str, given: str) -> str:
    """The path meant, before resolution: '~' expanded, a relative path joined to cwd."""
    if given == "~" or given.startswith("~/"):
        return home + given[1:]
    if given.startswith("/"):
        return given
    return f"{cwd}/{given}"


def resolve(home: str, cwd: str, given: str) -> Resolved:
    """Resolve given (see the module docstring); use it in a ``with`` block, at
    whose end its descriptors close."""
    walk = _Walk(home, given)
    try:
        return walk.walk(walk.inside(absolute(home, cwd, given)))
    except BaseException:
        walk.close()
        raise


def physical_cwd(home: str, cwd: str) -> Optional[str]:
    """The working directory as walked (links resolved), or None when it is not inside the home."""
    try:
        with resolve(home, cwd, ".") as resolved:
            return resolved.path if resolved.kind == "directory" else None
    except protocol.OpError:
        return None


def display(path: str, home: str, cwd: Optional[str]) -> str:
    """How a result names a resolved path, so it can be passed back as given.

    Relative to the working directory when it lies under it ('.' for the
    working directory itself, never '..'); otherwise '~' or '~/<path under the
    home>'. cwd is physical_cwd() (None: outside the home).
    """
    comps = components(path)
    if cwd is not None:
        rest = below(comps, components(cwd))
        if rest is not None:
            return "/".join(rest) or "."
    rest = below(comps, components(home)) or []
    return "~/" + "/".join(rest) if rest else "~"
