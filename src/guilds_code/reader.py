"""The next request read off the channel by a waiting worker itself (``guilds-code serve``).

While no request runs, the server names one waiting worker the reader (READ into its
request pipe) and reads stdin no more: the next frame then wakes that worker alone, and it
runs the request at once, with no hop through the server. Each worker keeps the channel's
stdin it was forked with on a descriptor no command inherits (close-on-exec; its own 0 is
/dev/null); named the reader, it waits for stdin or its request pipe, and reads stdin once:

- one whole frame, a request the server would run as it is (``one_request``): it runs the
  request, as one handed to it, and says ``T <id>`` into its answer pipe when the op is done
  (with SENT, in one write after its answer frame: ``resident._answer``) or
  limits.SERVE_READER_TELL_SECONDS after it took the frame, whichever comes first
  (``tell``: SIGALRM, which a blocking call outlasts, PEP 475); the
  server, reading that, counts the request in flight and reads stdin again. A short request
  thus wakes the server once, with its answer, and not a second time while it runs: the
  server's turn on a CPU then cost the request's own turn about 0.15 ms. A cancel or the next
  request reaches the server that much later, at most. Meanwhile the request's id is in the
  worker's slot of the ledger (``Ledger``: the frames lock's memfd, which the server and its
  workers share), written without waking anyone: a reader that dies or is killed before it
  told still has its request answered, by the server, with the error of a worker that ended
  without an answer. Where there is no memfd, ``T <id>`` is said at once;
- anything else (a partial frame, several, a cancel, a keepalive, a frame gone wrong):
  ``G <n>`` and those n bytes, which the server takes as read from stdin itself;
- stdin's end: ``E``;
- no stdin to read (its descriptor is gone): ``N``, and the server names no reader again.

A reader whose server is gone (no longer its parent) runs nothing it read.

The server takes stdin back (UNDO into the request pipe) before it retires the worker,
cancels what runs or stops; the worker answers ``G 0``, or ``T <id>`` when a frame came
first. An UNDO the worker finds when it is no longer the reader is passed over. A reader
that lets a frame sit unread (it was stopped) is found by the server's clock and killed
(``limits.SERVE_READER_CHECK_SECONDS``). When the channel moves to a socket (``direct``), the
workers forked before, which hold the exec's stdin, are retired.
"""

from __future__ import annotations

import json
import os
import select

from . import limits
from .proc import signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional, Set, Tuple

    Taken = Tuple[str, object]

READ = b"R\n"
UNDO = b"U\n"
ENDED = b"E\n"
NO_STDIN = b"N\n"
READ_BYTES = 64 * 1024


def gave(data: bytes) -> bytes:
    """The message handing data (read from stdin) back to the server."""
    return b"G %d\n%s" % (len(data), data)


def took(frame_id: str) -> bytes:
    return b"T %s\n" % frame_id.encode("ascii")


class Reply:
    """What a reader said (``parse``): ``frame_id`` (it took that request), ``data`` (it gave
    those bytes back), ``ended`` (stdin's end) or ``unable`` (no stdin to read); ``rest``: what
    followed in its pipe."""

    __slots__ = ("frame_id", "data", "ended", "unable", "rest")

    def __init__(self, frame_id: Optional[str] = None, data: bytes = b"", ended: bool = False,
                 unable: bool = False, rest: bytes = b""):
        self.frame_id, self.data, self.ended, self.unable, self.rest = frame_id, data, ended, unable, rest


def parse(buffer: bytes) -> Optional[Reply]:
    """The reader's reply at the start of buffer; None while it is not whole. ValueError for
    anything else (the worker is not one to trust further)."""
    head, newline, rest = buffer.partition(b"\n")
    if not newline:
        return None
    if head == ENDED[:-1]:
        return Reply(ended=True, rest=rest)
    if head == NO_STDIN[:-1]:
        return Reply(unable=True, rest=rest)
    kind, _, value = head.partition(b" ")
    if kind == b"T":
        return Reply(frame_id=value.decode("ascii"), rest=rest)
    if kind == b"G":
        size = int(value)
        if len(rest) < size:
            return None
        return Reply(data=rest[:size], rest=rest[size:])
    raise ValueError(f"not a reader's reply: {head[:40]!r}")


class Ledger:
    """The id of the request each reader took and has not told yet, one slot a worker, in
    the frames lock's memfd (``resident._frames_lock``; its POSIX lock does not touch the
    bytes): the worker writes it with one pwrite, which wakes no one; the server reads it only
    when a reader dies or is killed, and clears it before it names one."""

    SLOT_BYTES = 136
    """A slot: an id of at most 128 bytes, NUL padded."""

    def __init__(self, fd: int):
        self.fd = fd
        self.used: Set[int] = set()

    def take_slot(self) -> int:
        """A slot no live worker holds (for a worker about to be forked)."""
        slot = next(n for n in range(len(self.used) + 1) if n not in self.used)
        self.used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        self.used.discard(slot)

    def clear(self, slot: int) -> None:
        os.pwrite(self.fd, bytes(self.SLOT_BYTES), slot * self.SLOT_BYTES)

    def write(self, slot: int, frame_id: str) -> None:
        os.pwrite(self.fd, frame_id.encode("ascii").ljust(self.SLOT_BYTES, b"\0"), slot * self.SLOT_BYTES)

    def taken(self, slot: int) -> Optional[str]:
        """The id in the slot; None when it is empty."""
        found = os.pread(self.fd, self.SLOT_BYTES, slot * self.SLOT_BYTES).rstrip(b"\0")
        return found.decode("ascii") if found else None


class RequestPipe:
    """A worker's request pipe, line by line: a request line (``<id> <json>``), READ or UNDO;
    ``channel``: the channel's stdin as the worker was forked with it (None: none); ``ledger``:
    the ledger and this worker's slot (None: a request taken is told at once); ``tell_after``:
    seconds after a take when it is told at the latest."""

    def __init__(self, fd: int, channel: Optional[int], ledger: Optional[Tuple[Ledger, int]] = None,
                 tell_after: float = limits.SERVE_READER_TELL_SECONDS):
        self.fd, self.channel, self.ledger, self.tell_after = fd, channel, ledger, tell_after
        self.buffer = b""
        self.to_tell: Optional[Tuple[int, bytes]] = None
        """(answer pipe, ``T <id>``) of the request taken, while the server has not been told."""
        if ledger is not None:
            signals.signal(signals.SIGALRM, lambda _signum, _frame: self.tell())

    def tell(self) -> None:
        """The server told of the request taken (``T <id>``), once: the SIGALRM handler. Safe
        at any moment: it writes at most one line, and only one not handed out by ``untold``."""
        to_tell, self.to_tell = self.to_tell, None
        if to_tell is not None:
            write_all(*to_tell)

    def untold(self) -> bytes:
        """``T <id>`` of the request taken, for the caller to write (b"" when told, or none
        was taken); from now on the clock tells nothing."""
        to_tell, self.to_tell = self.to_tell, None
        if to_tell is None:  # none taken, or told by the clock, which rings once
            return b""
        signals.setitimer(signals.ITIMER_REAL, 0)
        return to_tell[1]

    def _took(self, answers: int, frame_id: str) -> None:
        """A request taken: in the ledger now, and the server told when the op is done (``tell``)
        or at the clock; told at once where there is no ledger."""
        if self.ledger is None:
            write_all(answers, took(frame_id))
            return
        ledger, slot = self.ledger
        ledger.write(slot, frame_id)
        self.to_tell = (answers, took(frame_id))
        signals.setitimer(signals.ITIMER_REAL, self.tell_after)

    def next_line(self) -> bytes:
        """The next line, its newline kept; b"" at the pipe's end."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, READ_BYTES)
            if not chunk:
                return b""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def next_request(self, server: int, answers: int, one_request: Callable[[bytes], Optional[Taken]]):
        """The next request (its frame id and object), handed over or, named the reader, read
        off stdin; None at the pipe's end."""
        while True:
            line = self.next_line()
            if not line:
                return None
            if line == UNDO:  # it came after this worker had taken a frame: nothing to undo
                continue
            if line != READ:
                head, _, body = line.partition(b" ")
                return head.decode("ascii"), json.loads(body)
            taken = self._read_stdin(server, answers, one_request)
            if taken is not None:
                return taken

    def _read_stdin(self, server: int, answers: int, one_request: Callable[[bytes], Optional[Taken]]):
        """As the reader: the request of a frame taken; None once it gave back, or was undone."""
        try:
            data = self._wait_and_read(self.channel) if self.channel is not None else None
        except OSError:  # EBADF: the descriptor is gone
            self.channel = None
            data = None
        if self.channel is None:
            write_all(answers, NO_STDIN)
            return None
        if data is None:  # undone
            write_all(answers, gave(b""))
            return None
        if os.getppid() != server:  # the server is gone: nothing is run for a channel that ended
            return None
        if not data:
            write_all(answers, ENDED)
            return None
        taken = one_request(data)
        if taken is None:
            write_all(answers, gave(data))
        else:
            self._took(answers, taken[0])
        return taken

    def _wait_and_read(self, channel: int) -> Optional[bytes]:
        """stdin's next bytes (b"" at its end); None when the request pipe spoke first (UNDO,
        or its end: the server is gone)."""
        if self.buffer:
            return None
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(channel, select.POLLIN)
        while True:
            ready = dict(poller.poll())
            if self.fd in ready:
                return None
            try:
                return os.read(channel, READ_BYTES)
            except BlockingIOError:  # another reader (the server, after killing a late one) was first
                continue


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
