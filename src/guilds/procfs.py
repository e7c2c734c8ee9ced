"""The orchestrator's one reader of /proc/<pid>/stat (the sandbox's side has its own,
``guilds_code.proc``): a process's state, parent and start time, which with the pid
names one process for the life of the machine.
"""

from __future__ import annotations

__all__ = ["parent_pid", "raw_stat", "start_time"]

_PF_EXITING = 0x4


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
