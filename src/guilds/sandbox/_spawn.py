"""The one spawn path: a backend builds an argv, these functions run it.

``run_process`` is the contract every exec goes through:

- the process runs in its own session and process group, stdin /dev/null;
- stdout is kept up to STDOUT_MAX_BYTES (the helper's envelope is one line),
  stderr only its last STDERR_KEEP_BYTES, read here as it arrives;
- past ``timeout`` the whole group gets SIGTERM, then SIGKILL
  KILL_GRACE_SECONDS later, and ``timed_out`` is set;
- once the process has exited, what is left in the pipes is read for at most
  DRAIN_SECONDS: a grandchild that keeps a pipe open cannot pin the call;
- if the awaiting task is cancelled, the group is stopped as on a timeout
  (SIGTERM first, so a helper can end what it started in sessions of its own),
  and the cancellation goes on once that is done; cancelled again meanwhile,
  it goes on at once and the stop finishes in the background;
- a process killed by signal N reports ``exit_code`` -N, never 0;
- the process gets SIGTERM when this orchestrator process dies (Linux's
  parent-death signal): a killed ``guilds call`` or server leaves no helper
  behind, and a helper told to stop ends its command's group.

``spawn_detached`` starts a long-lived process (a sandbox's init) that outlives
us; ``succeeds`` runs a quick probe. The /proc helpers identify a process by pid
*and* start time, so a reused pid is never mistaken for ours.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import math
import os
import select
import signal
import subprocess
import time
from typing import Callable, Mapping, Sequence

from ..errors import SandboxError
from ..limits import EXEC_DRAIN_SECONDS, EXEC_KILL_GRACE_SECONDS, GROUP_POLL_SECONDS
from ..procfs import parent_pid, raw_stat, start_time  # noqa: F401 - parent_pid: the backends import it from here
from .base import ExecResult

STDOUT_MAX_BYTES = 4 * 1024 * 1024
"""stdout kept: the envelope is one line, already capped by the helper."""
STDERR_KEEP_BYTES = 64 * 1024
"""stderr kept (its end): enough for the tail quoted in 'code helper failed'."""
KILL_GRACE_SECONDS = EXEC_KILL_GRACE_SECONDS
"""guilds.limits.EXEC_KILL_GRACE_SECONDS: SIGTERM to the group, then SIGKILL this much later."""
DRAIN_SECONDS = EXEC_DRAIN_SECONDS
"""guilds.limits.EXEC_DRAIN_SECONDS: after the process exited, how long to keep reading pipes."""
_READ = 64 * 1024


class _Collector(asyncio.SubprocessProtocol):
    """Bounded stdout head and stderr tail; futures for exit and pipes closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exited = loop.create_future()
        self.closed = loop.create_future()
        self._open = 2

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self.stdout += data[: STDOUT_MAX_BYTES - len(self.stdout)]
            return
        self.stderr += data
        if len(self.stderr) > 2 * STDERR_KEEP_BYTES:
            del self.stderr[:-STDERR_KEEP_BYTES]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open -= 1
        if self._open <= 0 and not self.closed.done():
            self.closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _settled(future: asyncio.Future, timeout: float) -> bool:
    """Wait up to timeout for future, without cancelling it; True when done."""
    await asyncio.wait({future}, timeout=timeout)
    return future.done()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


async def _stop_group(pgid: int, exited: asyncio.Future) -> None:
    """SIGTERM to the group; SIGKILL to what is left once it is empty or
    KILL_GRACE_SECONDS have passed. The group is waited for, not only its
    leader: under bwrap the leader (nsenter) dies at the SIGTERM while the
    helper it started is still stopping its command's group."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    while _group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(GROUP_POLL_SECONDS)
    _signal_group(pgid, signal.SIGKILL)
    await _settled(exited, KILL_GRACE_SECONDS)


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    timeout: float,
    in_child: Callable[[], None] | None = None,
) -> ExecResult:
    """Run argv to its end or its timeout (see the module docstring).

    in_child: run in the child before argv is executed (a sandbox's rlimits and
    cgroup); it must only make system calls (it runs between fork and exec).
    """
    loop = asyncio.get_running_loop()
    start = asyncio.ensure_future(loop.subprocess_exec(
        lambda: _Collector(loop), *argv, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
        start_new_session=True, preexec_fn=_dies_with_us(in_child),
    ))
    try:
        # shielded: asyncio's own answer to a cancel while the pipes connect is a SIGKILL to
        # the leader alone, then a wait for the pipes its children hold (as long as they run)
        transport, proto = await asyncio.shield(start)
    except OSError as exc:
        where = f" in {cwd}" if cwd else ""
        raise SandboxError(f"cannot run {argv[0]}{where}: {exc.strerror or exc}") from exc
    except BaseException:  # cancelled while it starts: once started, its group is stopped as below
        await _unless_cancelled(_in_background(_stop_once_started(start)))
        raise
    pgid = transport.get_pid()
    try:
        timed_out = not await _settled(proto.exited, timeout)
        if timed_out:
            await _stop_group(pgid, proto.exited)
        await _settled(proto.closed, DRAIN_SECONDS)
    except BaseException:  # cancelled: stop the group first, unless cancelled again
        await _unless_cancelled(_in_background(_stop_and_close(transport, pgid, proto.exited)))
        raise
    transport.close()
    stderr = bytes(proto.stderr[-STDERR_KEEP_BYTES:])
    return ExecResult(transport.get_returncode(), bytes(proto.stdout), stderr, timed_out)


_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl():
    """libc's prctl, loaded before any fork (loading a library in a forked child is unsafe)."""
    return ctypes.CDLL(None, use_errno=True).prctl


def _dies_with_us(then: Callable[[], None] | None = None):
    """A preexec_fn: the child gets SIGTERM when this process dies (also if it already has),
    then runs ``then`` (if given)."""
    prctl, parent = _prctl(), os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        if then is not None:
            then()

    return in_child


async def _stop_and_close(transport: asyncio.SubprocessTransport, pgid: int, exited: asyncio.Future) -> None:
    try:
        await _stop_group(pgid, exited)
    finally:  # also when the loop shuts down meanwhile
        if not exited.done():
            _signal_group(pgid, signal.SIGKILL)
        transport.close()


async def _stop_once_started(start: asyncio.Future) -> None:
    """A process whose start was cancelled: its group stopped once it has started (if it does)."""
    try:
        transport, proto = await start
    except OSError:  # it did not start: nothing to stop
        return
    await _stop_and_close(transport, transport.get_pid(), proto.exited)


_BACKGROUND: set[asyncio.Task] = set()
"""Tasks that finish a cancelled process: held here so they are not collected."""


def _in_background(coro) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


async def _unless_cancelled(task: asyncio.Task) -> None:
    """Wait for task; a cancellation meanwhile leaves it running in the background."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass


def succeeds(argv: Sequence[str], *, timeout: float = 10) -> bool:
    """A quick probe: True when argv runs and exits 0 within timeout."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def output_of(argv: Sequence[str], *, timeout: float) -> str | None:
    """What argv prints (its stdout, else its stderr, stripped) when it exits 0 within
    timeout; None when it cannot run, fails or is late."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout or proc.stderr).strip() if proc.returncode == 0 else None


def read_until(fd: int, *, timeout: float, stop: bytes | None = None) -> bytes:
    """Read fd until EOF, until ``stop`` has arrived, or for timeout seconds; return what came.
    (poll, not select: a server holding many agents has descriptors past FD_SETSIZE.)"""
    data, deadline = b"", time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(math.ceil(left * 1000)):
            break
        chunk = os.read(fd, _READ)
        data += chunk
        if not chunk or (stop is not None and stop in data):
            break
    return data


def spawn_detached(
    argv: Sequence[str], *, env: Mapping[str, str], log_path: str, pass_fds: Sequence[int],
    timeout: float = 10,
) -> None:
    """Start argv so that it outlives us, and return at once.

    ``setsid --fork`` puts argv in a session of its own and hands it to init as
    parent, so it is neither our zombie nor killed with our process group.
    ``pass_fds`` (write ends of pipes argv names, as bwrap's ``--info-fd``) stay
    open in argv and are closed here. stdout and stderr go to ``log_path``.
    """
    try:
        with open(log_path, "ab") as log:
            subprocess.run(["setsid", "--fork", *argv], env=dict(env), stdin=subprocess.DEVNULL,
                           stdout=log, stderr=log, pass_fds=tuple(pass_fds), check=True,
                           timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc
    finally:
        for fd in pass_fds:
            os.close(fd)


def kill_and_wait(pid: int, started: int, *, timeout: float = 5) -> None:
    """SIGKILL pid if it is still the process that started at ``started``; wait until it has exited.

    Exited means a zombie or gone, not merely exiting: a pid namespace's init kills the
    namespace's other processes while it exits, and only then becomes a zombie.
    """
    if start_time(pid) != started:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _still_running(pid, started) and time.monotonic() < deadline:
        time.sleep(GROUP_POLL_SECONDS)


def _still_running(pid: int, started: int) -> bool:
    """True while pid is the process started at ``started`` and not yet a zombie (exiting counts)."""
    fields = raw_stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X") and int(fields[19]) == started
