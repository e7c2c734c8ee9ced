"""A raw tunnel's way down without a stream in between: what the host sends is written
to the client as it arrives (an asyncio protocol on the host's connection), the host
read no faster than the client takes it (``EGRESS_WRITE_BUFFER_BYTES`` held at most).
The way up is a loop over the client's stream. Measured in bench/egress_bench.py:
a stream on both sides cost a third of a download's rate on a loaded machine."""

from __future__ import annotations

import asyncio
import contextlib

from ..limits import EGRESS_PIPE_CHUNK, EGRESS_WRITE_BUFFER_BYTES
from .framing import Counter


class HostSide(asyncio.Protocol):
    """The host's connection of a tunnel: passes what the host sends to ``client``, after
    ``greeting`` (the proxy's 200, written once the host has answered, before its first byte)."""

    def __init__(self, client: asyncio.StreamWriter, down: Counter, greeting: bytes) -> None:
        self.client = client
        self.greeting = greeting
        self._resuming: asyncio.Future[None] | None = None
        self.down = down
        self.transport: asyncio.Transport | None = None
        self.ended = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self._waiting_for_client = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 (a stream connection's)
        self.transport = transport
        self.client.transport.set_write_buffer_limits(high=EGRESS_WRITE_BUFFER_BYTES)
        self.client.write(self.greeting)

    def data_received(self, data: bytes) -> None:
        self.client.write(data)
        self.down.bytes += len(data)
        full = self.client.transport.get_write_buffer_size() > EGRESS_WRITE_BUFFER_BYTES
        if full and not self._waiting_for_client and self.transport is not None:
            self._waiting_for_client = True
            self.transport.pause_reading()
            self._resuming = asyncio.ensure_future(self._resume_when_drained())

    async def _resume_when_drained(self) -> None:
        try:
            await self.client.drain()
        except ConnectionError:
            if self.transport is not None:
                self.transport.close()
            return
        self._waiting_for_client = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        if self.client.can_write_eof():
            self.client.write_eof()
        self._end()
        return True  # the way up stays open until the client ends it

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        self.client.close()  # what is buffered still goes; the client's stream then ends
        self._end()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    async def send(self, data: bytes) -> None:
        """data to the host, once the host has taken what was sent before."""
        await self._writable.wait()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def _way_up(reader: asyncio.StreamReader, host: HostSide, up: Counter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(EGRESS_PIPE_CHUNK):
            await host.send(data)
            up.bytes += len(data)
    if host.transport is not None and host.transport.can_write_eof() and not host.transport.is_closing():
        host.transport.write_eof()


async def splice(reader: asyncio.StreamReader, host: HostSide, up: Counter) -> None:
    """Pass bytes both ways until the client has ended its side and the host its own."""
    way_up = asyncio.ensure_future(_way_up(reader, host, up))
    try:
        await host.ended
        await way_up
    finally:
        way_up.cancel()
        if host.transport is not None:
            host.transport.close()
