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
"""

from __future__ import annotations

import os
import time

from . import limits
from .proc import proc_stat, signal_group, signal_process, signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Tuple

CALL_KEY_ENV = "GUILDS_CALL_KEY"
"""The variable a foreground call's processes inherit, holding the call's key."""
_ENVIRON_MAX_BYTES = 4 * 1024 * 1024


def new_key() -> str:
    """A random key for one call."""
    return os.urandom(8).hex()


def end(key: str, leader: int) -> int:
    """Stop every process holding key outside the process group that leader
    (the call's bash) leads (see the module docstring); the number signalled."""
    info = proc_stat(leader)  # bash, not yet reaped: its start time bounds the call's
    since = info.start_time if info is not None else 0
    ended = 0
    found, group_runs = _scan(key, leader, since)
    if not found and group_runs:
        time.sleep(limits.ESCAPED_SETTLE_SECONDS)
        found = marked(key, leader, since)
    for _ in range(limits.ESCAPED_SWEEPS):
        if not found:
            break
        ended += len(found)
        _signal(found, signals.SIGTERM)
        _wait_gone(found, limits.ESCAPED_KILL_GRACE_SECONDS)
        _signal(marked(key, leader, since), signals.SIGKILL)
        found = marked(key, leader, since)
    return ended


def marked(key: str, group: int, since: int = 0) -> List[int]:
    """The live processes (not zombies) started at or after `since` (clock ticks
    after boot) outside group whose environment holds key. The start time and
    group come from /proc/<pid>/stat first: the environment, dearer to read, is
    read only for a process the call could have started."""
    return _scan(key, group, since)[0]


def _scan(key: str, group: int, since: int) -> Tuple[List[int], bool]:
    """``marked``'s processes, and whether a live process (other than this one) is
    still in group, from one walk of /proc."""
    needle = f"\0{CALL_KEY_ENV}={key}\0".encode()
    me, uid = os.getpid(), os.geteuid()
    found: List[int] = []
    group_runs = False
    for name in _pids():
        pid = int(name)
        info = proc_stat(pid) if pid != me else None
        if info is None or info.state in "ZX":
            continue
        if info.pgrp == group:
            group_runs = True
            continue
        if info.start_time >= since and _holds(pid, needle, uid):
            found.append(pid)
    return found, group_runs


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
