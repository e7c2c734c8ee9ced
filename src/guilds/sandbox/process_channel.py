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

- ``LocalProcess``: a child of this process (local; bwrap through nsenter),
  in a session of its own: ``close`` ends its whole group;
- ``DockerProcess``: one engine exec with stdin attached, its multiplexed
  stream read from the hijacked connection;
- ``KubeProcess``: one pods/exec websocket with stdin, speaking
  ``v5.channel.k8s.io`` when the API server does (stdin closed by a close
  frame on channel 255), else ``v4.channel.k8s.io``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from typing import IO, Any, Callable, Mapping, Protocol, Sequence

from ..errors import SandboxError
from ..limits import CHANNEL_CLOSE_WAIT_SECONDS

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


class LocalProcess:
    """argv as a child of this process, in its own session; stderr kept by a thread."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None):
        try:
            self._proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=dict(env), cwd=cwd, start_new_session=True, bufsize=0)
        except OSError as exc:
            raise SandboxError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
        self._stdin, self._stdout = _piped(self._proc.stdin), _piped(self._proc.stdout)
        self._stderr = _piped(self._proc.stderr)
        self._tail = _Tail()
        self._closed = False
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True, name="guilds-stderr")
        self._stderr_reader.start()

    def _read_stderr(self) -> None:
        while chunk := self._stderr.read(_READ):
            self._tail.add(chunk)

    def send(self, data: bytes) -> None:
        try:
            self._stdin.write(data)
        except (OSError, ValueError) as exc:  # ValueError: written after close()
            raise ChannelClosed(f"the process is gone ({exc})") from exc

    def receive(self) -> bytes:
        try:
            return self._stdout.read(_READ) or b""
        except (OSError, ValueError):
            return b""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._proc.wait(CHANNEL_CLOSE_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._stderr_reader.join(CHANNEL_CLOSE_WAIT_SECONDS)
        for pipe in (self._stdout, self._stderr):
            with contextlib.suppress(OSError):
                pipe.close()

    def stderr_tail(self) -> str:
        return self._tail.lines()


def _piped(stream: IO[bytes] | None) -> IO[bytes]:
    """A pipe Popen was asked for (PIPE), so it is there."""
    if stream is None:
        raise SandboxError("the process was started without that pipe")
    return stream


class DockerProcess:
    """One exec with stdin attached: the engine's hijacked connection, read
    frame by frame (8-byte headers: stream, size), written as raw bytes."""

    def __init__(self, response: Any, split_frames: Callable[[bytes], tuple], stop: Callable[[], None]):
        """response: the exec start's streamed response; split_frames: the stream's
        deframer; stop: ends the exec's processes inside (called by close)."""
        self._response = response
        self._reader = response.raw._fp.fp
        self._sock = self._reader.raw._sock
        self._sock.settimeout(None)
        self._split, self._stop = split_frames, stop
        self._buf, self._tail = b"", _Tail()
        self._closed = False

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"the exec's connection is gone ({exc})") from exc

    def receive(self) -> bytes:
        while True:
            try:
                chunk = self._reader.read1(_READ)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                return b""
            frames, self._buf = self._split(self._buf + chunk)
            out = b"".join(payload for stream, payload in frames if stream == 1)
            for stream, payload in frames:
                if stream == 2:
                    self._tail.add(payload)
            if out:
                return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._response.close()
        self._stop()

    def stderr_tail(self) -> str:
        return self._tail.lines()


V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255


class KubeProcess:
    """One pods/exec websocket (``websocket.WebSocket``, connected with stdin)."""

    def __init__(self, ws: Any, stop: Callable[[], None] | None = None):
        """ws: connected with the subprotocols offered; stop: ends the exec's
        processes inside (called by close)."""
        self._ws = ws
        self._stop = stop
        self._tail = _Tail()
        self._lock = threading.Lock()
        self._closed = False
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
        from websocket import ABNF

        while True:
            try:
                opcode, frame = self._ws.recv_data_frame(True)
            except Exception:  # closed, reset, or closed by close(): the end either way
                return b""
            if opcode == ABNF.OPCODE_CLOSE:
                return b""
            data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
            if len(data) < 2:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDOUT:
                return payload
            if channel == STDERR:
                self._tail.add(payload)
            elif channel == STATUS:
                self.status += payload

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.protocol == V5:
            with contextlib.suppress(Exception), self._lock:
                self._ws.send_binary(bytes([CLOSE, STDIN]))
        with contextlib.suppress(Exception):  # not ws.close(): the reader thread reads its reply
            self._ws.send_close()
        with contextlib.suppress(Exception):
            self._ws.shutdown()
        if self._stop is not None:
            self._stop()

    def stderr_tail(self) -> str:
        return self._tail.lines()
