"""The orchestrator's one reader of /proc/<pid>/stat (the sandbox's side has its own,
``guilds_code.proc``): a process's state, parent and start time, which with the pid
names one process for the life of the machine.
"""

from __future__ import annotations

__all__ = ["parent_pid", "raw_stat", "running", "start_time"]

_PF_EXITING = 0x4
_SIGKILL_BIT = 1 << (9 - 1)
"""SIGKILL's bit in /proc/<pid>/status's pending masks (signal n is bit n - 1)."""


def raw_stat(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields after the command name (state first); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields after the command name; None if gone, exiting or a zombie."""
    fields = raw_stat(pid)
    if fields is None or fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
        return None
    return fields


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None if it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def parent_pid(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def running(pid: int, start: int) -> bool:
    """Whether the process (pid, started at ``start``) runs and is not being killed: neither gone,
    exiting nor a zombie, and no SIGKILL pending (sent and not yet acted on by the kernel)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            status = fh.read()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & _SIGKILL_BIT:
            return False
    return start_time(pid) == start  # read after: the status read was of this very process
