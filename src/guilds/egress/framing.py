"""HTTP/1.1 bodies streamed from one side to the other, never held whole.

A body is framed by its head: ``Content-Length``, ``Transfer-Encoding: chunked``,
none (a request without either; a response to HEAD, a 1xx, 204 or 304), or the
connection's end (a response with neither). ``pipe_body`` passes it on in pieces
of at most ``EGRESS_PIPE_CHUNK`` through an optional transform (the scrubber),
re-chunking a chunked body so a transform may hold bytes back across pieces.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from ..limits import EGRESS_CHUNK_LINE_MAX_BYTES, EGRESS_PIPE_CHUNK
from .http_head import BadHead, Head


@dataclass(frozen=True)
class Framing:
    """How a body ends: ``length`` bytes, ``chunked``, or at the connection's end (``until_close``)."""

    length: int = 0
    chunked: bool = False
    until_close: bool = False


NO_BODY = Framing()
_HEX = frozenset(b"0123456789abcdefABCDEF")


def request_framing(head: Head) -> Framing:
    return _framing(head, until_close=False)


def response_framing(head: Head, method: str) -> Framing:
    status = int(head.first[1])
    if method == "HEAD" or status < 200 or status in (204, 304):
        return NO_BODY
    return _framing(head, until_close=True)


def _framing(head: Head, *, until_close: bool) -> Framing:
    encodings = ",".join(head.values("Transfer-Encoding")).lower()
    if encodings.strip():
        if [e.strip() for e in encodings.split(",")][-1] != "chunked" or head.get("Content-Length") is not None:
            raise BadHead(400, "the head's Transfer-Encoding is not chunked, or comes with a Content-Length")
        return Framing(chunked=True)
    lengths = {v.strip() for v in head.values("Content-Length")}
    if len(lengths) > 1 or any(not v.isascii() or not v.isdigit() for v in lengths):
        raise BadHead(400, "the head's Content-Length is not one number")
    if lengths:
        return Framing(length=int(lengths.pop()))
    return Framing(until_close=until_close)


class Counter:
    """Bytes passed on, for the decision record."""

    def __init__(self) -> None:
        self.bytes = 0


async def _send(writer: asyncio.StreamWriter, data: bytes, counter: Counter) -> None:
    if data:
        writer.write(data)
        counter.bytes += len(data)
        await writer.drain()


async def pipe_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: Framing,
                    counter: Counter, transform: Callable[[bytes], bytes] | None = None,
                    flush: Callable[[], bytes] | None = None) -> None:
    """Stream one body from reader to writer as framing says; IncompleteReadError if cut short."""
    if framing.chunked:
        await _pipe_chunked(reader, writer, counter, transform, flush)
        return
    left = framing.length
    while framing.until_close or left > 0:
        data = await reader.read(EGRESS_PIPE_CHUNK if framing.until_close else min(left, EGRESS_PIPE_CHUNK))
        if not data:
            if framing.until_close:
                break
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(data)
        await _send(writer, transform(data) if transform else data, counter)
    if flush:
        await _send(writer, flush(), counter)


async def _chunk_line(reader: asyncio.StreamReader) -> bytes:
    line = await reader.readuntil(b"\r\n")
    if len(line) > EGRESS_CHUNK_LINE_MAX_BYTES:
        raise BadHead(400, "a chunk's size line is too long")
    return line


async def _pipe_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: Counter,
                        transform: Callable[[bytes], bytes] | None, flush: Callable[[], bytes] | None) -> None:
    def framed(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data) if data else b""

    while True:
        size_text = (await _chunk_line(reader)).split(b";", 1)[0].strip()
        if not size_text or not set(size_text) <= _HEX:
            raise BadHead(400, "a chunk's size is not a hexadecimal number")
        size = int(size_text, 16)
        if size == 0:
            break
        while size > 0:
            data = await reader.readexactly(min(size, EGRESS_PIPE_CHUNK))
            size -= len(data)
            await _send(writer, framed(transform(data) if transform else data), counter)
        if await reader.readexactly(2) != b"\r\n":
            raise BadHead(400, "a chunk does not end with CRLF")
    while (await _chunk_line(reader)) != b"\r\n":  # trailer fields are dropped
        pass
    await _send(writer, framed(flush() if flush else b"") + b"0\r\n\r\n", counter)
