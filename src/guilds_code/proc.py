"""Child processes: the helper's one spawn path, and what it reads of process groups.

``spawn`` starts a program with ``os.posix_spawn`` rather than subprocess,
whose import (selectors, threading, locale...) costs more than a whole shell
call of ``true``. What the child gets, as ``subprocess.Popen`` would give it
with close_fds and restore_signals:

- descriptors 0, 1 and 2 only (and ``pass_fd``): stdin a descriptor or /dev/null; stdout a
  descriptor, a new pipe (PIPE) or /dev/null; stderr a new pipe, the same as
  stdout (STDOUT) or /dev/null. Every other descriptor is close-on-exec
  (Python's own are; one the helper inherited is marked so before the spawn);
- SIGPIPE and SIGXFSZ at their defaults again (Python ignores them);
- with ``session``, a new session and process group that it leads (setsid);
- with ``cwd``, that working directory. posix_spawn has no chdir action in
  Python, so the helper (one thread) changes its own directory around the
  spawn and returns to the old one by descriptor;
- argv[0] as given when it holds a '/', else found on env's PATH.

Errors are OSError (the program or the directory is missing...), raised here.
"""

from __future__ import annotations

import errno
import os

try:  # the C module: `signal` wraps it in enums, whose import alone costs a fast call dearly
    import _signal as signals  # type: ignore[import-not-found]  # no stubs for the C module
except ImportError:  # not CPython
    import signal as signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Mapping, Optional, Set, Tuple

PIPE = -1
"""stdout or stderr: a new pipe, whose read end the Child holds."""
STDOUT = -2
"""stderr: the same as stdout."""
_RESTORED_SIGNALS = tuple(
    getattr(signals, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signals, name)
)


class Child:
    """A started process: its pid, the read ends of its pipes, its exit code once reaped.

    returncode is None while it runs, then as subprocess reports it: the exit
    status, or -N when signal N killed it.
    """

    __slots__ = ("pid", "stdout", "stderr", "returncode")

    def __init__(self, pid: int, stdout: Optional[int], stderr: Optional[int]):
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        """The exit code if it has exited (reaped now), else None."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        """Wait for it to exit; the exit code."""
        if self.returncode is None:
            self._reap(0)
        return self.returncode  # type: ignore[return-value]  # a blocking _reap always sets it

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped elsewhere: as subprocess, count it a success
            self.returncode = 0
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def read_end(fd: Optional[int]) -> int:
    """The read end of a pipe the child was spawned with (stdout or stderr=PIPE)."""
    if fd is None:
        raise ValueError("the child was spawned without that pipe")
    return fd


def find_program(name: str, env: Mapping[str, str]) -> Optional[str]:
    """The absolute path of an executable file `name` on env's PATH, or None."""
    for folder in os.get_exec_path(env):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def spawn(
    argv: List[str],
    env: Mapping[str, str],
    *,
    stdin: Optional[int] = None,
    stdout: Optional[int] = PIPE,
    stderr: Optional[int] = None,
    cwd: Optional[str] = None,
    session: bool = False,
    pass_fd: Optional[Tuple[int, int]] = None,
) -> Child:
    """Start argv (see the module docstring); the Child. OSError when it cannot start.

    pass_fd (descriptor, number): the child also gets that descriptor as that number.
    """
    program = argv[0] if "/" in argv[0] else find_program(argv[0], env)
    if program is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    made = [null]  # closed before returning, but for the read ends the Child keeps
    try:
        out_r, out_w = _pipe_or(stdout, null, made)
        err_r, err_w = (None, out_w) if stderr == STDOUT else _pipe_or(stderr, null, made)
        actions = [
            (os.POSIX_SPAWN_DUP2, null if stdin is None else stdin, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        if pass_fd is not None:
            actions.append((os.POSIX_SPAWN_DUP2, pass_fd[0], pass_fd[1]))
        _close_on_exec_inherited()
        back = _chdir(cwd)
        try:
            pid = os.posix_spawn(
                program, argv, env, file_actions=actions, setsid=session, setsigdef=_RESTORED_SIGNALS
            )
        finally:
            _chdir_back(back)
    except BaseException:
        for fd in made:
            os.close(fd)
        raise
    for fd in made:
        if fd not in (out_r, err_r):
            os.close(fd)
    return Child(pid, out_r, err_r)


def _pipe_or(spec: Optional[int], null: int, made: List[int]):
    """(read end for the Child or None, what the child writes to) for PIPE, a descriptor or None."""
    if spec == PIPE:
        read, write = os.pipe()
        made.extend((read, write))
        return read, write
    return None, null if spec is None else spec


class _Inherited:
    swept = False
    """_close_on_exec_inherited ran in this process (or in the one it was forked from)."""


def _close_on_exec_inherited() -> None:
    """Mark every descriptor above 2 close-on-exec (Python's own already are), once
    per process: every descriptor Python opens afterwards is close-on-exec already
    but for os.dup2's, which the helpers make onto 0, 1 and 2 only; and a fork keeps
    the marks, so a resident worker sweeps only before its first command."""
    if _Inherited.swept:
        return
    _Inherited.swept = True
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every possible descriptor
        fds = list(range(3, os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


def _chdir(cwd: Optional[str]) -> Optional[int]:
    """Change the helper's directory to cwd; a descriptor of the old one (None: no cwd)."""
    if cwd is None:
        return None
    back = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(cwd)
    except BaseException:
        os.close(back)
        raise
    return back


def _chdir_back(back: Optional[int]) -> None:
    if back is not None:
        try:
            os.fchdir(back)
        finally:
            os.close(back)


# --- a group that dies with the helper ----------------------------------------------
_WATCHDOG = 'IFS= read -r word; [ "$word" = done ] || kill -KILL -- "-$1" 2>/dev/null'
"""Reads its stdin until the helper says ``done``; EOF first means the helper died."""


def watch_group(pgid: int) -> Optional[Watchdog]:
    """Start a watchdog that SIGKILLs group pgid if this helper dies (even by SIGKILL)
    before ``release``; None when none could start.

    The watchdog is a bash in its own session reading a pipe whose only write end
    the helper holds: the helper's death closes it. A parent-death signal would
    reach only the command's bash, not the processes it started.
    """
    read, write = os.pipe()
    try:
        child = spawn(["bash", "-c", _WATCHDOG, "guilds-watch", str(pgid)], os.environ,
                      stdin=read, stdout=None, session=True)
    except OSError:
        os.close(write)
        return None
    finally:
        os.close(read)
    return Watchdog(child, write)


class Watchdog:
    """A started watchdog (watch_group) and the write end of its pipe."""

    __slots__ = ("child", "fd")

    def __init__(self, child: Child, fd: int):
        self.child, self.fd = child, fd


def release(watchdog: Optional[Watchdog]) -> None:
    """Tell the watchdog the helper is done with the group; it exits signalling nothing."""
    if watchdog is None:
        return
    try:
        os.write(watchdog.fd, b"done\n")
    except OSError:
        pass
    os.close(watchdog.fd)
    watchdog.child.wait()


# --- process groups, from /proc ------------------------------------------------------
def signal_group(pgid: int, sig: int) -> bool:
    """Send sig to the process group; False (nothing sent) when it is gone or not ours."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_process(pid: int, sig: int) -> bool:
    """Send sig to one process; False (nothing sent) when it is gone or not ours."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    """True while a process of group pgid runs (zombies awaiting reaping don't)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pgid in live_groups()


def live_groups() -> Set[int]:
    """The process groups that have a member that is not a zombie."""
    return {info.pgrp for info in (proc_table() or {}).values() if info.state not in "ZX"}


def read_proc_file(path: str, size: int = 4096) -> Optional[bytes]:
    """Up to size bytes of a /proc file in one read (what the kernel makes of it at
    once), or None when it cannot be read: a raw descriptor, not a buffered file,
    whose opening costs several system calls more."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


class ProcStat:
    """A process's state letter, parent, process group, and start time: clock ticks
    after boot (field 22 of /proc/<pid>/stat); with the pid, it names one process
    for the life of the machine."""

    __slots__ = ("state", "ppid", "pgrp", "start_time")

    def __init__(self, state: str, ppid: int, pgrp: int, start_time: int):
        self.state, self.ppid, self.pgrp, self.start_time = state, ppid, pgrp, start_time


def proc_stat(pid: int) -> Optional[ProcStat]:
    """pid's state, parent, group and start time from /proc/<pid>/stat (the one
    reader of it inside the sandbox), or None when gone."""
    data = read_proc_file(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data.rsplit(b")", 1)[-1].split()  # the command name may hold ")" and spaces
    try:
        return ProcStat(fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


class _Instance:
    value: Optional[str] = None
    """sandbox_instance(), read once per process: a process never changes sandbox."""


def sandbox_instance() -> str:
    """Which sandbox this is, for as long as it lives: the machine's boot id, the
    pid namespace's inode and the start time of its pid 1 ("?" for a part that
    cannot be read). A namespace inode is given out again once the namespace is
    gone, but with its pid 1's start time it names one namespace for the life of
    the machine; a replaced sandbox (a new bwrap init, container or pod) is
    another instance, as is the machine after a reboot."""
    if _Instance.value is None:
        parts = [_read_text("/proc/sys/kernel/random/boot_id"), _link_text("/proc/self/ns/pid")]
        init = proc_stat(1)
        parts.append("?" if init is None else str(init.start_time))
        _Instance.value = " ".join(parts)
    return _Instance.value


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(64).decode("ascii", "replace").strip() or "?"
    except OSError:
        return "?"


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def proc_table() -> Optional[Dict[int, ProcStat]]:
    """pid -> ProcStat of every process /proc shows; None where there is no /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if name.isdigit():
            info = proc_stat(int(name))
            if info is not None:
                table[int(name)] = info
    return table or None
