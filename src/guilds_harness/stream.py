"""NDJSON framing with a size guard, and the call's event log.

The harness's stdout is a stream of JSON lines. ``LineFramer`` cuts bytes into
lines, holding at most ``max_bytes`` of the current line: a longer line comes
out once, marked oversized, with its start and its full size. ``decode_event``
turns a line into an event (a JSON object with a string "type") or None.

``EventLog`` writes ``<home>/.runs/<run id>/<call id>.log``, one JSON object
a line, in the order things happened:

- each stdout line that is an event, verbatim (the harness's whole stream);
- ``{"type": "guilds.start", "harness", "argv", "cwd", "repo"}`` first (the
  prompt in argv is the brief: no secret travels on argv);
- ``{"type": "guilds.stdout", "text"}`` for a stdout line that is not an event;
- ``{"type": "guilds.oversized", "bytes", "head"}`` for a line over the guard;
- ``{"type": "guilds.stderr", "text"}`` for each stderr line (clipped);
- ``{"type": "guilds.end", "status", "exit_code", ...}`` last.

Like shell logs, it is kept unredacted in the agent's home.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from guilds_code import protocol

_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Line:
    data: bytes
    size: int
    oversized: bool = False


class LineFramer:
    """Bytes in, complete lines out (without the newline); memory <= max_bytes."""

    def __init__(self, max_bytes: int):
        self._max = max_bytes
        self._buf = bytearray()
        self._size = 0

    def feed(self, data: bytes) -> List[Line]:
        lines: List[Line] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._take(data[start:])
                return lines
            self._take(data[start:end])
            lines.append(self._emit())
            start = end + 1

    def flush(self) -> List[Line]:
        """The last line when the stream did not end with a newline."""
        return [self._emit()] if self._size else []

    def _take(self, part: bytes) -> None:
        room = self._max - len(self._buf)
        if room > 0:
            self._buf += part[:room]
        self._size += len(part)

    def _emit(self) -> Line:
        line = Line(bytes(self._buf), self._size, self._size > self._max)
        self._buf = bytearray()
        self._size = 0
        return line


def decode_event(data: bytes) -> Optional[Dict[str, Any]]:
    """A JSON object with a string "type", or None (garbage, NaN, nesting bombs)."""
    try:
        obj = protocol.parse_json(data, "event")
    except protocol.RequestError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        return obj
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").rstrip("\r")


class EventLog:
    """The call's log file: one JSON object a line (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, _OPEN_FLAGS, 0o600)

    def write_line(self, data: bytes) -> None:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(self._fd, view) :]

    def record(self, kind: str, **fields: Any) -> None:
        obj = {"type": f"guilds.{kind}"}
        obj.update(fields)
        self.write_line(json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape"))

    def stdout_line(self, line: Line, head_bytes: int) -> Optional[Dict[str, Any]]:
        """Log one stdout line; return its event, or None when it is not one."""
        if line.oversized:
            self.record("oversized", bytes=line.size, head=_text(line.data[:head_bytes]))
            return None
        event = decode_event(line.data)
        if event is None:
            if line.data.strip():
                self.record("stdout", text=_text(line.data))
            return None
        self.write_line(line.data.rstrip(b"\r"))
        return event

    def stderr_line(self, line: Line) -> str:
        text = _text(line.data)
        if line.oversized:
            text += f" … [+{line.size - len(line.data)} bytes]"
        self.record("stderr", text=text)
        return text

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
