"""The host's side of one sandbox's ``guilds-code envd`` (``guilds_code.envd``).

``EnvdChannel.open(sandbox)`` starts the service with ``Sandbox.open_process``;
``call(op, **fields)`` sends one request and waits for its reply (``EnvdFailed``
with the Connect code on an error reply); each command's events go to its
``Command``: the queues of the streams attached to it, and its end.
A reader thread turns stdout's lines into events on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from guilds_code.limits import ENVD_SLEEP_IDLE_SECONDS

from ...limits import E2B_ACK_BYTES, E2B_ENDED_KEPT, E2B_ENVD_LINE_BYTES
from ...sandbox.base import Sandbox
from ...sandbox.helpers import CODE_HELPER
from ...sandbox.process_channel import ChannelClosed, PipedProcess, ProcessChannel
from .connect import ConnectError

log = logging.getLogger(__name__)


class EnvdFailed(ConnectError):
    """The in-sandbox service answered a request with an error."""


@dataclass
class Command:
    """One command the service started: its events as they come, for whoever is attached.

    Its output is acked to the service (``ack``) once taken: sent on by every stream
    it went to, or at once when none holds it. What a stream has not sent on yet
    (a client that does not read) is never acked, so the service holds the command's
    output back past its window: a stream's queue holds at most that window."""

    pid: int
    ack: Callable[[int], None] = field(default=lambda size: None, repr=False)
    queues: set[asyncio.Queue] = field(default_factory=set)
    early: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    watchers: list[Any] = field(default_factory=list)
    attached: bool = False
    taken: int = 0
    """Bytes of output taken and not yet acked (less than E2B_ACK_BYTES)."""

    def attach(self) -> asyncio.Queue:
        """A queue of its events from now on (the first one also gets those before it: a
        command's first output may come before its start's reply); its end if it has ended."""
        queue: asyncio.Queue = asyncio.Queue()
        for event in self.early:  # the early list's hold on them passes to this queue
            queue.put_nowait(event)
        if self.end is not None and self.end not in self.early:
            queue.put_nowait(self.end)
        self.early, self.attached = [], True
        self.queues.add(queue)
        return queue

    def detach(self, queue: asyncio.Queue) -> None:
        """A stream is gone: what its queue still held is taken."""
        self.queues.discard(queue)
        while not queue.empty():
            self.took(queue.get_nowait())

    def deliver(self, event: dict[str, Any]) -> None:
        for watch in self.watchers:
            watch(event)
        holders = len(self.queues)
        if not self.attached and self.end is None:
            self.early.append(event)
            holders += 1
        for queue in self.queues:
            queue.put_nowait(event)
        if event["ev"] == "data":
            event["holders"] = holders
            if not holders:
                self._taken(len(event["data"]))

    def took(self, event: dict[str, Any]) -> None:
        """One holder (a stream) is done with event."""
        if event["ev"] == "data":
            event["holders"] -= 1
            if not event["holders"]:
                self._taken(len(event["data"]))

    def _taken(self, size: int) -> None:
        self.taken += size
        if self.taken >= E2B_ACK_BYTES:
            self.ack(self.taken)
            self.taken = 0


class Lines:
    """Whole lines out of a byte stream, none held past E2B_ENVD_LINE_BYTES: a longer one (never
    the service's own: a command writing into its stdout) is dropped up to its newline, and logged."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.skipping = False

    def feed(self, data: bytes) -> list[bytes]:
        """The lines data completes."""
        if self.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return []
            data, self.skipping = data[newline + 1:], False
        if b"\n" not in data:
            self.pending += data
            self._bound()
            return []
        *lines, rest = data.split(b"\n")
        lines[0] = bytes(self.pending) + lines[0]
        self.pending = bytearray(rest)
        self._bound()
        return lines

    def _bound(self) -> None:
        if len(self.pending) > E2B_ENVD_LINE_BYTES:
            log.warning("e2b: the sandbox's process service wrote a line over %d bytes: dropped",
                        E2B_ENVD_LINE_BYTES)
            self.pending, self.skipping = bytearray(), True


class EnvdChannel:
    def __init__(self, channel: ProcessChannel, loop: asyncio.AbstractEventLoop):
        self._channel, self._loop = channel, loop
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self.commands: dict[int, Command] = {}
        self.ended: OrderedDict[int, Command] = OrderedDict()
        self.closed = False
        self.answered = False
        """Set at its first reply: its process has started (its limits and cgroups joined)."""
        self.ending = False
        """Set when its sandbox is killed or paused: its commands' streams are dropped, not ended."""
        self._send_lock = threading.Lock()
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="e2b-envd-send")
        """Requests' lines are written by one thread, in the order they were made: chunks of a
        file in flight at once (``files_api``) reach the service in their order."""
        self._notifying: set[asyncio.Task] = set()
        self.watches: dict[str, asyncio.Event] = {}
        """The streamed folder watchers by id: each set when the service says events wait (``watch_api``)."""
        threading.Thread(target=self._read, name="e2b-envd-reader", daemon=True).start()

    @classmethod
    async def open(cls, sandbox: Sandbox, sleep_idle: int = ENVD_SLEEP_IDLE_SECONDS) -> EnvdChannel:
        """The service started in the sandbox (started already: ``Sandbox.start``); idle
        sleep_idle seconds it sleeps (0: never; ``guilds_code.envd``)."""
        argv = [sandbox.python, "-I", "-S", sandbox.helper_path(CODE_HELPER), "envd", sandbox.home,
                "--sleep-idle", str(sleep_idle)]
        channel = await sandbox.open_process(argv)
        return cls(channel, asyncio.get_running_loop())

    def _read(self) -> None:
        """stdout's lines to the loop until it ends; then every waiting call fails (``_gone``).
        A line that is not the service's JSON (a sandbox's own noise) is logged and skipped."""
        lines = Lines()
        try:
            while True:
                try:
                    data = self._channel.receive()
                except ChannelClosed:
                    data = b""
                if not data:
                    break
                for line in lines.feed(data):
                    self._post(line)
        finally:
            self._loop.call_soon_threadsafe(self._gone)

    def _post(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict):
            self._loop.call_soon_threadsafe(self._dispatch, message)
        elif line.strip():
            log.warning("e2b: the sandbox's process service wrote a line that is not its own: %.200r", line)

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "ev" in message:
            self._event(message)
            return
        self.answered = True
        future = self._waiting.pop(message.get("id"), None)  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(message)

    def _event(self, event: dict[str, Any]) -> None:
        if event["ev"] == "watch":
            ready = self.watches.get(event.get("watcher"))  # type: ignore[arg-type]
            if ready is not None:
                ready.set()
            return
        pid = event.get("pid")
        if not isinstance(pid, int):
            return
        command = self.command(pid)
        if event["ev"] == "data":
            event["data"] = base64.b64decode(event.pop("b64"))
        command.deliver(event)
        if event["ev"] == "end":
            command.end = event
            self.commands.pop(pid, None)
            self.ended[pid] = command
            while len(self.ended) > E2B_ENDED_KEPT:
                self.ended.popitem(last=False)

    def command(self, pid: int) -> Command:
        """The command of pid, made on its first event (its data may come before the start's reply)."""
        found = self.commands.get(pid) or self.ended.get(pid)
        if found is None:
            found = self.commands[pid] = Command(pid, ack=lambda size: self.notify("ack", pid=pid, bytes=size))
        return found

    def notify(self, op: str, **fields: Any) -> None:
        """Send a request whose reply nobody waits for (``ack``), in the background."""
        if self.closed:
            return
        line = (json.dumps({"id": None, "op": op, **fields}, separators=(",", ":")) + "\n").encode()
        task = self._loop.create_task(asyncio.to_thread(self._send_quietly, line))
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    def _send_quietly(self, line: bytes) -> None:
        with contextlib.suppress(ChannelClosed):
            self._send(line)

    def _gone(self) -> None:
        self.closed = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectError("unavailable", "the sandbox's process service ended"))
        self._waiting.clear()
        for ready in self.watches.values():
            ready.set()
        for command in list(self.commands.values()):
            self._event({"ev": "end", "pid": command.pid, "exit_code": -1, "signal": 9, "timed_out": False,
                         "error": "the sandbox ended"})

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        if self.closed:
            raise ConnectError("unavailable", "the sandbox's process service has ended")
        ident = next(self._ids)
        future = self._loop.create_future()
        self._waiting[ident] = future
        line = (json.dumps({"id": ident, "op": op, **fields}, separators=(",", ":")) + "\n").encode()
        try:
            await self._loop.run_in_executor(self._sender, self._send, line)
        except ChannelClosed:
            self._waiting.pop(ident, None)
            raise ConnectError("unavailable", "the sandbox's process service has ended") from None
        reply = await future
        if "error" in reply:
            raise EnvdFailed(reply["error"].get("code", "unknown"), reply["error"].get("message", ""))
        return reply["ok"]

    def _send(self, line: bytes) -> None:
        with self._send_lock:
            self._channel.send(line)

    def host_pid(self) -> int | None:
        """The service's process id on this machine while it runs; None where its process is
        not this machine's (a container's, reached through its engine)."""
        if self.closed or not isinstance(self._channel, PipedProcess):
            return None
        return self._channel.pid

    async def close(self) -> None:
        """End the service: its commands' groups get SIGTERM, then SIGKILL."""
        await asyncio.to_thread(self._channel.close)
        self._sender.shutdown(wait=False)
