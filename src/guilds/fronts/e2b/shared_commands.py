"""A shared sandbox's commands reached through any server (``guilds serve --e2b --e2b-shared``).

Each server's process service in a sandbox is its own (``envd_channel``): the commands
it starts are its children, and their output and input go through it. So a server
notes each command it starts in the record (``e2b_commands``: the sandbox, the pid,
the tag, the config, the server as its owner) and forgets it at its end; a request
naming a command (Connect, SendSignal, SendInput, CloseStdin, Update, by pid or tag)
that another server started is sent on, as it came, to that server, at the address it
advertises (``GUILDS_ADVERTISE_URL``, ``record.liveness``; its Host: ``host_for``), and
that server's answer, a stream too, comes back as it is read (``Forwarded``). ``List`` holds the commands
of every server on the record. A request sent on once is served where it arrives
(``FORWARDED_HEADER``); a server that no longer answers ran its commands to their end
with its process service: the command is ``not_found``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...errors import RecordError, SandboxError
from ...limits import E2B_FORWARD_CONNECT_SECONDS
from ...web.endpoint_lock import host_name
from .connect import ConnectError, error_response
from .envd_channel import Command
from .ingress_http import NotPassedOn, forward
from .ingress_reach import PortClosed

if TYPE_CHECKING:
    from ...record.store import Store

log = logging.getLogger(__name__)
FORWARDED_HEADER = b"x-guilds-forwarded"
"""Set on a request sent on to the server that runs its command: it is served there."""
SELECTING = frozenset({"process.Process/Connect", "process.Process/SendSignal", "process.Process/SendInput",
                       "process.Process/CloseStdin", "process.Process/Update"})
"""The requests that name one command (a ProcessSelector: pid or tag)."""


def process_info(row: dict[str, Any]) -> dict[str, Any]:
    """A ProcessInfo, as the process service lists its own, from a command's row."""
    return {"pid": row["pid"], "tag": row["tag"], "config": row["config"]}


def selects(row: dict[str, Any], selector: object) -> bool:
    """Whether a ProcessSelector ({pid} or {tag}) names the command of row."""
    if not isinstance(selector, dict):
        return False
    tag = selector.get("tag")
    return row["tag"] == tag if isinstance(tag, str) else row["pid"] == selector.get("pid")


class SharedCommands:
    """The record's rows of the shared sandboxes' commands, for one server (``store``'s owner)."""

    def __init__(self, store: Store):
        self.store = store
        self._ending: set[asyncio.Task] = set()

    @property
    def me(self) -> str:
        return self.store.owner.id

    @property
    def own_address(self) -> str | None:
        """Where this server says it answers (``GUILDS_ADVERTISE_URL``), if it says."""
        return self.store.owner.address

    async def started(self, box_id: str, command: Command, config: dict[str, Any], tag: str | None) -> None:
        """command (just started by this server's service) noted, and forgotten at its end."""
        command.watchers.append(self._on_end(box_id, command.pid))
        try:
            await self.store.e2b_command_started({"sandbox_id": box_id, "pid": command.pid, "tag": tag,
                                                  "config": config, "started_at": datetime.now(UTC)})
            if command.end is not None:  # it ended while its row was written
                await self.store.e2b_command_ended(box_id, command.pid)
        except RecordError as error:  # it runs all the same, reached through this server only
            log.warning("e2b: command %d of sandbox %s not noted in the record: %s", command.pid, box_id, error)

    def _on_end(self, box_id: str, pid: int) -> Callable[[dict[str, Any]], None]:
        def watch(event: dict[str, Any]) -> None:
            if event["ev"] == "end":
                task = asyncio.get_running_loop().create_task(self._forget(box_id, pid))
                self._ending.add(task)
                task.add_done_callback(self._ending.discard)
        return watch

    async def _forget(self, box_id: str, pid: int) -> None:
        try:
            await self.store.e2b_command_ended(box_id, pid)
        except RecordError as error:  # its row goes with the sandbox's end or this server's
            log.warning("e2b: the end of command %d of sandbox %s not noted in the record: %s", pid, box_id, error)

    async def elsewhere(self, headers: list[tuple[bytes, bytes]], box_id: str, message: dict[str, Any],
                        own: Container[int] = ()) -> str | None:
        """The address of the server that runs the command message names, when that is another
        server; None when this one serves the request (its own command: a pid among own, this
        server's service's, needs no read of the record; none known; a request sent on already)."""
        selector = message.get("process")
        if any(name.lower() == FORWARDED_HEADER for name, _ in headers) or \
                (isinstance(selector, dict) and selector.get("pid") in own):
            return None
        for row in await self._rows(box_id):
            if selects(row, selector):
                return row["address"] if row["owner"] != self.me and row["address"] else None
        return None

    async def others(self, box_id: str, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The ProcessInfo of the sandbox's commands that other servers run (listed: this one's)."""
        own = {entry.get("pid") for entry in listed}
        return [process_info(row) for row in await self._rows(box_id)
                if row["owner"] != self.me and row["pid"] not in own]

    async def _rows(self, box_id: str) -> list[dict[str, Any]]:
        """The sandbox's commands' rows; none when the record cannot be read (this server's own
        commands are served all the same)."""
        try:
            return await self.store.e2b_commands(box_id)
        except RecordError as error:
            log.warning("e2b: the commands of sandbox %s not read from the record: %s", box_id, error)
            return []


class _Link:
    """A connection to another server: what ``ingress_http.forward`` reads and writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        try:
            return await self.reader.read(65536)
        except OSError as exc:
            raise PortClosed(str(exc)) from None

    async def write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError as exc:
            raise SandboxError(f"the server running the command: {exc}") from None

    async def close(self) -> None:
        self.writer.close()


def host_for(given: str, own: str | None, address: str) -> str:
    """The Host a request sent on to the server at address carries: the client's (a name every
    replica accepts: the Service's, the E2B domain's), unless it names this server's own
    address, which only this server accepts: then the other's address (pure)."""
    if own is not None and host_name(given) == urlsplit(own).hostname:
        return urlsplit(address).netloc
    return given


class Forwarded(Response):
    """The request (its body read already) sent on to the server at address; its answer back.
    own: this server's own address (``host_for``)."""

    def __init__(self, address: str, body: bytes, own: str | None):  # not Response's: it makes a body
        self.address, self.body, self.own = address, body, own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        where = urlsplit(self.address)
        given = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"host"), "")
        host = host_for(given, self.own, self.address)
        try:
            async with asyncio.timeout(E2B_FORWARD_CONNECT_SECONDS):
                reader, writer = await asyncio.open_connection(where.hostname, where.port or 80)
        except (OSError, TimeoutError, ValueError):
            await error_response(ConnectError("not_found", "the command's server has ended, and the command "
                                              "with it"))(scope, receive, send)
            return
        link = _Link(reader, writer)
        sent_on = {**scope, "headers": [*scope["headers"], (FORWARDED_HEADER, b"1")]}
        try:
            await forward(sent_on, self._replayed(receive), send, link, host)
        except (PortClosed, NotPassedOn) as exc:
            await error_response(ConnectError("unavailable", f"the command's server did not answer: "
                                              f"{exc}"))(scope, receive, send)
        finally:
            await link.close()

    def _replayed(self, receive: Receive) -> Receive:
        """The body again, then the client's own messages (its disconnect)."""
        given = False

        async def again() -> dict[str, Any]:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            return dict(await receive())
        return again
