"""``guilds-code starter``: helpers forked warm into a bubblewrap sandbox, with no interpreter started.

Run by a root orchestrator on the host, outside every sandbox, with a
SOCK_SEQPACKET socket as stdin, as ``python3 -I -S /dev/fd/N starter ROOM``: the
helper file read through a descriptor (closed once read), and ROOM a blank
argument of COMMAND_LINE_ROOM bytes. A fork has no exec to show a command line
of its own: each helper writes the one it is said to run with over the
starter's, in place (the argv memory /proc/<pid>/cmdline reads), padded with
NULs, so that ``ps`` in the sandbox shows ``python3 -I -S
/usr/local/bin/guilds-code serve ...`` and no host path. It imports the resident helper and every op
(``resident.WARM_MODULES``) once, freezes them out of the garbage collector, and
then waits. Each message on the socket is one start: no bytes that matter, and
five descriptors (SCM_RIGHTS): a memfd holding the request (JSON), then the new
helper's stdin, stdout and stderr, then the pipe its answer goes to. For each, it
forks (``enter``) and closes its copies; it never reads a request itself, so no
agent's request (its environment, its paths) is ever in the memory that the next
agent's helper is forked from.

The request: ``target`` and ``start`` (the sandbox init's pid on the host and its
start time, in clock ticks), ``uid``, ``gid``, ``cwd``, ``env``, ``argv`` (what
follows the helper's path: ``serve ...``), ``shown_argv`` (the whole command line
the helper is said to have run with, ``python -I <helper> serve ...``: where a
sleeping server wakes from), ``pids`` (RLIMIT_NPROC), ``memory`` (RLIMIT_AS in
bytes, 0: none) and ``cgroups`` (cgroup.procs files to join).

The fork enters the sandbox as ``nsenter`` then ``setpriv`` do for a helper
started in it: it checks the init is still the one named (its start time), puts
itself under the limits and into the cgroups, joins the init's ipc, uts, net, pid
and mount namespaces, takes the init's root and ``cwd``, and forks again, into
the pid namespace. It answers that child's pid (on the host) into the answer pipe
and exits; the child, in a session of its own, leaves the capability bounding
set, drops its groups, becomes uid and gid, clears every capability, sets
no_new_privs, is made dumpable again (a change of uid clears it; an exec would set
it), takes the three descriptors as 0, 1 and 2 and closes every other, and runs
``guilds-code`` with argv. An error before the second fork is one line
``error: ...`` in the answer pipe. The starter is the helpers' subreaper: a helper
whose first fork has exited is its child, reaped the moment it exits (a zombie left
to the host's init would hold its sandbox's pid namespace, and so the sandbox's
stop, until that init reaps it). The socket's end (the orchestrator gone) ends
the starter; the helpers it started live on, each until its stdin ends.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import signal
import socket
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List

COMMAND_LINE_ROOM = 8192
"""Bytes of the blank argument the starter is run with: room for the helpers' command lines."""
START_FDS = 5
"""Descriptors of one start: request memfd, stdin, stdout, stderr, answer pipe."""
REQUEST_MAX_BYTES = 4 * 1024 * 1024
NAMESPACES = (("ipc", 0x08000000), ("uts", 0x04000000), ("net", 0x40000000), ("pid", 0x20000000),
              ("mnt", 0x00020000))
"""Joined in nsenter's order (the mount namespace last: the others are opened through the host's /proc)."""
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 4, 24, 36, 38
_CAP_VERSION_3 = 0x20080522
_OPEN_MAX = max(os.sysconf("SC_OPEN_MAX"), 1024)


class EntryError(Exception):
    """Why the sandbox could not be entered: one line for the orchestrator."""


class InitGone(EntryError):
    """The sandbox's init is not the one the request names (it ended)."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def main(argv: List[str], helper_main: Callable[[List[str]], int]) -> int:
    """Serve starts on stdin (a SOCK_SEQPACKET socket) until it ends; each started helper runs
    helper_main(its argv) (guilds-code's own main)."""
    if len(argv) > 1 or (argv and argv[0].strip()):
        os.write(2, b"guilds-code starter: takes no arguments but a blank one (room for command lines)\n")
        return 2
    from . import resident

    for name in resident.WARM_MODULES:
        __import__(name)
    if sys.argv[0].startswith("/dev/fd/"):  # the helper file, read: no fork holds it
        os.close(int(sys.argv[0][len("/dev/fd/"):]))
    libc = ctypes.CDLL(None, use_errno=True)
    last_cap = _last_cap()
    _COMMAND_LINE[:] = _command_line_area()
    sock = socket.socket(fileno=0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the first forks exit at once: reaped by the kernel
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # and so is each helper, its parent once they have
    gc.freeze()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 16, START_FDS)
        except InterruptedError:
            continue
        except OSError:
            return 0
        if not message and not fds:
            return 0
        if len(fds) != START_FDS:
            _close(fds)
            continue
        if os.fork() == 0:
            _exit_with(enter, fds, libc, last_cap, helper_main)
        _close(fds)


def _exit_with(run: Callable[..., int], *args: Any) -> None:
    """In a fork: run(*args), then exit with its status, whatever it raised (never back into the loop)."""
    code = 1
    try:
        code = run(*args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - a fork must never return into the starter's loop
        _say(2, f"guilds-code starter: internal error: {type(exc).__name__}: {_one_line(exc)}")
    finally:
        _flush(sys.stdout)
        _flush(sys.stderr)
        os._exit(code)


def _flush(stream: Any) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


_COMMAND_LINE = [0, 0]
"""[start, end] of this process's argv memory (/proc/self/stat's arg_start and arg_end); [0, 0]: unknown."""


def _command_line_area() -> List[int]:
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        return [int(fields[45]), int(fields[46])]
    except (OSError, ValueError, IndexError):
        return [0, 0]


def _show_command_line(argv: List[str]) -> None:
    """argv written over this process's command line, the rest of it NULs; left as it is
    when it does not fit (or the area is unknown)."""
    start, end = _COMMAND_LINE
    shown = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    if start and len(shown) <= end - start:
        ctypes.memmove(start, shown + b"\0" * (end - start - len(shown)), end - start)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 63


def _close(fds: List[int]) -> None:
    for fd in fds:
        _close_one(fd)


def _close_one(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def enter(fds: List[int], libc: Any, last_cap: int, helper_main: Callable[[List[str]], int]) -> int:
    """The first fork: enter the sandbox the request names and fork the helper into it."""
    body, stdio, answer = fds[0], fds[1:4], fds[4]
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        request = _request(body)
        _enter(request, libc)
        pid = os.fork()
    except InitGone as exc:
        _say(answer, f"gone: {exc}")
        return 1
    except Exception as exc:  # noqa: BLE001 - every failure is the orchestrator's one line
        _say(answer, f"error: {type(exc).__name__}: {_one_line(exc)}")
        return 1
    if pid == 0:
        _exit_with(_run, request, stdio, libc, last_cap, helper_main)
    _say(answer, str(pid))
    return 0


def _one_line(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return (text or type(exc).__name__).replace("\n", " ")


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, line.encode() + b"\n")
    except OSError:
        pass


def _request(fd: int) -> Dict[str, Any]:
    data = os.pread(fd, REQUEST_MAX_BYTES, 0)
    os.close(fd)
    request = json.loads(data)
    if not isinstance(request, dict):
        raise EntryError("the request is not an object")
    return request


def _enter(request: Dict[str, Any], libc: Any) -> None:
    """Limits, cgroups, the init's namespaces and root, then cwd: as root, before the fork into them."""
    target = int(request["target"])
    gone = InitGone(f"the sandbox's init {target} is gone")
    try:
        namespaces = [(os.open(f"/proc/{target}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag)
                      for name, flag in NAMESPACES]
        root = os.open(f"/proc/{target}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        started = _start_time(target)
    except (FileNotFoundError, ProcessLookupError):
        raise gone from None
    if started != int(request["start"]):  # read after the opens: they are the init's, or it is gone
        raise gone
    pids, memory = int(request["pids"]), int(request["memory"])
    resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    for procs in request["cgroups"]:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    for fd, flag in namespaces:
        if libc.setns(fd, flag) != 0:
            raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir(request["cwd"])


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _run(request: Dict[str, Any], stdio: List[int], libc: Any, last_cap: int,
         helper_main: Callable[[List[str]], int]) -> int:
    """The helper, in the sandbox: the agent's uid with no capability, then guilds-code argv.
    A drop that fails is one line on its stderr, and exit 1, before anything runs."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    os.closerange(3, _OPEN_MAX)
    _show_command_line(request["shown_argv"])
    try:
        os.setsid()
        _drop(int(request["uid"]), int(request["gid"]), libc, last_cap)
    except OSError as exc:
        _say(2, f"guilds-code starter: cannot become the agent's user: {_one_line(exc)}")
        return 1
    os.environ.clear()
    os.environ.update(request["env"])
    sys.orig_argv = list(request["shown_argv"])
    sys.argv = sys.orig_argv[2:]
    return helper_main(list(request["argv"])) or 0


def _drop(uid: int, gid: int, libc: Any, last_cap: int) -> None:
    """setpriv --reuid --regid --clear-groups --no-new-privs --bounding-set=-all --inh-caps=-all."""
    for cap in range(last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    for option, value in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_DUMPABLE, 1)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option})")
