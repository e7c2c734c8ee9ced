"""HTTP/1.1 heads as the egress proxy reads them: bounded, strict, one-line errors.

A head is read whole (up to ``EGRESS_HEAD_MAX_BYTES``), then split into its
start line and header fields; bodies are never read here (``framing`` streams
them). Header fields keep their order, their names' case and repeats.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..limits import EGRESS_HEAD_MAX_BYTES, EGRESS_HEADER_COUNT_MAX, EGRESS_REQUEST_LINE_MAX_BYTES

_TOKEN_CHARS = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class BadHead(Exception):
    """A head the proxy refuses: ``status`` to answer with and a one-line ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HeadGone(Exception):
    """The peer closed the connection before a head began (a kept-alive connection's end)."""


@dataclass
class Head:
    """A request or response head: its start line's three parts and its header fields."""

    first: tuple[str, str, str]
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        """The last value of header name (any case), or None."""
        name = name.lower()
        values = [v for k, v in self.headers if k.lower() == name]
        return values[-1] if values else None

    def values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]

    def remove(self, *names: str) -> None:
        drop = {n.lower() for n in names}
        self.headers = [(k, v) for k, v in self.headers if k.lower() not in drop]

    def set(self, name: str, value: str) -> None:
        self.remove(name)
        self.headers.append((name, value))

    def encode(self) -> bytes:
        lines = [" ".join(self.first)] + [f"{k}: {v}" for k, v in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """The raw bytes of the next head, its blank line included.

    HeadGone if the peer closed before sending a byte; BadHead (431) past
    EGRESS_HEAD_MAX_BYTES, (400) for a head cut short. The reader's limit must be
    at least EGRESS_HEAD_MAX_BYTES.
    """
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as cut:
        if not cut.partial.strip():
            raise HeadGone from None
        raise BadHead(400, "the request head ended before its blank line") from None
    except asyncio.LimitOverrunError:
        raise BadHead(431, f"the request head is longer than {EGRESS_HEAD_MAX_BYTES} bytes") from None
    if len(raw) > EGRESS_HEAD_MAX_BYTES:
        raise BadHead(431, f"the request head is longer than {EGRESS_HEAD_MAX_BYTES} bytes")
    return raw


def parse_head(raw: bytes, *, request: bool = True) -> Head:
    """raw split into a Head; BadHead names what is wrong (the request line, a header)."""
    lines = raw[:-4].split(b"\r\n")
    first = lines[0]
    if request and len(first) > EGRESS_REQUEST_LINE_MAX_BYTES:
        raise BadHead(414, f"the request line is longer than {EGRESS_REQUEST_LINE_MAX_BYTES} bytes")
    parts = first.split(b" ", 2)
    if not request and len(parts) == 2:
        parts.append(b"")  # a status line may leave out its reason phrase
    status = 400 if request else 502  # a host's bad answer is no fault of the client
    if len(parts) != 3 or not _good_first(parts, request):
        what = "request line" if request else "host's status line"
        raise BadHead(status, f"the {what} is malformed: {first[:80].decode('latin-1')!r}")
    if len(lines) - 1 > EGRESS_HEADER_COUNT_MAX:
        raise BadHead(431 if request else 502, f"the head has more than {EGRESS_HEADER_COUNT_MAX} header lines")
    head = Head((parts[0].decode(), parts[1].decode("latin-1"), parts[2].decode("latin-1")))
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or not set(name) <= _TOKEN_CHARS or b"\n" in value or b"\r" in value:
            raise BadHead(status, f"a header line is malformed: {line[:80].decode('latin-1')!r}")
        head.headers.append((name.decode(), value.strip(b" \t").decode("latin-1")))
    return head


def _good_first(parts: list[bytes], request: bool) -> bool:
    if request:
        method, target, version = parts
        return (bool(method) and set(method) <= _TOKEN_CHARS and bool(target)
                and all(0x20 < c < 0x7F for c in target) and version in (b"HTTP/1.1", b"HTTP/1.0"))
    version, status = parts[0], parts[1]
    return version.startswith(b"HTTP/1.") and len(status) == 3 and status.isdigit()
