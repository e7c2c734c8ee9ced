"""The one path that runs a harness: spawn, then the helpers' one supervise loop.

``run_process(argv, cwd, env, timeout, on_stdout, on_stderr, finished)``:

- starts argv in its own session (so its process group is its own), stdin
  closed, in cwd, with exactly env;
- runs it under ``guilds_code.supervise`` (shell's loop too) with ``TASK``:
  stdout and stderr go to their callbacks chunk by chunk as they come (the
  callbacks frame lines and log them: nothing is held here); past ``timeout``
  seconds what a stop reaches (``Leftovers``) gets SIGTERM, then SIGKILL
  limits.KILL_GRACE_SECONDS later; once ``finished()`` is true (the harness
  printed its final event), it has limits.FINAL_EXIT_GRACE_SECONDS to exit
  before the same happens (``lingered``, not ``timed_out``); after it exits,
  a leftover child's output is read for at most limits.DRAIN_SECONDS, then
  what is left is stopped the same way;
- returns ``Exit(exit_code, signal, timed_out, lingered)``: exit_code is the
  harness's own, 128 + N when signal N ended it, or 124 when it was stopped
  (as the shell tool and timeout(1) report it). Never 0 for a kill.

Leftovers are the live processes of the harness's group and, where /proc
exists, every live process below this helper: with ``become_subreaper()``
(Linux), an orphan of the harness is re-parented to the helper instead of
init, so even a child that left the group with setsid is found and stopped.

A program that cannot start raises OSError from ``spawn``; the caller checks
with ``shutil.which`` first and reports "not installed".

Starting, signalling, reading /proc and the loop are guilds-code's own
(``guilds_code.proc``, ``guilds_code.supervise``): one core for both helpers;
the grace and drain times are ``guilds_code.limits``', named again in
``guilds_harness.limits``.
"""

from __future__ import annotations

import collections
import os
import signal
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set

from guilds_code import proc
from guilds_code.proc import Child, ProcStat, signal_group, signal_process
from guilds_code.supervise import ProcessGroup, Rules, Supervisor

from . import limits

TIMEOUT_EXIT_CODE = 124
"""exit_code of a harness stopped at its timeout, as timeout(1) reports it."""
PR_SET_CHILD_SUBREAPER = 36

Sink = Callable[[bytes], None]


@dataclass
class Exit:
    exit_code: int
    signal: Optional[int] = None
    timed_out: bool = False
    lingered: bool = False


def become_subreaper() -> bool:
    """Make orphans below this process its children (Linux prctl); False elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def spawn(argv: List[str], cwd: str, env: Dict[str, str]) -> Child:
    """argv in cwd, in a session of its own, stdin /dev/null, stdout and stderr piped."""
    return proc.spawn(argv, env, stdout=proc.PIPE, stderr=proc.PIPE, cwd=cwd, session=True)


# --- finding and stopping what is left -----------------------------------------
def _below(table: Dict[int, ProcStat], root: int) -> Set[int]:
    children = collections.defaultdict(list)
    for pid, info in table.items():
        children[info.ppid].append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def leftovers(pgid: int, keep: int = -1) -> List[int]:
    """Live processes of the group pgid and below this helper; reaps orphans
    that died (our children as subreaper), but not keep (the Child's to reap)."""
    table = proc.proc_table()
    me = os.getpid()
    if table is None:
        return [pgid] if signal_group(pgid, 0) else []
    for pid, info in table.items():
        if info.ppid == me and info.state == "Z" and pid != keep:
            _reap(pid)
    below = _below(table, me)
    return [
        pid for pid, info in table.items()
        if info.state not in ("Z", "X") and pid != me and (info.pgrp == pgid or pid in below)
    ]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class Leftovers(ProcessGroup):
    """What a stop of the harness reaches: its group and every live process below
    this helper (``leftovers``); the harness itself is never reaped here."""

    __slots__ = ()

    def signal(self, sig: int) -> None:
        signal_group(self.pgid, sig)
        for pid in leftovers(self.pgid, keep=self.pgid):
            signal_process(pid, sig)

    def alive(self) -> bool:
        return bool(leftovers(self.pgid, keep=self.pgid))


TASK = Rules(kill_grace=limits.KILL_GRACE_SECONDS, drain=limits.DRAIN_SECONDS,
             final_grace=limits.FINAL_EXIT_GRACE_SECONDS, stop_leftovers=True, group=Leftovers)
"""code_task's rules for the supervise loop: its grace and drain times, the
final-event grace, and nothing it started left running."""


def _exit(returncode: int, stopped: Optional[str]) -> Exit:
    if stopped:
        signo = -returncode if returncode < 0 else None
        return Exit(TIMEOUT_EXIT_CODE, signo, stopped == "timeout", stopped == "linger")
    if returncode < 0:
        return Exit(128 - returncode, -returncode)
    return Exit(returncode)


def _die_by(signum: int) -> None:
    """End this process by the signal it was told to stop with, as if unhandled."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run_process(
    argv: List[str], cwd: str, env: Dict[str, str], timeout: float,
    on_stdout: Sink, on_stderr: Sink, finished: Callable[[], bool] = lambda: False,
) -> Exit:
    """Run the harness to its end, its timeout, or a cancel.

    A SIGTERM, SIGHUP or SIGINT to the helper while the harness runs (a call
    cancelled by the orchestrator) stops the harness's group and every process
    below this helper, with CANCEL_KILL_GRACE_SECONDS of grace, then ends the
    helper by that signal: the harness runs in a session of its own, so it
    would otherwise outlive the helper.
    """
    with Supervisor() as supervisor:  # a cancel is caught from before the spawn on
        child = spawn(argv, cwd, env)
        ended = supervisor.run(child, timeout, (on_stdout, on_stderr), TASK, finished)
    leftovers(child.pid)  # reap what the stop just ended
    if ended.cancelled is not None:
        _die_by(ended.cancelled)
        raise SystemExit(128 + ended.cancelled)  # not reached: the signal ends the helper
    return _exit(ended.returncode, ended.stopped)
