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
"""

from __future__ import annotations

import collections
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from guilds_code import limits as code_limits

from . import limits

TIMEOUT_EXIT_CODE = 124
"""exit_code of a harness stopped at its timeout, as timeout(1) reports it."""
PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = 0.05

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


def spawn(argv: List[str], cwd: str, env: Dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
    )


# --- finding and stopping what is left -----------------------------------------
def _proc_table() -> Optional[Dict[int, Tuple[str, int, int]]]:
    """pid -> (state, ppid, pgrp), read from /proc; None where there is none."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            fields = data[data.rfind(b")") + 2 :].split()
            table[int(name)] = (fields[0].decode("ascii", "replace"), int(fields[1]), int(fields[2]))
    return table or None


def _below(table: Dict[int, Tuple[str, int, int]], root: int) -> Set[int]:
    children = collections.defaultdict(list)
    for pid, (_, ppid, _) in table.items():
        children[ppid].append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def leftovers(pgid: int, keep: int = -1) -> List[int]:
    """Live processes of the group pgid and below this helper; reaps orphans
    that died (our children as subreaper), but not keep (Popen's to reap)."""
    table = _proc_table()
    me = os.getpid()
    if table is None:
        return [pgid] if _signal(pgid, 0, group=True) else []
    for pid, (state, ppid, _) in table.items():
        if ppid == me and state == "Z" and pid != keep:
            _reap(pid)
    below = _below(table, me)
    return [
        pid for pid, (state, _, pgrp) in table.items()
        if state not in ("Z", "X") and pid != me and (pgrp == pgid or pid in below)
    ]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal(pid: int, sig: int, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_leftovers(pgid: int, grace: float, keep: int = -1) -> None:
    """SIGTERM the group and every leftover; SIGKILL what is still alive after grace.

    keep: a child not to reap here (the harness, when Popen has not reaped it).
    """
    pids = leftovers(pgid, keep)
    if not pids:
        return
    _signal(pgid, signal.SIGTERM, group=True)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        pids = leftovers(pgid, keep)
    _signal(pgid, signal.SIGKILL, group=True)
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    leftovers(pgid, keep)  # reap what just died


# --- reading ---------------------------------------------------------------------
class _Pump:
    """Reads the two pipes into their sinks until both close or a deadline."""

    def __init__(self, proc: subprocess.Popen, on_stdout: Sink, on_stderr: Sink):
        self._sel = selectors.DefaultSelector()
        for pipe, sink in ((proc.stdout, on_stdout), (proc.stderr, on_stderr)):
            fd = pipe.fileno()  # type: ignore[union-attr]  # spawned with both pipes
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
    proc = spawn(argv, cwd, env)
    pump = _Pump(proc, on_stdout, on_stderr)
    deadline = time.monotonic() + timeout
    stopped, why = None, "timeout"
    grace: float = limits.KILL_GRACE_SECONDS
    try:
        while proc.poll() is None:
            if why == "timeout" and finished():
                why = "linger"
                deadline = min(deadline, time.monotonic() + limits.FINAL_EXIT_GRACE_SECONDS)
            if time.monotonic() >= deadline:
                stopped = why
                _terminate(proc, pump)
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
        stop_leftovers(proc.pid, grace, keep=proc.pid)
        pump.close()
        proc.stdout.close()  # type: ignore[union-attr]  # spawned with both pipes
        proc.stderr.close()  # type: ignore[union-attr]
        proc.wait()
    return _exit(proc.returncode, stopped)


def _terminate(proc: subprocess.Popen, pump: _Pump) -> None:
    """The timeout: SIGTERM the group, keep reading through the grace, SIGKILL."""
    _signal(proc.pid, signal.SIGTERM, group=True)
    grace_end = time.monotonic() + limits.KILL_GRACE_SECONDS
    while proc.poll() is None and time.monotonic() < grace_end:
        pump.pump(min(grace_end, time.monotonic() + 0.1))
    _signal(proc.pid, signal.SIGKILL, group=True)
    proc.wait()
