"""The one supervise loop of both helpers: a started command's output, its clocks, a cancel.

shell (ops/shell.py) and code_task (guilds_harness/process.py) run their
command the same way::

    with Supervisor() as supervisor:          # a cancel is caught from here on
        child = proc.spawn(..., session=True)  # the command leads its own group
        ended = supervisor.run(child, timeout, sinks, rules)

``run`` returns once the command is done, and meanwhile:

- output: each pipe of the child (stdout, then stderr when piped apart) is
  read in chunks of limits.READ_CHUNK as it comes, each chunk handed to its
  sink (shell: the log and the shaped capture; code_task: the framers of the
  harness's stream). Nothing is held here;
- the timeout: past ``timeout`` seconds, SIGTERM to what a stop reaches
  (``rules.group``: the process group the command leads), SIGKILL
  ``rules.kill_grace`` later unless all of it is gone first
  (``Ended.stopped == "timeout"``);
- ``finished()`` true (code_task: the harness printed its final event): the
  command has ``rules.final_grace`` more to exit, then is stopped the same
  way (``stopped == "linger"``);
- the drain: once the command has exited, its pipes are read until EOF, for
  at most ``rules.drain`` seconds, so a grandchild holding one cannot pin the call;
- leftovers: with ``rules.stop_leftovers``, what a stop reaches that is still
  alive after the drain is stopped as at the timeout (a shell command's
  background jobs are left running);
- a cancel: SIGTERM, SIGHUP or SIGINT to the helper stops the command (or
  shortens a stop under way) with limits.CANCEL_KILL_GRACE_SECONDS of grace:
  its own session would otherwise outlive the helper. ``Ended.cancelled``
  names the first such signal; what the helper does then is the caller's.

Done: the command has exited and drained, and a stop begun has ended (all of
it gone, or SIGKILL sent). The loop sleeps in poll on the pipes and a pidfd of
the command (without one it looks every limits.PROCESS_POLL_SECONDS).
"""

from __future__ import annotations

import os
import select
import time

from . import limits
from .proc import group_alive, signal_group, signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Sequence

    from .proc import Child

    Sink = Callable[[bytes], None]

CANCEL_SIGNALS = (signals.SIGTERM, signals.SIGHUP, signals.SIGINT)
_MALLOC_SETTLE_BYTES = 16 * limits.READ_CHUNK
"""See _raise_malloc_thresholds: the trim threshold becomes twice this (2 MiB)."""


class ProcessGroup:
    """What a stop reaches: the process group that the command (pgid) leads."""

    __slots__ = ("pgid",)

    def __init__(self, pgid: int):
        self.pgid = pgid

    def signal(self, sig: int) -> None:
        signal_group(self.pgid, sig)

    def alive(self) -> bool:
        return group_alive(self.pgid)


class Rules:
    """What differs between two supervised commands (see the module docstring).

    group: makes, from the command's pid, what a stop signals and waits for
    (ProcessGroup, or one with the same two methods).
    """

    __slots__ = ("kill_grace", "drain", "final_grace", "stop_leftovers", "group")

    def __init__(self, *, kill_grace: float, drain: float, final_grace: float = 0.0,
                 stop_leftovers: bool = False, group: Callable[[int], ProcessGroup] = ProcessGroup):
        self.kill_grace, self.drain, self.final_grace = kill_grace, drain, final_grace
        self.stop_leftovers, self.group = stop_leftovers, group


SHELL = Rules(kill_grace=limits.SHELL_KILL_GRACE_SECONDS, drain=limits.SHELL_DRAIN_SECONDS)
"""shell's: its grace and drain; a command's background jobs outlive it."""


class Ended:
    """How a supervised command ended.

    returncode: as proc.Child reports it (-N: signal N). stopped: None, or
    "timeout" / "linger" when the loop stopped it. cancelled: the signal that
    cancelled it, or None.
    """

    __slots__ = ("returncode", "stopped", "cancelled")

    def __init__(self, returncode: int, stopped: Optional[str], cancelled: Optional[int]):
        self.returncode, self.stopped, self.cancelled = returncode, stopped, cancelled


class Supervisor:
    """Catches the cancel signals from its making to its close; ``run`` supervises
    a command started meanwhile (see the module docstring)."""

    def __init__(self) -> None:
        self.cancelled: Optional[int] = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self._saved = {sig: signals.signal(sig, self._on_signal) for sig in CANCEL_SIGNALS}

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _on_signal(self, signum, frame) -> None:
        if self.cancelled is None:
            self.cancelled = signum
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def run(self, child: Child, timeout: float, sinks: Sequence[Sink], rules: Rules,
            finished: Optional[Callable[[], bool]] = None) -> Ended:
        """Supervise child until it is done; sinks take its stdout, then its stderr
        (when piped apart). Its pipes are closed on return."""
        _raise_malloc_thresholds()
        loop = _Loop(self, child, timeout, sinks, rules, finished)
        try:
            loop.run()
        finally:
            loop.close()
        return Ended(child.returncode, loop.stopped, self.cancelled)  # type: ignore[arg-type]  # reaped

    def close(self) -> None:
        for sig, handler in self._saved.items():
            signals.signal(sig, handler)
        os.close(self.wake_r)
        os.close(self.wake_w)


class _Malloc:
    settled = False
    """_raise_malloc_thresholds ran in this process (or in the one it was forked from)."""


def _raise_malloc_thresholds() -> None:
    """Allocate and free one block above glibc's default mmap threshold (128 KiB),
    once per process.

    glibc then raises that threshold, and its trim threshold to twice the block,
    so the loop's buffers (a read, its text, its shaped bytes: 64 KiB each) stop
    handing the top of the heap back to the kernel after every read, to fault it
    in again at the next: two brk calls a read, a third of the helper's time when
    a command prints a GiB. The thresholds only ever rise and a fork keeps them,
    so a resident worker pays the 1 MiB block at its first command only.
    Elsewhere than glibc, an allocation and nothing more.
    """
    if not _Malloc.settled:
        bytearray(_MALLOC_SETTLE_BYTES)
        _Malloc.settled = True


class _Loop:
    """One command's clocks: the timeout or linger, the SIGKILL after SIGTERM, the drain."""

    def __init__(self, supervisor: Supervisor, child: Child, timeout: float, sinks: Sequence[Sink],
                 rules: Rules, finished: Optional[Callable[[], bool]]):
        self.supervisor, self.child, self.rules, self.finished = supervisor, child, rules, finished
        self.group = rules.group(child.pid)
        self.deadline = time.monotonic() + timeout
        self.stopped: Optional[str] = None
        self.lingering = self.killed = self.swept = False
        self.kill_at: Optional[float] = None
        self.exited_at: Optional[float] = None
        self.poller = select.poll()
        self.sinks: Dict[int, Sink] = {}
        for fd, sink in zip((child.stdout, child.stderr), sinks):
            if fd is not None:
                self.sinks[fd] = sink
                self.poller.register(fd, select.POLLIN)
        self.pidfd = _pidfd(child.pid)
        for fd in (self.pidfd, supervisor.wake_r):
            if fd is not None:
                self.poller.register(fd, select.POLLIN)

    def run(self) -> None:
        while True:
            now = time.monotonic()
            self._step_clock(now)
            if self._done(now):
                return
            wait = max(0.0, self._next_event(now) - now)
            for fd, _ in self.poller.poll(int(wait * 1000) + 1):
                self._on_ready(fd)

    def _step_clock(self, now: float) -> None:
        # With a pidfd, its readiness says when the command exits: no wait4 at every read.
        if self.exited_at is None and self.pidfd is None and self.child.poll() is not None:
            self.exited_at = now
        if self.exited_at is None:
            self._step_deadline(now)
        if self.supervisor.cancelled is not None and (self.exited_at is None or self.kill_at is not None):
            self._stop(now, limits.CANCEL_KILL_GRACE_SECONDS)
        if self.rules.stop_leftovers and self.exited_at is not None and not self.swept and self._drained(now):
            self._sweep(now)
        if self.kill_at is not None and not self.killed and now >= self.kill_at:
            self.killed = True
            self.group.signal(signals.SIGKILL)

    def _step_deadline(self, now: float) -> None:
        """While the command runs: its final event moves the deadline in; past it, a stop."""
        if not self.lingering and self.finished is not None and self.finished():
            self.lingering = True
            self.deadline = min(self.deadline, now + self.rules.final_grace)
        if self.stopped is None and now >= self.deadline:
            self.stopped = "linger" if self.lingering else "timeout"
            self._stop(now, self.rules.kill_grace)

    def _sweep(self, now: float) -> None:
        """After the drain: stop what is left (rules.stop_leftovers), unless a stop is under way."""
        self.swept = True
        if self.kill_at is None and self.group.alive():
            cancelled = self.supervisor.cancelled is not None
            self._stop(now, limits.CANCEL_KILL_GRACE_SECONDS if cancelled else self.rules.kill_grace)

    def _stop(self, now: float, grace: float) -> None:
        """SIGTERM now (once), SIGKILL at most grace later."""
        if self.kill_at is None:
            self.group.signal(signals.SIGTERM)
            self.kill_at = now + grace
        self.kill_at = min(self.kill_at, now + grace)

    def _drained(self, now: float) -> bool:
        return not self.sinks or now >= self.exited_at + self.rules.drain  # type: ignore[operator]  # exited

    def _done(self, now: float) -> bool:
        if self.exited_at is None or not self._drained(now):
            return False
        return self.kill_at is None or self.killed or not self.group.alive()

    def _next_event(self, now: float) -> float:
        times = [now + limits.SUPERVISE_IDLE_WAKE_SECONDS]
        if self.exited_at is None:
            if self.kill_at is None:
                times.append(self.deadline)
            if self.pidfd is None:
                times.append(now + limits.PROCESS_POLL_SECONDS)
        elif self.sinks and now < self.exited_at + self.rules.drain:
            times.append(self.exited_at + self.rules.drain)
        if self.kill_at is not None and not self.killed:
            times.append(self.kill_at)
            if self.exited_at is not None:
                times.append(now + limits.PROCESS_POLL_SECONDS)
        return min(times)

    def _on_ready(self, fd: int) -> None:
        if fd == self.supervisor.wake_r:
            os.read(fd, 64)
        elif fd == self.pidfd:
            self.poller.unregister(fd)
            os.close(fd)
            self.pidfd = None
            self.child.poll()
        else:
            data = os.read(fd, limits.READ_CHUNK)
            if data:
                self.sinks[fd](data)
            else:
                self.poller.unregister(fd)
                del self.sinks[fd]

    def close(self) -> None:
        """Close the pipes and the pidfd; a command still running (an error in a
        sink), or leftovers to stop, get SIGKILL."""
        for fd in (self.pidfd, self.child.stdout, self.child.stderr):
            if fd is not None:
                os.close(fd)
        if self.child.returncode is None or (self.rules.stop_leftovers and self.group.alive()):
            self.group.signal(signals.SIGKILL)
            self.child.wait()


def _pidfd(pid: int) -> Optional[int]:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None
