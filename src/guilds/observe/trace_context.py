"""The W3C trace context a call came with, carried from its front to its span.

A front hands the context of a request to the call it makes, whatever its
transport: an MCP request's ``_meta`` (``traceparent``, ``tracestate``), an
HTTP request's headers of the same names (``http_carried`` for a whole app).
The toolbox's call span (``guilds.observe.traces``) takes it as its parent.

    with carried(carrier_of(meta) or carrier_of(headers)):
        await toolbox.call(...)

Standard library only, and nothing read or parsed beyond the two values: a
traceparent that is not W3C's is dropped by the propagator when a span reads it,
and nothing is carried when traces are off but a value or two in a context variable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
Carrier = Mapping[str, str]

_INCOMING: ContextVar[Carrier | None] = ContextVar("guilds_trace_incoming", default=None)


def carrier_of(source: Any) -> Carrier | None:
    """``traceparent`` and ``tracestate`` of a mapping (an MCP ``_meta``, HTTP headers), when
    it holds a traceparent string; else None."""
    if not isinstance(source, Mapping):
        return None
    parent = source.get(TRACEPARENT)
    if not isinstance(parent, str):
        return None
    state = source.get(TRACESTATE)
    return {TRACEPARENT: parent, TRACESTATE: state} if isinstance(state, str) else {TRACEPARENT: parent}


@contextlib.contextmanager
def carried(carrier: Carrier | None) -> Iterator[None]:
    """The calls made inside (and the tasks started inside) take ``carrier`` as their parent."""
    if carrier is None:
        yield
        return
    token = _INCOMING.set(carrier)
    try:
        yield
    finally:
        _INCOMING.reset(token)


def incoming() -> Carrier | None:
    """The context the current call came with (None: none was given)."""
    return _INCOMING.get()


Asgi = Callable[[dict, Callable, Callable], Awaitable[None]]


def http_carried(app: Asgi) -> Asgi:
    """An ASGI app around ``app``: an HTTP request's ``traceparent`` and ``tracestate``
    headers carried to the calls it makes (only served while traces are taken)."""
    async def carrying(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                   if name in (b"traceparent", b"tracestate")}
        with carried(carrier_of(headers)):
            await app(scope, receive, send)

    return carrying
