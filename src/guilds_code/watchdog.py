"""The resident server's one watchdog: a command's group is SIGKILLed when the
worker running it dies before it is done (even by SIGKILL), with no process
started per call.

The server starts it (``start``) before its first worker, and ends it when it is
idle with no worker left (``stop``; ``resume`` before the next fork): a process in a
session of its own, reading a pipe whose write end the server and every worker
hold (non-blocking, so a watchdog that stopped reading never holds a worker up).
Once a worker's command runs it writes ``W <worker pid> <pgid>``, and when it no
longer needs watching ``D <worker pid> <pgid>``: each line is shorter than
PIPE_BUF, so lines from many workers never mix. The watchdog follows each
watching worker with a pidfd. A worker that has exited with a group still
watched has that group SIGKILLed.

Ordering is what makes it exact: a worker writes ``D`` before it exits, and the
watchdog, having seen an exit, reads every line already in the pipe before it
acts on it; so a worker done in time is never acted on. The watchdog exits when
the pipe ends (the server and all its workers gone) and nothing is watched.

The lines need no answer, so while they keep coming the watchdog does not wake
for each (two a shell call, each a process to schedule beside the command): it
reads the pipe every limits.WATCHDOG_READ_SECONDS, and waits on the pipe again
once a read finds nothing. An exit of a worker it follows, and the pipe's end,
still wake it at once. The pipe holds thousands of lines meanwhile; a line that
does not fit is not written, and the call watches its group itself.

``watch_group`` and ``release`` are what an op calls: the shared watchdog where
it runs, else (the one-shot helper; no ``os.pidfd_open``: Python before 3.9 or
a kernel before 5.3; a line that cannot be written: the watchdog was killed,
its pipe is full) a watchdog of the call's own, ``proc.watch_group``.
"""

from __future__ import annotations

import os
import select

from . import limits, proc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Set, Union

READ_BYTES = 64 * 1024


class _Pipe:
    fd: Optional[int] = None
    """The pipe's write end in the server and its workers; None: no shared watchdog."""
    stopped = False
    """``stop`` ended a watchdog that ``start`` had started: ``resume`` starts one again."""


class Watched:
    """A group announced to the shared watchdog (``watch_group``), for ``release``."""

    __slots__ = ("pgid",)

    def __init__(self, pgid: int):
        self.pgid = pgid


def start() -> bool:
    """Start the shared watchdog for this process and the workers it will fork; False
    when pidfds are missing (callers then watch each call on its own)."""
    if not _pidfds_work():
        return False
    read_fd, write_fd = os.pipe()
    middle = os.fork()
    if middle == 0:  # forks again and exits, so the watchdog is nobody's child to reap
        try:
            os.close(write_fd)
            os.setsid()
            if os.fork() == 0:
                _detach(read_fd)
                _Watchdog(read_fd).run()
        finally:
            os._exit(0)
    os.close(read_fd)
    os.waitpid(middle, 0)
    os.set_blocking(write_fd, False)
    _Pipe.fd = write_fd
    return True


def stop() -> None:
    """The server is idle, with no worker: its write end closed, so the watchdog, with
    nothing to watch, exits (an idle agent keeps no watchdog's memory)."""
    if _Pipe.fd is not None:
        os.close(_Pipe.fd)
        _Pipe.fd, _Pipe.stopped = None, True


def start_later() -> None:
    """No watchdog now: the first ``resume`` starts one (a server woken from its sleep,
    ``asleep``, forks only once its stop signals are handled)."""
    _Pipe.stopped = True


def resume() -> None:
    """Before a worker is forked: a watchdog ``stop`` ended is started again."""
    if _Pipe.stopped:
        _Pipe.stopped = False
        start()


def watch_group(pgid: int) -> Union[Watched, proc.Watchdog, None]:
    """Have group pgid SIGKILLed if this process dies (even by SIGKILL) before
    ``release``: by the shared watchdog (announced), else by one of its own
    (``proc.watch_group``); None when neither could take it."""
    if _Pipe.fd is not None and _say(b"W", pgid):
        return Watched(pgid)
    return proc.watch_group(pgid)


def release(watching: Union[Watched, proc.Watchdog, None]) -> None:
    """This process is done with the group: its watchdog signals nothing."""
    if isinstance(watching, Watched):
        _say(b"D", watching.pgid)
    else:
        proc.release(watching)


def _say(kind: bytes, pgid: int) -> bool:
    line = b"%s %d %d\n" % (kind, os.getpid(), pgid)
    try:
        return os.write(_Pipe.fd, line) == len(line)  # type: ignore[arg-type]  # checked by the callers
    except OSError:  # BrokenPipeError: it is gone; BlockingIOError: it stopped reading
        return False


def _pidfds_work() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def _detach(keep: int) -> None:
    """/dev/null on 0, 1 and 2 (the server's stdout and stderr are the channel's),
    every other descriptor but keep closed."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)


class _Watchdog:
    """The loop (see the module docstring)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.open = True
        self.pending = b""
        self.groups: Dict[int, Set[int]] = {}  # worker pid -> its watched groups
        self.pidfds: Dict[int, int] = {}  # pidfd -> worker pid
        self.gone: Set[int] = set()  # workers found exited while reading, acted on next turn
        self.lines_coming = False  # the last read found lines: read again at the next tick
        os.set_blocking(fd, False)

    def run(self) -> None:
        while self.open or self.groups:
            exited = self._wait()
            self.lines_coming = self._read()
            for pid in exited:
                self._end(pid)

    def _wait(self) -> List[int]:
        """Sleep until an exit, the pipe's end, and a line (or, while lines come, the
        next tick); the workers seen exited (before the lines are read)."""
        poller = select.poll()
        if self.open:  # POLLHUP (the pipe's end) is reported without being asked for
            poller.register(self.fd, 0 if self.lines_coming else select.POLLIN)
        for pidfd in self.pidfds:
            poller.register(pidfd, select.POLLIN)
        tick = int(limits.WATCHDOG_READ_SECONDS * 1000) if self.lines_coming else None
        ready = poller.poll(0 if self.gone else tick)
        exited, self.gone = list(self.gone), set()
        return exited + [self.pidfds[fd] for fd, _ in ready if fd in self.pidfds]

    def _read(self) -> bool:
        """Take every line in the pipe; True when there was any."""
        got = False
        while self.open:
            try:
                data = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                self.open = False
                os.close(self.fd)
                break
            got = True
            lines = (self.pending + data).split(b"\n")
            self.pending = lines.pop()
            for line in lines:
                self._take(line)
        return got

    def _take(self, line: bytes) -> None:
        try:
            kind, pid_text, pgid_text = line.split()
            pid, pgid = int(pid_text), int(pgid_text)
        except ValueError:
            return
        if kind == b"D":
            self.groups.get(pid, set()).discard(pgid)
        elif kind == b"W":
            if pid not in self.groups:
                self._follow(pid)
            self.groups.setdefault(pid, set()).add(pgid)

    def _follow(self, pid: int) -> None:
        try:
            self.pidfds[os.pidfd_open(pid)] = pid
        except OSError:  # exited already: its lines are all written, read them first
            self.gone.add(pid)

    def _end(self, pid: int) -> None:
        """pid has exited: SIGKILL every group it left watched, and forget it."""
        for pgid in self.groups.pop(pid, ()):
            proc.signal_group(pgid, proc.signals.SIGKILL)
        for pidfd, owner in list(self.pidfds.items()):
            if owner == pid:
                del self.pidfds[pidfd]
                os.close(pidfd)

