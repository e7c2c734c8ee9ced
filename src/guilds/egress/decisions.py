"""The decisions file: one JSON line per connection the egress proxy decided on.

Each line is ``{"time", "host", "port", "allowed", "reason", "bytes_up",
"bytes_down", "tag"}``: when the connection was decided (Unix seconds), its target,
whether it went out and why (the refusal's line, or the entry that allowed it), the
bytes sent up (to the host) and down (to the sandbox), and the tag of the call that
made it (``<run id>/<call id>``, from the proxy URL's user name; "" without one).
A refused connection is written when refused; an allowed one when it ends. Lines
are appended whole (one ``write`` each), so a reader sees whole lines only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class DecisionRecord:
    """One line of the decisions file, filled in as its connection goes."""

    host: str
    port: int
    tag: str = ""
    allowed: bool = False
    reason: str = ""
    bytes_up: int = 0
    bytes_down: int = 0
    time: float = field(default_factory=time.time)


class DecisionLog:
    """The decisions file, opened for appending (created 0600)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, record: DecisionRecord) -> None:
        line = json.dumps(asdict(record), separators=(",", ":"), ensure_ascii=True) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


def read_decisions(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """Every whole line of a decisions file (a line cut short at the end is left out)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]
