"""A long-lived process inside a sandbox, with its stdin and stdout: what
``Sandbox.open_process`` returns, one class per way of reaching it.

``ProcessChannel`` is the contract. Its calls block, and are made from one
reader thread (``receive``) and from any thread one at a time (``send``):

- ``send(data)``: all of data to the process's stdin; ChannelClosed once the
  process or the connection is gone;
- ``receive()``: the next bytes of its stdout, b"" once it has ended;
- ``close()``: stdin closed, the connection ended, the process told to go
  (idempotent; a blocked ``receive`` then returns b"");
- ``stderr_tail()``: the last lines of its stderr, for an error message.

``Lines`` splits a channel's stdout into lines: it holds at most
CHANNEL_LINE_MAX_BYTES of a line not yet ended, and past that raises
LineTooLong, rather than keep whatever a process that reached the stdout (a
command of the same uid, through /proc/<pid>/fd/1) writes without a newline.
``read_lines(channel)`` reads a channel with it from a thread (and closes the
channel on LineTooLong); an event loop reads a ``LoopReadable`` one (a
LocalProcess, a DockerProcess) with it: it watches ``reader_fd`` and takes
what is there with ``receive_nowait``, writing with ``send_nowait``.

- ``LocalProcess``: a child of this process (local; bwrap through nsenter),
  in a session of its own: ``close`` ends its whole group;
- ``StartedProcess``: a process this one holds the pipes of but did not start
  (bwrap: a helper forked by the starter, ``bwrap_starter``), followed by a pidfd;
- ``DockerProcess``: one engine exec with stdin attached, its multiplexed
  stream read from the hijacked connection;
- ``DirectProcess``: a resident helper's channel on a TCP connection to it, beside
  the exec that started it (``kubernetes.channel = "direct"``);
- ``KubeProcess``: one pods/exec websocket with stdin, speaking
  ``v5.channel.k8s.io`` when the API server does (stdin closed by a close
  frame on channel 255), else ``v4.channel.k8s.io``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import ssl
import subprocess
import threading
import time
from typing import IO, Any, Callable, Iterator, Mapping, Protocol, Sequence

from ..errors import SandboxError
from ..limits import CHANNEL_CLOSE_WAIT_SECONDS, CHANNEL_LINE_MAX_BYTES

STDERR_TAIL_BYTES = 16 * 1024
"""What is kept of the process's stderr: its end, for 'code helper failed'."""
STDERR_TAIL_LINES = 5
_READ = 64 * 1024


class ChannelClosed(SandboxError):
    """The channel's process or connection is gone."""


class ProcessChannel(Protocol):
    def send(self, data: bytes) -> None: ...

    def receive(self) -> bytes: ...

    def close(self) -> None: ...

    def stderr_tail(self) -> str: ...


class LoopReadable(ProcessChannel, Protocol):
    """A channel an event loop can read and write without waiting on the process."""

    def reader_fd(self) -> int:
        """A descriptor to watch for readability, the caller's to close."""
        ...

    def receive_nowait(self) -> bytes | None:
        """The stdout bytes there now; None when none are (yet); b"" once it has ended."""
        ...

    def send_nowait(self, data: bytes) -> int:
        """Of data, how many bytes were written without waiting (0: none)."""
        ...

    def stdout_ended(self) -> None:
        """Its stdout was read to the end (by ``receive_nowait``'s caller)."""
        ...


class LineTooLong(SandboxError):
    """A line of a channel's stdout passed its bound without a newline; the channel is closed."""


class Lines:
    """A stream's bytes in, its whole lines (without the newline) out; at most
    max_bytes of a line not yet ended are held (LineTooLong past that)."""

    def __init__(self, max_bytes: int = CHANNEL_LINE_MAX_BYTES):
        self.max_bytes = max_bytes
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """The lines chunk ends, in order; LineTooLong at a line past max_bytes."""
        pending, start = self._pending, 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if len(pending) + end - start > self.max_bytes:
                self._too_long()
            if pending:
                pending += chunk[start:end]
                line = bytes(pending)
                pending.clear()
            else:
                line = chunk[start:end]
            yield line
            start = end + 1
        pending += chunk[start:]
        if len(pending) > self.max_bytes:
            self._too_long()

    def _too_long(self) -> None:
        self._pending.clear()
        raise LineTooLong(f"a line of more than {self.max_bytes} bytes without a newline on its stdout "
                          f"(something else writes there); the channel was closed")


def read_lines(channel: ProcessChannel, max_bytes: int = CHANNEL_LINE_MAX_BYTES,
               lines: Lines | None = None) -> Iterator[bytes]:
    """channel's stdout, line by line (without the newline), until it ends (or
    ``receive`` raises ChannelClosed). A line longer than max_bytes closes the
    channel and raises LineTooLong: no more than max_bytes and one read are held.
    lines: the splitter to go on with (a line begun by another reader)."""
    splitter = lines or Lines(max_bytes)
    while True:
        try:
            chunk = channel.receive()
        except ChannelClosed:
            return
        if not chunk:
            return
        try:
            yield from splitter.feed(chunk)
        except LineTooLong:
            channel.close()
            raise


class _Tail:
    """The end of a stream: at most STDERR_TAIL_BYTES, thread-safe enough (appends only)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * STDERR_TAIL_BYTES:
            del self.data[:-STDERR_TAIL_BYTES]

    def lines(self) -> str:
        text = bytes(self.data[-STDERR_TAIL_BYTES:]).decode("utf-8", "replace")
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-STDERR_TAIL_LINES:])


class PipedProcess:
    """A process whose stdin, stdout and stderr are pipes of this process; stderr kept by a thread.
    Its subclass says how it is waited for and ended (``_end``)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self._stdin, self._stdout, self._stderr = stdin, stdout, stderr
        self._tail = _Tail()
        self._closed = False
        self._stdout_ended = False
        self._stdin_nowait: int | None = None
        self._stdout_nowait: int | None = None
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True, name="guilds-stderr")
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        """Its process id on this machine."""
        raise NotImplementedError

    def _end(self) -> None:
        """Wait for the process (its stdin now closed) CHANNEL_CLOSE_WAIT_SECONDS, then SIGKILL its group."""
        raise NotImplementedError

    def _read_stderr(self) -> None:
        while chunk := self._stderr.read(_READ):
            self._tail.add(chunk)

    def send(self, data: bytes) -> None:
        try:
            self._stdin.write(data)
        except (OSError, ValueError) as exc:  # ValueError: written after close()
            raise ChannelClosed(f"the process is gone ({exc})") from exc

    def send_nowait(self, data: bytes) -> int:
        """All of data (at most PIPE_BUF bytes) to its stdin at once, or nothing (0)
        when the pipe has no room for it now: a write that never waits (on a
        descriptor of the pipe of its own, so that ``send`` still waits)."""
        if len(data) > select.PIPE_BUF:
            return 0
        try:
            if self._stdin_nowait is None:
                self._stdin_nowait = os.open(f"/proc/self/fd/{self._stdin.fileno()}",
                                             os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            return os.write(self._stdin_nowait, data)
        except BlockingIOError:
            return 0
        except (OSError, ValueError) as exc:  # ValueError: after close()
            raise ChannelClosed(f"the process is gone ({exc})") from exc

    def receive(self) -> bytes:
        try:
            data = self._stdout.read(_READ) or b""
        except (OSError, ValueError):
            data = b""
        self._stdout_ended = not data
        return data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._stdin.close()
        if self._stdin_nowait is not None:
            os.close(self._stdin_nowait)
        self._end()
        self._stderr_reader.join(CHANNEL_CLOSE_WAIT_SECONDS)
        for pipe in (self._stdout, self._stderr):
            with contextlib.suppress(OSError):
                pipe.close()

    def reader_fd(self) -> int:
        """A descriptor of its stdout for the caller alone (a duplicate, non-blocking,
        closed by the caller): an event loop's reader, which reads it with
        ``receive_nowait`` instead of ``receive`` and calls ``stdout_ended`` at its end."""
        fd = os.dup(self._stdout.fileno())
        os.set_blocking(fd, False)
        self._stdout_nowait = fd
        return fd

    def receive_nowait(self) -> bytes | None:
        if self._stdout_nowait is None:
            raise SandboxError("receive_nowait before reader_fd")
        try:
            return os.read(self._stdout_nowait, _READ)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def stdout_ended(self) -> None:
        """Its stdout was read to the end (by a reader of ``reader_fd``)."""
        self._stdout_ended = True

    def stderr_tail(self) -> str:
        """Once stdout has ended, what the process wrote to stderr before it went,
        read to its end (within CHANNEL_CLOSE_WAIT_SECONDS), not what the stderr
        thread happened to have read by then."""
        if self._stdout_ended:
            self._stderr_reader.join(CHANNEL_CLOSE_WAIT_SECONDS)
        return self._tail.lines()


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe Popen was asked for (PIPE), so it is there."""
    if stream is None:
        raise SandboxError("the process was started without that pipe")
    return stream


class LocalProcess(PipedProcess):
    """argv as a child of this process, in its own session: ``close`` ends its whole group."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None):
        try:
            self._proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(env), cwd=cwd, start_new_session=True, bufsize=0)
        except OSError as exc:
            raise SandboxError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        super().__init__(_piped(self._proc.stdin), _piped(self._proc.stdout), _piped(self._proc.stderr))

    @property
    def pid(self) -> int:
        """Its process id on this machine (its own until it is closed: only then waited for)."""
        return self._proc.pid

    def _end(self) -> None:
        try:
            self._proc.wait(CHANNEL_CLOSE_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


class StartedProcess(PipedProcess):
    """A process this one did not start but holds the pipes of, in a session of its own
    (a helper forked by bwrap's starter): followed by a pidfd, so that ``close`` ends its
    group only while it is that process."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self._pid = pid
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already (and reaped by its sandbox's init)
            self._pidfd = None
        super().__init__(stdin, stdout, stderr)

    @property
    def pid(self) -> int:
        return self._pid

    def _end(self) -> None:
        if self._pidfd is None:
            return
        try:
            poller = select.poll()  # not select: a server holding many agents has descriptors past FD_SETSIZE
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(int(CHANNEL_CLOSE_WAIT_SECONDS * 1000)):
                with contextlib.suppress(OSError):  # it runs: its pid is still its group's
                    os.killpg(self.pid, signal.SIGKILL)
        finally:
            os.close(self._pidfd)
            self._pidfd = None


class _SocketStream:
    """A channel whose stdout and stdin are one connected socket (``_sock``): what is
    read past the process's own bytes (a stream's framing) is taken off by ``_stdout_of``."""

    _sock: socket.socket
    _early: bytes

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"the {self.what} is gone ({exc})") from exc

    what = "connection"
    """What the socket is, for ChannelClosed's message."""

    def receive(self) -> bytes:
        while True:
            chunk, self._early = self._early, b""
            if not chunk:
                try:
                    chunk = self._sock.recv(_READ)
                except (OSError, ValueError):
                    chunk = b""
            if not chunk:
                return b""
            if out := self._stdout_of(chunk):
                return out

    def receive_nowait(self) -> bytes | None:
        chunk, self._early = self._early, b""
        if not chunk:
            try:
                chunk = self._sock.recv(_READ, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except (OSError, ValueError):
                return b""
            if not chunk:
                return b""
        return self._stdout_of(chunk) or None

    def _stdout_of(self, chunk: bytes) -> bytes:
        return chunk

    def reader_fd(self) -> int:
        """A duplicate of the connection's descriptor (the caller closes it), to watch;
        reads and writes through ``*_nowait`` leave the socket blocking for the others."""
        return os.dup(self._sock.fileno())

    def send_nowait(self, data: bytes) -> int:
        try:
            return self._sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise ChannelClosed(f"the {self.what} is gone ({exc})") from exc

    def stdout_ended(self) -> None:
        """Nothing to note: the stream's end is the connection's."""

    _closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._closed_after()

    def _closed_after(self) -> None:
        """What closing does once the connection is shut down."""


class DockerProcess(_SocketStream):
    """One exec with stdin attached: the engine's hijacked connection, read
    frame by frame (8-byte headers: stream, size), written as raw bytes."""

    what = "exec's connection"

    def __init__(self, response: Any, split_frames: Callable[[bytes], tuple], stop: Callable[[], None]):
        """response: the exec start's streamed response; split_frames: the stream's
        deframer; stop: ends the exec's processes inside (called by close)."""
        self._response = response
        self._reader = response.raw._fp.fp
        self._sock = self._reader.raw._sock
        self._split, self._stop = split_frames, stop
        self._buf, self._tail = b"", _Tail()
        self._early = self._buffered()
        self._sock.settimeout(None)

    def _buffered(self) -> bytes:
        """What the response's reader had read past the headers (taken out of it), with
        the socket not waited on: from then on the socket alone holds the stream."""
        self._sock.settimeout(0)
        try:
            held = self._reader.peek(1)
        except (BlockingIOError, OSError, ValueError):
            return b""
        return self._reader.read1(len(held)) if held else b""

    def _stdout_of(self, chunk: bytes) -> bytes:
        """The stdout in chunk's whole frames (stderr kept for the tail; a partial frame for the next chunk)."""
        frames, self._buf = self._split(self._buf + chunk)
        for stream, payload in frames:
            if stream == 2:
                self._tail.add(payload)
        return b"".join(payload for stream, payload in frames if stream == 1)

    @property
    def loop_readable(self) -> bool:
        """Readable by an event loop: a plain socket (a TLS one's records are read through its reader thread)."""
        return not isinstance(self._sock, ssl.SSLSocket)

    def _closed_after(self) -> None:
        with contextlib.suppress(Exception):
            self._response.close()
        self._stop()

    def stderr_tail(self) -> str:
        return self._tail.lines()


class DirectProcess(_SocketStream):
    """A resident helper's channel on a TCP connection of its own (``guilds_code.direct``),
    beside the process that started it (``via``, a KubeProcess whose exec's streams the
    helper gave up): via's stderr is read by a thread of its own into via's tail, and
    closing the connection ends the helper (its stdin's end), then via is closed."""

    what = "helper's connection"
    loop_readable = True

    def __init__(self, sock: socket.socket, via: Any, early: bytes = b""):
        """sock: connected, the helper's hello read from it (early: what came after it)."""
        self._sock, self._via, self._early = sock, via, early
        sock.settimeout(None)
        threading.Thread(target=self._drain_via, name="guilds-direct-stderr", daemon=True).start()

    def _drain_via(self) -> None:
        with contextlib.suppress(Exception):
            while self._via.receive():
                pass

    @property
    def peer(self) -> str:
        """The address the connection reaches."""
        return str(self._sock.getpeername()[0])

    def _closed_after(self) -> None:
        self._sock.close()
        self._via.close()

    def stderr_tail(self) -> str:
        return str(self._via.stderr_tail())


V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255


class KubeProcess:
    """One pods/exec websocket (``websocket.WebSocket``, connected with stdin)."""

    def __init__(self, ws: Any, stop: Callable[[], None] | None = None, *, ends_itself: bool = False,
                 early: bytes = b""):
        """ws: connected with the subprotocols offered; stop: ends the exec's
        processes inside (called by close, unless ends_itself and the exec was seen
        to end); ends_itself: the command ends what it started once its stdin ends
        (``_container.ending_argv``); early: stdout already read from ws."""
        self._ws = ws
        self._stop = stop
        self._ends_itself = ends_itself
        self._early = early
        self._tail = _Tail()
        self._lock = threading.Lock()
        self._closed = False
        self._ended = threading.Event()
        """Set once the stream has ended (the server's close, or the connection gone)."""
        self._reader: int | None = None
        """The thread that reads (``receive``), once one has."""
        self.status = b""
        """channel 3's final Status, once the process has ended."""

    @property
    def protocol(self) -> str:
        """The framing the API server chose (its handshake's Sec-WebSocket-Protocol)."""
        headers = self._ws.getheaders() or {}
        return (headers.get("sec-websocket-protocol") or V4).strip()

    def send(self, data: bytes) -> None:
        try:
            with self._lock:
                self._ws.send_binary(bytes([STDIN]) + data)
        except Exception as exc:  # websocket's errors share no root but Exception
            raise ChannelClosed(f"the exec's websocket is gone ({exc})") from exc

    def receive(self) -> bytes:
        self._reader = threading.get_ident()
        if self._early:
            early, self._early = self._early, b""
            return early
        while (frame := self._frame()) is not None:
            channel, payload = frame
            if channel == STDOUT:
                return payload
            if channel == STDERR:
                self._tail.add(payload)
        return b""

    def _frame(self) -> tuple[int, bytes] | None:
        """The next frame with data, (channel, payload), channel 3's kept in status; None
        at the end (the server's close, or the connection closed or reset)."""
        from websocket import ABNF, WebSocketTimeoutException

        while True:
            try:
                opcode, frame = self._ws.recv_data_frame(True)
            except WebSocketTimeoutException:
                raise
            except Exception:  # closed, reset, or closed by close(): the end either way
                self._ended.set()
                return None
            if opcode == ABNF.OPCODE_CLOSE:
                self._ended.set()
                return None
            data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
            if len(data) >= 2:
                if data[0] == STATUS:
                    self.status += data[1:]
                return data[0], data[1:]

    def read_to_mark(self, mark: bytes, deadline: float) -> bool:
        """Read until mark is on stderr (the command's stdout on the way kept for
        ``receive``, its stderr for the tail): True; False when the stream ended first
        (its status then in ``status``) or at deadline. Before any reader."""
        from websocket import WebSocketTimeoutException

        err = bytearray()
        try:
            while (left := deadline - time.monotonic()) > 0:
                self._ws.settimeout(left)
                try:
                    frame = self._frame()
                except WebSocketTimeoutException:
                    break
                if frame is None:
                    break
                channel, payload = frame
                if channel == STDOUT:
                    self._early += payload
                elif channel == STDERR:
                    err += payload
                    if mark in err:
                        before, _, after = bytes(err).partition(mark)
                        err[:] = before + after
                        return True
            return False
        finally:
            self._tail.add(bytes(err))
            with contextlib.suppress(Exception):
                self._ws.settimeout(None)

    def first_line(self, deadline: float) -> bytes | None:
        """The first line of stdout (its newline kept), read by deadline and left for
        ``receive`` with what came after it; None when the stream ended first or at
        deadline. Before any reader."""
        from websocket import WebSocketTimeoutException

        try:
            while b"\n" not in self._early and (left := deadline - time.monotonic()) > 0:
                self._ws.settimeout(left)
                try:
                    frame = self._frame()
                except WebSocketTimeoutException:
                    return None
                if frame is None:
                    return None
                channel, payload = frame
                if channel == STDOUT:
                    self._early += payload
                elif channel == STDERR:
                    self._tail.add(payload)
        finally:
            with contextlib.suppress(Exception):
                self._ws.settimeout(None)
        line, newline, _ = self._early.partition(b"\n")
        return line + newline if newline else None

    def forget_early(self) -> None:
        """What was read for ``first_line`` is not for a reader (the channel went elsewhere)."""
        self._early = b""

    def close(self) -> None:
        """stdin closed; a command that ends itself is waited for (up to
        CHANNEL_CLOSE_WAIT_SECONDS, as a local process is): seen to end with its status,
        it needs no ``stop``, which otherwise runs (an exec of its own)."""
        if self._closed:
            return
        self._closed = True
        ended = self._ended.is_set() and bool(self.status)
        if self.protocol == V5 and not ended:
            with contextlib.suppress(Exception), self._lock:
                self._ws.send_binary(bytes([CLOSE, STDIN]))
            if self._ends_itself and self._reader not in (None, threading.get_ident()):
                ended = self._ended.wait(CHANNEL_CLOSE_WAIT_SECONDS) and bool(self.status)
        with contextlib.suppress(Exception):  # not ws.close(): the reader thread reads its reply
            self._ws.send_close()
        with contextlib.suppress(Exception):
            self._ws.shutdown()
        if self._stop is not None and not ended:
            self._stop()

    def stderr_tail(self) -> str:
        return self._tail.lines()
