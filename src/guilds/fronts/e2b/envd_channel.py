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
import itertools
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ...limits import E2B_ENDED_KEPT
from ...sandbox.base import Sandbox
from ...sandbox.helpers import CODE_HELPER
from ...sandbox.process_channel import ChannelClosed, ProcessChannel
from .connect import ConnectError

log = logging.getLogger(__name__)


class EnvdFailed(ConnectError):
    """The in-sandbox service answered a request with an error."""


@dataclass
class Command:
    """One command the service started: its events as they come, for whoever is attached."""

    pid: int
    queues: set[asyncio.Queue] = field(default_factory=set)
    early: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None
    watchers: list[Any] = field(default_factory=list)

    attached: bool = False

    def attach(self) -> asyncio.Queue:
        """A queue of its events from now on (the first one also gets those before it: a
        command's first output may come before its start's reply); its end if it has ended."""
        queue: asyncio.Queue = asyncio.Queue()
        for event in self.early:
            queue.put_nowait(event)
        if self.end is not None and self.end not in self.early:
            queue.put_nowait(self.end)
        self.early, self.attached = [], True
        self.queues.add(queue)
        return queue

    def deliver(self, event: dict[str, Any]) -> None:
        for watch in self.watchers:
            watch(event)
        if not self.attached:
            self.early.append(event)
        for queue in self.queues:
            queue.put_nowait(event)


class EnvdChannel:
    def __init__(self, channel: ProcessChannel, loop: asyncio.AbstractEventLoop):
        self._channel, self._loop = channel, loop
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self.commands: dict[int, Command] = {}
        self.ended: OrderedDict[int, Command] = OrderedDict()
        self.closed = False
        self._send_lock = threading.Lock()
        threading.Thread(target=self._read, name="e2b-envd-reader", daemon=True).start()

    @classmethod
    async def open(cls, sandbox: Sandbox) -> EnvdChannel:
        await sandbox.start()
        argv = [sandbox.python, "-I", "-S", sandbox.helper_path(CODE_HELPER), "envd", sandbox.home]
        channel = await sandbox.open_process(argv)
        return cls(channel, asyncio.get_running_loop())

    def _read(self) -> None:
        """stdout's lines to the loop until it ends; then every waiting call fails (``_gone``).
        A line that is not the service's JSON (a sandbox's own noise) is logged and skipped."""
        pending = b""
        try:
            while True:
                try:
                    data = self._channel.receive()
                except ChannelClosed:
                    data = b""
                if not data:
                    break
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
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
        future = self._waiting.pop(message.get("id"), None)  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(message)

    def _event(self, event: dict[str, Any]) -> None:
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
            found = self.commands[pid] = Command(pid)
        return found

    def _gone(self) -> None:
        self.closed = True
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectError("unavailable", "the sandbox's process service ended"))
        self._waiting.clear()
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
            await asyncio.to_thread(self._send, line)
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

    async def close(self) -> None:
        """End the service: its commands' groups get SIGTERM, then SIGKILL."""
        await asyncio.to_thread(self._channel.close)
