"""A command's stream dropped as E2B drops it when its sandbox is killed: the connection reset.

E2B's SDKs tell a sandbox killed under a stream by the stream's connection failing at the
transport level (a reset), after which they ask ``/health`` (502: gone) and raise their
"the sandbox was killed or reached its end of life" error. A stream merely left
unfinished (the connection closed in order) reads as a protocol error, not a transport
failure, to some of them. So the E2B front keeps each request's connection
(``connection_of``: the server's transport, when the server is uvicorn's) under
``TRANSPORT`` in its scope, and ``reset`` aborts it with a reset (SO_LINGER 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

TRANSPORT = "guilds.e2b.transport"
"""The scope key of the request's connection (an asyncio transport, or None)."""


def connection_of(send: Callable) -> asyncio.BaseTransport | None:
    """The connection the server's ``send`` writes to (uvicorn's request cycle keeps it), or None."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    return transport if isinstance(transport, asyncio.BaseTransport) else None


def reset(scope: Mapping[str, Any]) -> None:
    """The request's connection aborted with a reset; nothing when it is not known (the
    response is then left unfinished, and the server closes the connection)."""
    transport = scope.get(TRANSPORT)
    if not isinstance(transport, asyncio.Transport):
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
