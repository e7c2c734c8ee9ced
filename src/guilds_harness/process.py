"""The one path that runs a harness: spawn, stream, stop.

``run_process(argv, cwd, env, timeout, on_stdout, on_stderr, finished)``:

- starts argv in its own session (so its process group is its own), stdin
  closed, in cwd, with exactly env;
- reads stdout and stderr as they come, in chunks of limits.READ_CHUNK, and
  hands each chunk to its callback (the callbacks frame lines and log them:
  nothing is held here);
- past ``timeout`` seconds sends SIGTERM to the whole group, then SIGKILL
  limits.KILL_GRACE_SECONDS later; once ``finished()`` is true (the harness
  printed its final event), it has limits.FINAL_EXIT_GRACE_SECONDS to exit
  before the same happens (``lingered``, not ``timed_out``);
- after the harness exits, reads a leftover child's output for at most
  limits.DRAIN_SECONDS, then stops what is left (``stop_leftovers``);
- returns ``Exit(exit_code, signal, timed_out, lingered)``: exit_code is the
  harness's own, 128 + N when signal N ended it, or 124 when it was stopped
  (as the shell tool and timeout(1) report it). Never 0 for a kill.

Leftovers are the live processes of the harness's group and, where /proc
exists, every live process below this helper: with ``become_subreaper()``
(Linux), an orphan of the harness is re-parented to the helper instead of
init, so even a child that left the group with setsid is found and stopped.

A program that cannot start raises OSError from ``spawn``; the caller checks
with ``shutil.which`` first and reports "not installed".

Starting, signalling and reading /proc are guilds-code's own (``guilds_code.proc``):
one core for both helpers; the grace and drain times are ``guilds_code.limits``'.
"""

from __future__ import annotations

import collections
import os
import selectors
import signal
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set

from guilds_code import limits as code_limits
from guilds_code import proc
from guilds_code.proc import Child, ProcStat, signal_group, signal_process

from . import limits

TIMEOUT_EXIT_CODE = 124
"""exit_code of a harness stopped at its timeout, as timeout(1) reports it."""
PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = code_limits.PROCESS_POLL_SECONDS

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


def stop_leftovers(pgid: int, grace: float, keep: int = -1) -> None:
    """SIGTERM the group and every leftover; SIGKILL what is still alive after grace.

    keep: a child not to reap here (the harness, when its Child has not reaped it).
    """
    pids = leftovers(pgid, keep)
    if not pids:
        return
    signal_group(pgid, signal.SIGTERM)
    for pid in pids:
        signal_process(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        pids = leftovers(pgid, keep)
    signal_group(pgid, signal.SIGKILL)
    for pid in pids:
        signal_process(pid, signal.SIGKILL)
    leftovers(pgid, keep)  # reap what just died


# --- reading ---------------------------------------------------------------------
class _Pump:
    """Reads the two pipes into their sinks until both close or a deadline."""

    def __init__(self, child: Child, on_stdout: Sink, on_stderr: Sink):
        self._sel = selectors.DefaultSelector()
        for fd, sink in ((child.stdout, on_stdout), (child.stderr, on_stderr)):
            if fd is None:  # not piped
                continue
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ, sink)

    def pump(self, until: float) -> None:
        """Read what comes until the deadline (monotonic); sleep when both pipes closed."""
        while time.monotonic() < until:
            if not self._sel.get_map():
                time.sleep(min(POLL_SECONDS, max(until - time.monotonic(), 0)))
                return
            for key, _ in self._sel.select(min(until - time.monotonic(), 0.25)):
                self._read(key)

    def drained(self) -> bool:
        return not self._sel.get_map()

    def _read(self, key: selectors.SelectorKey) -> None:
        try:
            data = os.read(key.fd, limits.READ_CHUNK)
        except BlockingIOError:
            return
        if data:
            key.data(data)
        else:
            self._sel.unregister(key.fd)

    def close(self) -> None:
        for fd in list(self._sel.get_map()):
            self._sel.unregister(fd)
        self._sel.close()


def _exit(returncode: int, stopped: Optional[str]) -> Exit:
    if stopped:
        signo = -returncode if returncode < 0 else None
        return Exit(TIMEOUT_EXIT_CODE, signo, stopped == "timeout", stopped == "linger")
    if returncode < 0:
        return Exit(128 - returncode, -returncode)
    return Exit(returncode)


CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Cancelled(BaseException):
    """The helper was told to stop (a cancelled call) while the harness ran."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_cancelled(signum, _frame) -> None:
    raise Cancelled(signum)


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
    for signum in CANCEL_SIGNALS:
        signal.signal(signum, _raise_cancelled)
    try:
        exit_ = _supervise(argv, cwd, env, timeout, on_stdout, on_stderr, finished)
    except Cancelled as cancel:
        _die_by(cancel.signum)
        raise
    for signum in CANCEL_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    return exit_


def _supervise(argv, cwd, env, timeout, on_stdout, on_stderr, finished) -> Exit:
    child = spawn(argv, cwd, env)
    pump = _Pump(child, on_stdout, on_stderr)
    deadline = time.monotonic() + timeout
    stopped, why = None, "timeout"
    grace: float = limits.KILL_GRACE_SECONDS
    try:
        while child.poll() is None:
            if why == "timeout" and finished():
                why = "linger"
                deadline = min(deadline, time.monotonic() + limits.FINAL_EXIT_GRACE_SECONDS)
            if time.monotonic() >= deadline:
                stopped = why
                _terminate(child, pump)
            else:
                pump.pump(min(deadline, time.monotonic() + 0.25))
        drain_end = time.monotonic() + limits.DRAIN_SECONDS
        while not pump.drained() and time.monotonic() < drain_end:
            pump.pump(drain_end)
    except Cancelled:
        grace = code_limits.CANCEL_KILL_GRACE_SECONDS
        raise
    finally:
        for signum in CANCEL_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        stop_leftovers(child.pid, grace, keep=child.pid)
        pump.close()
        for fd in (child.stdout, child.stderr):
            if fd is not None:
                os.close(fd)
        child.wait()
    return _exit(child.wait(), stopped)


def _terminate(child: Child, pump: _Pump) -> None:
    """The timeout: SIGTERM the group, keep reading through the grace, SIGKILL."""
    signal_group(child.pid, signal.SIGTERM)
    grace_end = time.monotonic() + limits.KILL_GRACE_SECONDS
    while child.poll() is None and time.monotonic() < grace_end:
        pump.pump(min(grace_end, time.monotonic() + 0.1))
    signal_group(child.pid, signal.SIGKILL)
    child.wait()
