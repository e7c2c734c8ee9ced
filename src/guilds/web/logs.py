"""The Full output log of a call, as the app gets it.

The log lives in the agent's sandbox (``<home>/.runs/<run id>/<call id>.log``,
unredacted). The app never opens it itself: ``guilds serve`` hands it a
``ReadLog``, an async ``(agent_id, path) -> envelope`` that asks the agent's
sandbox (guilds-code's ``log_read``, see ``guilds_code/ops/log_read.py``) for
the log's first ``LOG_HEAD_BYTES`` and last ``LOG_TAIL_BYTES``, shaped and
redacted there. ``HelperLogReader`` turns that envelope into a ``LogExcerpt``,
or ``LogUnavailable`` with the helper's sentence (a log no longer kept, a link
refused, a sandbox that cannot be reached).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from guilds_code.limits import LOG_HEAD_BYTES, LOG_TAIL_BYTES

__all__ = ["LOG_HEAD_BYTES", "LOG_TAIL_BYTES", "HelperLogReader", "LogExcerpt", "LogReader", "LogUnavailable",
           "ReadLog"]

ReadLog = Callable[[str, str], Awaitable[Mapping[str, Any]]]
"""(agent_id, path) -> the helper's envelope: {"ok", "text", "meta"} or {"ok": false, "error"}."""


class LogUnavailable(Exception):
    """The log cannot be shown; the message says why, in a sentence."""


@dataclass(frozen=True)
class LogExcerpt:
    path: str
    size: int
    """Bytes of the log when it was read."""
    head: str
    tail: str = ""
    """Empty when ``head`` holds the whole log."""
    omitted: int = 0
    """Bytes of the log between head and tail, not shown."""


class LogReader(Protocol):
    async def read(self, agent_id: str, path: str) -> LogExcerpt:
        """The log at ``path`` (as the agent's sandbox sees it), redacted; LogUnavailable if not."""
        ...


class HelperLogReader:
    """Logs read by the agent's sandbox (``read``, handed in by serve)."""

    def __init__(self, read: ReadLog):
        self._read = read

    async def read(self, agent_id: str, path: str) -> LogExcerpt:
        envelope = await self._read(agent_id, path)
        if not envelope.get("ok"):
            raise LogUnavailable(str(envelope.get("error") or "The log cannot be read."))
        meta = envelope["meta"]
        return LogExcerpt(path, meta["size"], meta["head"], meta["tail"], meta["omitted"])
