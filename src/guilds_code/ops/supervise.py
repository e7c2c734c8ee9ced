"""One command's clocks: its timeout, the SIGKILL after SIGTERM, the drain, a cancel.

``execute(child, timeout, sink)`` pumps a started command's output pipe into
sink until the command is done (see its docstring). The command leads its own
process group (proc.spawn with session), so every signal goes to the group.
"""

from __future__ import annotations

import os
import select
import time

from .. import limits
from ..proc import group_alive, release, signal_group, signals, watch_group

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

    from ..proc import Child

_TICK = 0.05
"""Without a pidfd, how often the loop looks whether bash has exited."""
CANCEL_SIGNALS = (signals.SIGTERM, signals.SIGHUP, signals.SIGINT)
_MALLOC_SETTLE_BYTES = 16 * limits.READ_CHUNK
"""See _raise_malloc_thresholds: the trim threshold becomes twice this (2 MiB)."""


class Outcome:
    """How a command ended: its exit code (124 at the timeout) and whether it timed out."""

    __slots__ = ("exit_code", "timed_out")

    def __init__(self, exit_code: int, timed_out: bool):
        self.exit_code, self.timed_out = exit_code, timed_out


def exit_status(returncode: int) -> int:
    """A returncode as bash reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def execute(child: Child, timeout: float, sink: Callable[[bytes], None]) -> Outcome:
    """Pump the child's output into sink until it is done; enforce the timeout.

    Done: bash has exited and the pipe is at EOF or drained for
    SHELL_DRAIN_SECONDS; after a SIGTERM also the group is empty or killed.
    A SIGTERM, SIGHUP or SIGINT to the helper meanwhile ends the command's
    group (CANCEL_KILL_GRACE_SECONDS), which its own session would otherwise
    keep alive.
    """
    _raise_malloc_thresholds()
    loop = _Loop(child, timeout, sink)
    watchdog = watch_group(child.pid)  # the command dies with the helper, even by SIGKILL
    try:
        loop.run()
    finally:
        loop.close()
        release(watchdog)
    if loop.timed_out:
        return Outcome(limits.TIMEOUT_EXIT_CODE, True)
    return Outcome(exit_status(child.returncode), False)


def _raise_malloc_thresholds() -> None:
    """Allocate and free one block above glibc's default mmap threshold (128 KiB).

    glibc then raises that threshold, and its trim threshold to twice the block,
    so the loop's buffers (a read, its text, its shaped bytes: 64 KiB each) stop
    handing the top of the heap back to the kernel after every read, to fault it
    in again at the next: two brk calls a read, a third of the helper's time when
    a command prints a GiB. Elsewhere than glibc, an allocation and nothing more.
    """
    bytearray(_MALLOC_SETTLE_BYTES)


class _Loop:
    """One command's clocks: the timeout, the SIGKILL after SIGTERM, the drain."""

    def __init__(self, child: Child, timeout: float, sink: Callable[[bytes], None]):
        self.child = child
        self.sink = sink
        self.deadline = time.monotonic() + timeout
        self.timed_out = self.cancelled = self.killed = False
        self.kill_at: Optional[float] = None
        self.exited_at: Optional[float] = None
        self.poller = select.poll()
        self.out_fd: Optional[int] = self._watch(child.stdout)
        self.pidfd = self._watch(_pidfd(child.pid))
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self._watch(self.wake_r)
        self.saved = {sig: signals.signal(sig, self._on_signal) for sig in CANCEL_SIGNALS}

    def _watch(self, fd: Optional[int]) -> Optional[int]:
        if fd is not None:
            self.poller.register(fd, select.POLLIN)
        return fd

    def _on_signal(self, signum, frame) -> None:
        self.cancelled = True
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

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
        # With a pidfd, its readiness says when bash exits: no wait4 at every read.
        if self.exited_at is None and self.pidfd is None and self.child.poll() is not None:
            self.exited_at = now
        if self.exited_at is None and not self.timed_out and now >= self.deadline:
            self.timed_out = True
            self._terminate(now, limits.SHELL_KILL_GRACE_SECONDS)
        if self.exited_at is None and self.cancelled:
            self._terminate(now, limits.CANCEL_KILL_GRACE_SECONDS)
        if self.kill_at is not None and not self.killed and now >= self.kill_at:
            self.killed = True
            signal_group(self.child.pid, signals.SIGKILL)

    def _terminate(self, now: float, grace: float) -> None:
        if self.kill_at is None:
            signal_group(self.child.pid, signals.SIGTERM)
            self.kill_at = now + grace
        self.kill_at = min(self.kill_at, now + grace)

    def _done(self, now: float) -> bool:
        if self.exited_at is None:
            return False
        drained = self.out_fd is None or now >= self.exited_at + limits.SHELL_DRAIN_SECONDS
        if self.kill_at is None or self.killed:
            return drained
        return drained and not group_alive(self.child.pid)

    def _next_event(self, now: float) -> float:
        times = [now + 1.0]
        if self.exited_at is None:
            if self.kill_at is None:
                times.append(self.deadline)
            if self.pidfd is None:
                times.append(now + _TICK)
        elif self.out_fd is not None:
            times.append(self.exited_at + limits.SHELL_DRAIN_SECONDS)
        if self.kill_at is not None and not self.killed:
            times.append(self.kill_at)
            if self.exited_at is not None:
                times.append(now + _TICK)
        return min(times)

    def _on_ready(self, fd: int) -> None:
        if fd == self.wake_r:
            os.read(fd, 64)
        elif fd == self.pidfd:
            self.poller.unregister(fd)
            os.close(fd)
            self.pidfd = None
            self.child.poll()
        else:
            data = os.read(fd, limits.READ_CHUNK)
            if data:
                self.sink(data)
            else:
                self.poller.unregister(fd)
                self.out_fd = None

    def close(self) -> None:
        for sig, handler in self.saved.items():
            signals.signal(sig, handler)
        for fd in (self.pidfd, self.wake_r, self.wake_w):
            if fd is not None:
                os.close(fd)
        os.close(self.child.stdout)
        if self.child.returncode is None:
            signal_group(self.child.pid, signals.SIGKILL)
            self.child.wait()


def _pidfd(pid: int) -> Optional[int]:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None
