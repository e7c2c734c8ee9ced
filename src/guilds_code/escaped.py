"""A foreground shell call's processes that left its process group, ended with the call.

A stop of the command's group (the timeout, a cancel) misses a process that
called ``setsid`` or otherwise left the group: a daemon, or a fork loop's
children, which would hold the sandbox's process slots after the call. So
every process a foreground command starts inherits ``CALL_KEY_ENV=<key>``, a
random key of the call, in its environment, and when the call ends (normally,
at its timeout, or cancelled) ``end`` finds every process whose environment
holds that key and that is not in the command's own group, and stops it:
SIGTERM (to it, and to its group when it leads one), SIGKILL to what is left
limits.ESCAPED_KILL_GRACE_SECONDS later; then it looks again, for what those
processes started meanwhile, up to limits.ESCAPED_SWEEPS times. When the first
look finds none while the group still runs, it looks once more
limits.ESCAPED_SETTLE_SECONDS later (a `setsid cmd &` job may be leaving the
group just as bash exits).

What stays: the command's own group after a normal end (``cmd &`` jobs run on
as before; a timeout stops the group anyway), and background commands, whose
processes carry no foreground call's key. A process that removed the key from
its environment (``env -i``) is not found, unless it is in the group of one
that is. The environment of a process of the same uid is readable in /proc
(of any uid, for root), so this works alike on every backend: the helper runs
inside the sandbox.

What a look reads: the call's processes were all started after its bash, so
their pids were handed out after bash's, in order, from the counter the pid
namespace keeps (/proc/sys/kernel/ns_last_pid), wrapping once past pid_max.
A look lists /proc (one directory read) and reads /proc/<pid>/stat only for the
pids handed out since bash's, and the environment only of those started at or
after the moment bash was spawned (its start time, in the clock ticks after boot
that /proc gives, taken before the spawn rather than read from /proc). On local,
whose /proc is the host's, that keeps the look to what the call started instead
of every process of the machine. Where
the counter cannot be read, or the call ran long enough for the counter to go
all the way round (more than pid_max pids handed out at
limits.ESCAPED_PIDS_PER_SECOND_MAX a second), every pid is read.
"""

from __future__ import annotations

import os
import time

from . import limits
from .proc import proc_stat, signal_group, signal_process, signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

CALL_KEY_ENV = "GUILDS_CALL_KEY"
"""The variable a foreground call's processes inherit, holding the call's key."""
_ENVIRON_MAX_BYTES = 4 * 1024 * 1024


_NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def new_key() -> str:
    """A random key for one call."""
    return os.urandom(8).hex()


class Call:
    """A foreground call's bash as it started, for the look at the call's end
    (``start`` right after the spawn, before bash can be reaped)."""

    __slots__ = ("key", "leader", "since", "began")

    def __init__(self, key: str, leader: int, since: int, began: float):
        self.key, self.leader, self.since, self.began = key, leader, since, began


def boot_ticks() -> int:
    """Now, in the clock ticks after boot that /proc/<pid>/stat gives a process's
    start time in: taken before a spawn, it is at most the new process's start time
    (the kernel counts both from CLOCK_BOOTTIME, rounding down), and costs no read
    of /proc."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // _NS_PER_TICK


def start(key: str, leader: int, since: int) -> Call:
    """The call whose bash, of key, is pid leader (spawned, not yet reaped), spawned
    at or after since (``boot_ticks`` before the spawn)."""
    return Call(key, leader, since, time.monotonic())


def end(call: Call) -> int:
    """Stop every process holding the call's key outside the process group its
    bash leads (see the module docstring); the number signalled."""
    ended = 0
    found, group_runs = _scan(call)
    if not found and group_runs:
        time.sleep(limits.ESCAPED_SETTLE_SECONDS)
        found = _scan(call)[0]
    for _ in range(limits.ESCAPED_SWEEPS):
        if not found:
            break
        ended += len(found)
        _signal(found, signals.SIGTERM)
        _wait_gone(found, limits.ESCAPED_KILL_GRACE_SECONDS)
        _signal(_scan(call)[0], signals.SIGKILL)
        found = _scan(call)[0]
    return ended


def _scan(call: Call) -> Tuple[List[int], bool]:
    """The call's live processes outside its group whose environment holds its
    key, and whether a live process (other than this one) is still in its group,
    from one walk of the pids handed out since its bash (see the module docstring).
    The start time and group come from /proc/<pid>/stat first: the environment,
    dearer to read, is read only for a process the call could have started."""
    needle = f"\0{CALL_KEY_ENV}={call.key}\0".encode()
    me, uid = os.getpid(), os.geteuid()
    found: List[int] = []
    group_runs = False
    for pid in _pids_since(call):
        info = proc_stat(pid) if pid != me else None
        if info is None or info.state in "ZX":
            continue
        if info.pgrp == call.leader:
            group_runs = True
            continue
        if info.start_time >= call.since and _holds(pid, needle, uid):
            found.append(pid)
    return found, group_runs


def _pids_since(call: Call) -> List[int]:
    """The pids of /proc that may have been handed out since the call's bash: those
    after its pid up to the namespace's last one (across one wrap past pid_max),
    or every pid when that cannot be told."""
    last, top = _read_int(_LAST_PID), _read_int(_PID_MAX)
    if last is None or top is None or time.monotonic() - call.began > top / limits.ESCAPED_PIDS_PER_SECOND_MAX:
        return [int(name) for name in _pids()]
    if 0 <= last - call.leader <= _PROBE_MAX:  # a few: each asked for, no listing of /proc
        return list(range(call.leader + 1, last + 1))
    pids = [int(name) for name in _pids()]
    if last >= call.leader:
        return [pid for pid in pids if call.leader < pid <= last]
    return [pid for pid in pids if pid > call.leader or pid <= last]


_PROBE_MAX = 64
"""Up to this many pids handed out since bash's, each is looked up on its own
(a missing /proc/<pid> fails at once) instead of listing /proc."""
_LAST_PID = "/proc/sys/kernel/ns_last_pid"
"""The last pid this pid namespace handed out."""
_PID_MAX = "/proc/sys/kernel/pid_max"
"""Past this, pids are handed out from the bottom again."""


_counters: Dict[str, int] = {}
"""The /proc/sys files a call's end reads (_LAST_PID, _PID_MAX), held open once opened: a path
under /proc/sys is looked up at a cost that grows with the machine's network namespaces (with a
hundred sandboxes running, most of a short call's)."""


def keep_open() -> None:
    """Open them now: the resident server, so the workers it forks after share them."""
    for path in (_LAST_PID, _PID_MAX):
        _counter(path)


def _counter(path: str) -> Optional[int]:
    fd = _counters.get(path)
    if fd is None:
        try:
            fd = _counters[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    return fd


def _read_int(path: str) -> Optional[int]:
    fd = _counter(path)
    try:
        return None if fd is None else int(os.pread(fd, 32, 0))
    except (OSError, ValueError):
        return None


def _pids() -> List[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _holds(pid: int, needle: bytes, uid: int) -> bool:
    """Does pid's environment hold needle (NUL-framed)? Only a process of uid is
    read, unless this process is root."""
    try:
        if uid != 0 and os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read(_ENVIRON_MAX_BYTES)
    except OSError:
        return False
    return needle in b"\0" + data


def _signal(pids: List[int], sig: int) -> None:
    for pid in pids:
        info = proc_stat(pid)
        if info is not None and info.pgrp == pid:
            signal_group(pid, sig)  # its group: what it started after clearing the key too
        signal_process(pid, sig)


def _wait_gone(pids: List[int], grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(limits.PROCESS_POLL_SECONDS)


def _alive(pid: int) -> bool:
    info = proc_stat(pid)
    return info is not None and info.state not in "ZX"
