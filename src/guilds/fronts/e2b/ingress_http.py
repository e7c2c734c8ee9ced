"""A request to a sandbox's port written in, and its answer read back, over a relay (HTTP/1.1).

The request goes in as HTTP/1.1 with ``Connection: close``: its method, path and query
as sent, its body streamed (chunked when the client gave no length), its Host the one
the caller names (the client's, or the sandbox's ``maskRequestHost``), every other
header but the hop-by-hop ones and ``TOKEN_HEADER``, each name in Go's canonical form
(``User-Agent``), as E2B's proxy writes them. The answer comes back as it is
read: its status and headers (less the hop-by-hop ones; the server frames the body
again), then its body, each piece as it arrives. An answer head past
``E2B_INGRESS_HEAD_BYTES``, a silence past ``E2B_INGRESS_IDLE_SECONDS``, or an end before
a whole answer: PortClosed before the answer began, a reset after. A client gone ends
the relay. A WebSocket upgrade comes as a websocket scope, to ``ingress_ws``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import h11

from ...errors import SandboxError
from ...limits import E2B_INGRESS_HEAD_BYTES, E2B_INGRESS_IDLE_SECONDS
from .dropped import reset
from .ingress_reach import PortClosed

TOKEN_HEADER = "e2b-traffic-access-token"  # noqa: S105 (a header's name)
"""The header of a private sandbox's traffic token: never passed in."""


class Link(Protocol):
    """Bytes each way to what answers (a port's relay, ``ingress_reach.PortLink``; another server)."""

    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


class NotPassedOn(Exception):
    """The request cannot be written as HTTP/1.1 (the caller answers 400)."""


_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "proxy-connection", "host", TOKEN_HEADER})


def canonical(name: bytes) -> bytes:
    """A header name as E2B's proxy writes it (Go's canonical form): ``user-agent`` -> ``User-Agent``.
    The server's HTTP stack hands names over in lower case; a program in the sandbox that
    compares them as written sees them as E2B sends them."""
    return b"-".join(part[:1].upper() + part[1:].lower() for part in name.split(b"-"))


def passed_headers(scope: dict, dropped: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """The client's headers but the dropped names, each name in its canonical form."""
    return [(canonical(k), v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in dropped]


def _request_head(scope: dict, host: str) -> h11.Request:
    path = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        path += b"?" + scope["query_string"]
    headers = passed_headers(scope, _HOP_BY_HOP)
    names = {k.lower() for k, _ in scope["headers"]}
    if b"transfer-encoding" in names and b"content-length" not in names:  # a body of no length given
        headers.append((b"Transfer-Encoding", b"chunked"))
    return h11.Request(method=scope["method"], target=path,
                       headers=[(b"Host", host.encode("latin-1")), *headers, (b"Connection", b"close")])


async def forward(scope: dict, receive: Callable, send: Callable, link: Link, host: str) -> None:
    """The request written in through link (its Host: host), body streamed; then its answer
    streamed back. A port that stops reading the request (it answered early, or closed) ends
    the writing, and its answer is read. PortClosed when the answer fails before it began,
    NotPassedOn when the request cannot be written (the caller answers); an answer cut short
    after it began resets the client's connection."""
    client = h11.Connection(h11.CLIENT, max_incomplete_event_size=E2B_INGRESS_HEAD_BYTES)
    try:
        if not await _send_request(scope, receive, client, link, host):
            return  # the client went before its request's end
    except SandboxError:
        pass  # the relay ended: whatever the port answered is read below
    except h11.LocalProtocolError as exc:  # what the server took, HTTP/1.1 cannot say again
        raise NotPassedOn(str(exc)) from None
    watch = asyncio.create_task(_close_when_gone(receive, link))
    started = False
    try:
        async for message in _answer_back(client, link):
            started = True
            await send(message)
    except (h11.RemoteProtocolError, PortClosed, TimeoutError) as exc:
        if not started:
            raise PortClosed(f"no answer from the port: {exc}") from None
        reset(scope)
    finally:
        watch.cancel()


async def _send_request(scope: dict, receive: Callable, client: h11.Connection, link: Link, host: str) -> bool:
    """The request's head and body written in as they come; False when the client went first."""
    await link.write(client.send(_request_head(scope, host)))
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if message.get("body"):
            await link.write(client.send(h11.Data(data=message["body"])))
        if not message.get("more_body"):
            break
    await link.write(client.send(h11.EndOfMessage()))
    return True


async def _close_when_gone(receive: Callable, link: Link) -> None:
    """The link closed once the client is gone (its answer's reading then ends)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    await link.close()


async def _answer_back(client: h11.Connection, link: Link) -> AsyncIterator[dict[str, Any]]:
    """The port's answer as ASGI messages, as it is read."""
    while True:
        event = await _next_event(client, link)
        if isinstance(event, h11.Response):
            yield {"type": "http.response.start", "status": event.status_code,
                   "headers": [(k, v) for k, v in event.headers if k.decode("latin-1").lower() not in _HOP_BY_HOP]}
        elif isinstance(event, h11.Data):
            yield {"type": "http.response.body", "body": bytes(event.data), "more_body": True}
        else:  # its end (EndOfMessage; ConnectionClosed only before a response, which h11 refuses first)
            yield {"type": "http.response.body", "body": b"", "more_body": False}
            return


async def _next_event(client: h11.Connection, link: Link) -> Any:
    """The next event of the answer (h11's), reading from link as it needs (its end: h11's
    ConnectionClosed, or RemoteProtocolError when the answer was cut short)."""
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            async with asyncio.timeout(E2B_INGRESS_IDLE_SECONDS):
                client.receive_data(await link.read())
        elif not isinstance(event, h11.InformationalResponse):
            return event
