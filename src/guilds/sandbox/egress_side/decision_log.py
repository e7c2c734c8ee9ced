"""The proxy's decisions, read into the run record at each call's end."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from ...limits import EGRESS_DECISIONS_READ_MAX_BYTES
from .files import EgressFiles, locked, read_text, write_private


def read_decisions(files: EgressFiles) -> list[dict[str, Any]]:
    """The decisions the proxy appended since the last read (by any process), each a dict
    as the proxy wrote it; a line that is not a JSON object is skipped."""
    path, mark = files.path("decisions.jsonl"), files.path("decisions.read")
    with locked(files):
        try:
            start = int(read_text(mark) or 0)
            if os.path.getsize(path) < start:  # a new file: read it from its start
                start = 0
            with open(path, "rb") as fh:
                fh.seek(start)
                chunk = fh.read(EGRESS_DECISIONS_READ_MAX_BYTES)
        except (OSError, ValueError):
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        write_private(mark, str(start + len(complete)))
    out = []
    for line in complete.splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                out.append(item)
    return out
