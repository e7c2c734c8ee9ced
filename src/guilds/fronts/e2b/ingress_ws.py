"""A WebSocket to a sandbox's port: the client's upgrade made again to the port over a relay, and
its messages passed both ways (the server's side speaks WebSocket through uvicorn and wsproto).

The upgrade goes in as the client sent it: its path and query, its Host the one the caller
names (the client's, or the sandbox's ``maskRequestHost``), its subprotocols, every other
header but the hop-by-hop ones, WebSocket's own (made again by this side) and
``TOKEN_HEADER``. The port's answer decides: 101 accepts the client, with the subprotocol
the port chose; any other answer is passed to the client as it is (status, headers, body up
to ``E2B_INGRESS_HEAD_BYTES``), where the server lets an upgrade be answered so, else the
client's socket is closed with 1011. Then text and binary messages go both ways whole, a
message from the port past ``E2B_INGRESS_WS_MESSAGE_BYTES`` closes both sides with 1009, the
port's pings are answered, a close from either side is passed to the other with its code,
and a port that ends without one closes the client's socket with 1011. A silence is no end:
a WebSocket may wait for ever, as E2B's proxy lets it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

from ...errors import SandboxError
from ...limits import E2B_INGRESS_HEAD_BYTES, E2B_INGRESS_IDLE_SECONDS, E2B_INGRESS_WS_MESSAGE_BYTES
from .ingress_http import TOKEN_HEADER, passed_headers
from .ingress_reach import PortClosed, PortLink

_NOT_PASSED = frozenset({"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host",
                         "proxy-connection", "proxy-authorization", "sec-websocket-key", "sec-websocket-version",
                         "sec-websocket-extensions", "sec-websocket-protocol", TOKEN_HEADER})
CLOSED_ABNORMALLY = 1011
TOO_BIG = 1009
POLICY = 1008


class UpgradeRefused(Exception):
    """The port did not accept the upgrade: its answer (status, headers, body)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes):
        super().__init__(f"the port answered {status}")
        self.status, self.headers, self.body = status, headers, body


def _upgrade(scope: dict, host: str) -> Request:
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    return Request(host=host, target=target.decode("latin-1"), extra_headers=passed_headers(scope, _NOT_PASSED),
                   subprotocols=list(scope.get("subprotocols") or ()))


def websocket_answers(scope: dict, send: Callable) -> Callable:
    """``send`` for a websocket scope, taking an HTTP answer (``http.response.*``) too: sent as
    the upgrade's answer where the server lets it (``websocket.http.response``), else a close
    with 1008 (policy) in its place."""
    as_http = "websocket.http.response" in scope.get("extensions", {})

    async def send_to_websocket(message: dict) -> None:
        kind = message["type"]
        if kind.startswith("http.response."):
            if not as_http:
                if kind == "http.response.start":
                    await send({"type": "websocket.close", "code": POLICY})
                return
            message = {**message, "type": "websocket." + kind}
        await send(message)

    return send_to_websocket


async def proxy(scope: dict, receive: Callable, send: Callable, link: PortLink, host: str) -> None:
    """The client's WebSocket (an ASGI websocket scope whose connect was received) passed to the
    port through link; send takes HTTP answers (``websocket_answers``). PortClosed when the port
    ends before it answered the upgrade (the caller answers)."""
    port = WSConnection(ConnectionType.CLIENT)
    try:
        accepted, first = await _handshake(port, link, _upgrade(scope, host))
    except UpgradeRefused as refused:
        await _pass_refusal(scope, send, refused)
        return
    await send({"type": "websocket.accept", "subprotocol": accepted.subprotocol})
    inward = asyncio.create_task(_client_to_port(receive, port, link))
    outward = asyncio.create_task(_port_to_client(send, port, link, first))
    try:
        await asyncio.wait({inward, outward}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (inward, outward):
            task.cancel()
        await link.close()
        for task in (inward, outward):
            with contextlib.suppress(asyncio.CancelledError, SandboxError, OSError):
                await task


async def _handshake(port: WSConnection, link: PortLink, request: Request) -> tuple[AcceptConnection, list[Event]]:
    """The upgrade written in and the port's answer read: its accept and the events read with
    it (its first messages may come in the same read), else UpgradeRefused."""
    await link.write(port.send(request))
    status, headers, body = 0, [], b""
    while True:
        events = await _events(port, link, E2B_INGRESS_IDLE_SECONDS)
        for at, event in enumerate(events):
            if isinstance(event, AcceptConnection):
                return event, events[at + 1:]
            if isinstance(event, RejectConnection):
                status, headers = event.status_code, list(event.headers)
                if not event.has_body:
                    raise UpgradeRefused(status, headers, b"")
            elif isinstance(event, RejectData):
                body = (body + event.data)[:E2B_INGRESS_HEAD_BYTES]
                if event.body_finished:
                    raise UpgradeRefused(status, headers, body)


async def _events(port: WSConnection, link: PortLink, idle: float | None) -> list[Event]:
    """The port's next events, reading as it needs; PortClosed once it ended."""
    async with asyncio.timeout(idle):
        data = await link.read()
    if not data:
        raise PortClosed("the port closed")
    port.receive_data(data)
    return list(port.events())


async def _pass_refusal(scope: dict, send: Callable, refused: UpgradeRefused) -> None:
    kept = [(k, v) for k, v in refused.headers if k.lower() not in (b"content-length", b"transfer-encoding",
                                                                    b"connection")]
    await send({"type": "http.response.start", "status": refused.status,
                "headers": [*kept, (b"content-length", str(len(refused.body)).encode())]})
    await send({"type": "http.response.body", "body": refused.body})


async def _client_to_port(receive: Callable, port: WSConnection, link: PortLink) -> None:
    """The client's messages written in; its close passed on (the end of this side)."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            with contextlib.suppress(SandboxError, OSError, LocalProtocolError):
                await link.write(port.send(CloseConnection(code=message.get("code") or 1000,
                                                           reason=message.get("reason") or "")))
            return
        if message.get("bytes") is not None:
            await link.write(port.send(Message(data=message["bytes"])))
        elif message.get("text") is not None:
            await link.write(port.send(Message(data=message["text"])))


async def _port_to_client(send: Callable, port: WSConnection, link: PortLink, first: list[Event]) -> None:
    """The port's messages (first: those read already) sent to the client whole; its pings
    answered; its close, its end or a message too big closes the client's socket."""
    parts: list[Any] = []
    size = 0
    events = first
    try:
        while True:
            for event in events:
                if isinstance(event, Ping):
                    await link.write(port.send(event.response()))
                elif isinstance(event, CloseConnection):
                    with contextlib.suppress(SandboxError, OSError, LocalProtocolError):
                        await link.write(port.send(event.response()))
                    await send({"type": "websocket.close", "code": event.code, "reason": event.reason or ""})
                    return
                elif isinstance(event, (TextMessage, BytesMessage)):
                    parts.append(event.data)
                    size += len(event.data)
                    if size > E2B_INGRESS_WS_MESSAGE_BYTES:
                        await link.write(port.send(CloseConnection(code=TOO_BIG)))
                        await send({"type": "websocket.close", "code": TOO_BIG})
                        return
                    if event.message_finished:
                        key = "text" if isinstance(event, TextMessage) else "bytes"
                        await send({"type": "websocket.send", key: type(event.data)().join(parts)})
                        parts, size = [], 0
            events = await _events(port, link, None)
    except (PortClosed, SandboxError, OSError):
        await send({"type": "websocket.close", "code": CLOSED_ABNORMALLY})
