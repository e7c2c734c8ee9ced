"""The orchestrator's end of the resident helper: one ``guilds-code serve`` per
agent, opened with ``Sandbox.open_process``, its frames (``guilds_code.frames``)
shared by all of the agent's calls.

- ``ResidentChannel.open(sandbox, argv)`` starts the server and waits up to
  CHANNEL_HELLO_SECONDS for its hello; a server of another protocol version is
  refused (ChannelDied naming both versions) and closed.
- With ``keepalive`` (kubernetes, whose exec stream's end may not reach the server), a
  thread sends ``frames.KEEPALIVE`` that often while the channel lives; the server,
  started with ``--orphan-exit``, ends when they stop coming.
- ``call(request, wait)`` sends one request frame and waits for its answer:
  the decoded envelope. Past ``wait`` seconds a cancel frame is sent and the
  call fails with HelperFailed "no answer within N s"; a call cancelled by its
  caller sends a cancel frame too and waits (at most CHANNEL_CANCEL_WAIT_SECONDS) for
  the server to answer it before the cancellation goes on. A request whose
  JSON passes REQUEST_FILE_MAX is refused before anything is sent.
- A server that answers neither a call within its wait nor the cancel after
  it is taken for hung: the channel is marked dead and closed, so the next
  call opens a new one rather than wait on it too.
- The event loop that opened the channel reads the answers of a local
  process (local, bwrap) or a docker exec's stream itself, and settles a call
  of its own at once: no thread between the server's write and the call.
  Any other process (kubernetes, docker over TLS) is read by a reader thread,
  which hands each answer to its call's event loop; so is a loop-read one once
  a call comes from another loop while the opening loop is not running. An answer is handed over once, to the call still
  waiting for it.
- When the server's stdout ends (killed, the sandbox stopped, the container
  restarted), every call in flight fails with ChannelDied, and so does every
  later call: the owner opens a new channel. So it is when a line of it passes
  CHANNEL_LINE_MAX_BYTES without a newline (``read_lines``: something else
  writes into the server's stdout); the server is closed first.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
from typing import Any, Callable, TypeAlias

from guilds_code import frames, limits
from guilds_code.protocol import decode_envelope

from ..errors import HelperFailed
from ..limits import CHANNEL_CANCEL_WAIT_SECONDS, CHANNEL_HELLO_SECONDS
from ..sandbox.base import Sandbox
from ..sandbox.docker.docker_fifos import FifoProcess
from ..sandbox.process_channel import (
    ChannelClosed,
    DirectProcess,
    DockerProcess,
    Lines,
    LineTooLong,
    LoopReadable,
    PipedProcess,
    ProcessChannel,
    read_lines,
)

DIRECT_SEND_BYTES = 16 * 1024
"""On a channel read by a thread, a frame up to this size is written from the
event loop (a pipe takes it at once); a larger one from a worker thread, so a
slow reader cannot stall the loop. On one read by its loop, a frame is written
from the loop only when the pipe or socket takes it at once (``send_nowait``), else
from a worker thread (the rest of a frame a socket took part of, too): the loop,
blocked on a write the server would take only once its own answers were read,
would never read them."""


Answer: TypeAlias = "asyncio.Future[dict[str, Any]]"
"""A call's decoded envelope, set by the reader thread (through the call's event loop)."""


class ChannelDied(HelperFailed):
    """The resident helper ended (or never started) while a call needed it."""


class ResidentChannel:
    """One server's frames, multiplexed (see the module docstring)."""

    def __init__(self, process: ProcessChannel, loop: asyncio.AbstractEventLoop | None = None):
        """loop: the event loop to read a loop-readable process's answers in (``loop_readable``);
        else a reader thread reads them."""
        self._process = process
        self._ids = itertools.count(1)
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, Answer]] = {}
        self._lock = threading.Lock()
        """Guards the calls waiting for answers (the reader thread takes it too)."""
        self._send_lock = threading.Lock()
        """One frame written at a time; never held with ``_lock``: a write that waits for
        the server to read must not keep the reader from taking its answers."""
        self._hello: dict[str, Any] | None = None
        self._hello_seen = threading.Event()
        self._ended_event = threading.Event()
        """Set once the channel is dead: the keepalive's thread ends."""
        self.dead: str | None = None
        """Why the channel can no longer be used; None while it can."""
        self._lines = Lines()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop reading the answers (from ``_fd``); None: the reader thread reads them."""
        self._fd: int | None = None
        self._direct = loop_readable(process)
        if loop is not None and self._direct is not None:
            self._loop, self._fd = loop, self._direct.reader_fd()
            loop.add_reader(self._fd, self._readable)
            loop.call_soon(self._readable)  # what was read with the headers, before any readiness
        else:
            self._start_thread()

    @classmethod
    async def open(cls, sandbox: Sandbox, argv: list[str], *, keepalive: float | None = None) -> ResidentChannel:
        """keepalive: seconds between keepalives (``frames.KEEPALIVE``, for a server started with
        ``--orphan-exit``), sent by a thread of the channel's until it dies; None: none."""
        channel = cls(await sandbox.open_process(argv), asyncio.get_running_loop())
        try:
            seen = await asyncio.to_thread(channel._hello_seen.wait, CHANNEL_HELLO_SECONDS)
        except BaseException:  # cancelled while it started: it must not be left running
            threading.Thread(target=channel.abandon, daemon=True).start()
            raise
        if channel.dead or not seen:
            reason = channel.dead or f"no hello within {CHANNEL_HELLO_SECONDS:g} s"
            await channel.close()
            raise ChannelDied(f"the resident helper did not start: {reason}")
        if keepalive is not None:
            threading.Thread(target=channel._keep_alive, args=(keepalive,), daemon=True,
                             name="guilds-resident-keepalive").start()
        return channel

    def _keep_alive(self, every: float) -> None:
        """A keepalive every ``every`` seconds, between frames (the send lock), until the channel dies."""
        while not self._ended_event.wait(every):
            try:
                self._send_locked(frames.KEEPALIVE)
            except (ChannelClosed, OSError):
                return

    @property
    def pid(self) -> int | None:
        """The server's pid as the sandbox sees it (from its hello)."""
        return (self._hello or {}).get("pid")

    @property
    def max_in_flight(self) -> int:
        return int((self._hello or {}).get("max_in_flight", frames.MAX_IN_FLIGHT_DEFAULT))

    async def call(self, request: dict[str, Any], wait: float) -> dict[str, Any]:
        """Run one request on the server; its decoded envelope (see the module docstring)."""
        body = json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogateescape")
        if len(body) > limits.REQUEST_FILE_MAX:
            raise HelperFailed(f"request: larger than {limits.REQUEST_FILE_MAX} bytes; not sent")
        frame_id = f"q{next(self._ids)}"
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop and not self._loop.is_running():
            self._read_from_thread()  # the loop that reads has stopped: it would read nothing
        future: Answer = loop.create_future()
        with self._lock:
            if self.dead:
                raise ChannelDied(self.dead)
            self._pending[frame_id] = (loop, future)
        try:
            await self._send(frames.request_frame(frame_id, body))
            return await self._answer(frame_id, future, wait)
        finally:
            with self._lock:
                self._pending.pop(frame_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: a failure already raised is not logged again

    async def _answer(self, frame_id: str, future: Answer, wait: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(wait):  # no task and no waiter of wait_for's: the answer wakes the call at once
                return await asyncio.shield(future)
        except TimeoutError:
            if not await self._cancel(frame_id, future):  # no answer to the cancel either: hung
                self._die(f"the resident helper did not answer within {wait:g} s, nor a cancel "
                          f"within {CHANNEL_CANCEL_WAIT_SECONDS:g} s")
                threading.Thread(target=self._process.close, daemon=True).start()
            raise HelperFailed(f"code helper failed: no answer within {wait:g} s") from None
        except asyncio.CancelledError:
            await self._cancel(frame_id, future)
            raise

    async def _cancel(self, frame_id: str, future: Answer) -> bool:
        """A cancel frame, then the server's answer to it (or CHANNEL_CANCEL_WAIT_SECONDS); True once answered."""
        try:
            await asyncio.shield(self._send(frames.cancel_frame(frame_id)))
            await asyncio.wait({asyncio.shield(future)}, timeout=CHANNEL_CANCEL_WAIT_SECONDS)
        except (ChannelDied, asyncio.CancelledError):
            return True
        return future.done()

    async def _send(self, data: bytes) -> None:
        try:
            if self._loop is not None:  # a loop reads the answers: none may wait here on the server
                if not self._send_now(data):
                    await asyncio.to_thread(self._send_locked, data)
            elif len(data) <= DIRECT_SEND_BYTES:
                with self._send_lock:
                    self._process.send(data)
            else:
                await asyncio.to_thread(self._send_locked, data)
        except ChannelClosed as exc:
            self._die(f"the resident helper is gone ({exc})")
            raise ChannelDied(self.dead or str(exc)) from exc

    def _send_now(self, data: bytes) -> bool:
        """data written at once (a small frame, the pipe or socket with room, no other
        frame being written); False, nothing written, otherwise. The rest of a frame
        the socket took only part of is written from a thread, the lock held till then."""
        if self._direct is None or not self._send_lock.acquire(blocking=False):
            return False
        try:
            sent = self._direct.send_nowait(data)
        except BaseException:
            self._send_lock.release()
            raise
        if 0 < sent < len(data):
            threading.Thread(target=self._send_rest, args=(data[sent:],), daemon=True,
                             name="guilds-resident-send").start()
            return True
        self._send_lock.release()
        return sent == len(data)

    def _send_rest(self, rest: bytes) -> None:
        """The rest of a frame, under the send lock its writer took (released here)."""
        try:
            self._process.send(rest)
        except ChannelClosed as exc:
            self._die(f"the resident helper is gone ({exc})")
        finally:
            self._send_lock.release()

    def _send_locked(self, data: bytes) -> None:
        with self._send_lock:
            self._process.send(data)

    async def close(self) -> None:
        """End the server (its running requests are cancelled) and the reader."""
        if self._loop is asyncio.get_running_loop():
            self._stop_reading()
        await asyncio.to_thread(self.abandon)

    def abandon(self) -> None:
        """close(), blocking: for a thread (idempotent)."""
        self._die("the resident helper was closed")
        self._process.close()
        if self._loop is not None and self._loop.is_closed():
            self._stop_reading()  # its loop is gone: no end of the stream will be read there

    # --- the reading loop ---------------------------------------------------
    def _readable(self) -> None:
        """The loop's reader: what the server wrote, line by line (see read_lines)."""
        if self._fd is None or self._direct is None:
            return
        chunk = self._direct.receive_nowait()
        if chunk is None:
            return
        if not chunk:
            self._stop_reading()
            self._direct.stdout_ended()
            threading.Thread(target=self._ended, daemon=True, name="guilds-resident-end").start()
            return
        try:
            for line in self._lines.feed(chunk):
                self._on_line(line)
        except LineTooLong as exc:
            self._stop_reading()
            self._die(f"the resident helper's channel: {exc}")
            threading.Thread(target=self._process.close, daemon=True, name="guilds-resident-close").start()

    def _stop_reading(self) -> None:
        """No more reads in the loop (from its thread, or with it stopped); the descriptor closed."""
        fd, self._fd = self._fd, None
        if fd is None or self._loop is None:
            return
        self._loop.remove_reader(fd)  # nothing (False) once the loop is closed
        os.set_blocking(fd, True)  # the flag is the pipe's, shared with the process's own descriptor
        os.close(fd)

    def _read_from_thread(self) -> None:
        self._stop_reading()
        self._loop = None
        self._start_thread()

    # --- the reader thread --------------------------------------------------
    def _start_thread(self) -> None:
        threading.Thread(target=self._read, daemon=True, name="guilds-resident").start()

    def _read(self) -> None:
        try:
            for line in read_lines(self._process, lines=self._lines):
                self._on_line(line)
        except LineTooLong as exc:
            self._die(f"the resident helper's channel: {exc}")
            return
        self._ended()

    def _ended(self) -> None:
        """The server's stdout ended: the channel is dead, saying what its stderr said last."""
        tail = self._process.stderr_tail()
        self._die("the resident helper ended" + (f": {tail}" if tail else ""))

    def _on_line(self, line: bytes) -> None:
        try:
            frame = json.loads(line)
        except ValueError:
            self._die(_not_a_frame(line, hello_seen=self._hello is not None))
            return
        if self._hello is None:
            self._on_hello(frame)
            return
        frame_id = frame.get("id") if isinstance(frame, dict) else None
        with self._lock:
            entry = self._pending.pop(frame_id, None) if isinstance(frame_id, str) else None
        if entry is None:
            return
        loop, future = entry
        if loop is self._loop:  # read in the call's own loop: settled now
            _settle(future, frame.get("envelope"))
        else:
            _hand_over(loop, _settle, future, frame.get("envelope"))

    def _on_hello(self, frame: Any) -> None:
        version = frame.get("v") if isinstance(frame, dict) else None
        if not isinstance(frame, dict) or frame.get("hello") != frames.HELLO:
            self._die("the resident helper did not say hello")
        elif version != frames.VERSION:
            self._die(f"the resident helper speaks protocol {version}; this orchestrator "
                      f"speaks {frames.VERSION}")
        else:
            self._hello = frame
        self._hello_seen.set()

    def _die(self, reason: str) -> None:
        """Mark the channel dead; fail every call in flight with ChannelDied(reason)."""
        with self._lock:
            if self.dead is None:
                self.dead = reason
            pending, self._pending = self._pending, {}
        self._hello_seen.set()
        self._ended_event.set()
        for loop, future in pending.values():
            _hand_over(loop, _fail, future, ChannelDied(reason))


def loop_readable(process: ProcessChannel) -> LoopReadable | None:
    """process, when an event loop can read it (see the module docstring)."""
    if isinstance(process, PipedProcess):  # local, or bwrap's (entered or forked)
        return process
    if isinstance(process, (DockerProcess, DirectProcess, FifoProcess)) and process.loop_readable:
        return process
    return None


def _hand_over(loop: asyncio.AbstractEventLoop, settle: Callable[[Answer, Any], None],
               future: Answer, value: Any) -> None:
    """settle(future, value) in loop's thread; nothing when that loop has closed (its call is gone)."""
    try:
        loop.call_soon_threadsafe(settle, future, value)
    except RuntimeError:
        pass


def _not_a_frame(line: bytes, *, hello_seen: bool) -> str:
    """Why a line that is not a frame ends the channel: first of all, an older
    helper without the resident mode answers ``serve`` with a one-shot envelope."""
    if not hello_seen:
        try:
            envelope = decode_envelope(line)
        except ValueError:
            pass
        else:
            said = envelope.get("error") or "an answer"
            return f"the helper in the sandbox has no resident mode (it answered as a one-shot helper: {said})"
    return f"the resident helper wrote something not a frame: {line[:80]!r}"


def _settle(future: Answer, envelope: Any) -> None:
    if future.done():
        return
    try:
        future.set_result(decode_envelope(envelope.encode("ascii")))
    except (ValueError, AttributeError, UnicodeEncodeError):
        future.set_exception(HelperFailed("code helper failed: the resident helper's answer "
                                          "is not an envelope"))


def _fail(future: Answer, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
