"""Whether the process behind a record owner still runs, asked of the process itself.

    await probe(address, owner_id) -> ALIVE | GONE | UNKNOWN

A server says where it answers (``Store.advertise``: its own URL, such as a
replica's pod address); ``GET <address>/healthz?owner=<id>`` is answered 200 by
the process that is that owner and 404 by any other (``guilds.web.health``).
So a refused connection (nothing listens there: the process ended, its
container is starting again) or a 404 (a process started since at the same
address) is GONE at once, a 200 ALIVE, and no answer within
limits.OWNER_PROBE_SECONDS (no route: the pod is gone; an overloaded server)
UNKNOWN, for the heartbeat to decide (``owners.is_gone_now``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from urllib.parse import quote, urlsplit

from ..limits import OWNER_PROBE_SECONDS


class Said(enum.Enum):
    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"


ALIVE, GONE, UNKNOWN = Said.ALIVE, Said.GONE, Said.UNKNOWN
PROBE_PATH = "/healthz"
OWNER_QUERY = "owner"


async def probe(address: str, owner_id: str, timeout: float = OWNER_PROBE_SECONDS) -> Said:
    """Ask the server at address (``http://host:port``) whether it is owner_id."""
    where = urlsplit(address)
    if where.scheme != "http" or not where.hostname:
        return UNKNOWN
    try:
        async with asyncio.timeout(timeout):
            return await _ask(where.hostname, where.port or 80, owner_id)
    except ConnectionRefusedError:
        return GONE
    except (OSError, TimeoutError, ValueError):
        return UNKNOWN


async def _ask(host: str, port: int, owner_id: str) -> Said:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        name = f"[{host}]" if ":" in host else host
        writer.write(f"GET {PROBE_PATH}?{OWNER_QUERY}={quote(owner_id)} HTTP/1.1\r\nHost: {name}:{port}\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        status = (await reader.readline()).split()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    code = status[1] if len(status) > 1 else b""
    return ALIVE if code == b"200" else GONE if code == b"404" else UNKNOWN
