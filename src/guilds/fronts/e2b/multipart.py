"""A ``multipart/form-data`` body read as it arrives: each file part's bytes go on as they
come, never spooled to a file or held whole (at most one of the request's chunks at a time).

    async for name, data in form_files(request):   # name: the part's file name (None: none)
        async for piece in data: ...                # its bytes, in the request's chunks

A part without a file name (a plain form field) is skipped; a part's data not read to its
end is skipped when the next part is asked for. A malformed body is ``invalid_argument``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from python_multipart.multipart import MultipartParseError, MultipartParser, parse_options_header
from starlette.requests import Request

from .connect import ConnectError


class _Parts:
    """The parser's events (``begin`` with a file name, ``data``, ``end``), one chunk of the body at a time."""

    def __init__(self, request: Request, boundary: bytes):
        self.chunks = request.stream()
        self.events: deque[tuple[str, Any]] = deque()
        self.header: list[bytes] = [b"", b""]
        self.name: str | None = None
        self.finished = False
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._part_begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished, "on_part_data": self._data,
            "on_part_end": lambda: self.events.append(("end", None)),
        })

    def _part_begin(self) -> None:
        self.name = None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.header[0] += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self.header[1] += data[start:end]

    def _header_end(self) -> None:
        field, value = self.header
        if field.strip().lower() == b"content-disposition":
            _, options = parse_options_header(value)
            filename = options.get(b"filename")
            self.name = None if filename is None else filename.decode("utf-8", "replace")
        self.header = [b"", b""]

    def _headers_finished(self) -> None:
        self.events.append(("begin", self.name))

    def _data(self, data: bytes, start: int, end: int) -> None:
        self.events.append(("data", bytes(data[start:end])))

    async def next(self) -> tuple[str, Any] | None:
        """The next event, reading the body as far as it takes; None at its end."""
        while not self.events:
            if self.finished:
                return None
            try:
                chunk = await anext(self.chunks, None)
                if chunk is None:
                    self.parser.finalize()
                    self.finished = True
                else:
                    self.parser.write(chunk)
            except MultipartParseError as exc:
                raise ConnectError("invalid_argument", f"the multipart body is not valid: {exc}") from None
        return self.events.popleft()


def boundary_of(content_type: str) -> bytes:
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise ConnectError("invalid_argument", "multipart/form-data without a boundary")
    return boundary


async def form_files(request: Request) -> AsyncIterator[tuple[str | None, AsyncIterator[bytes]]]:
    """Each file part of the body: its file name, and its bytes as they arrive."""
    parts = _Parts(request, boundary_of(request.headers.get("content-type", "")))

    async def data() -> AsyncIterator[bytes]:
        while (event := await parts.next()) is not None and event[0] == "data":
            yield event[1]

    while (event := await parts.next()) is not None:
        if event[0] == "begin" and event[1] is not None:
            yield event[1], data()
