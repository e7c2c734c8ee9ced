"""What a session of the run record is, without the database library (the app's lock
imports it before the server's first line): its kinds and its terms (``record.session_rows``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

APP = "app"
"""The kind of the app's login sessions."""
MCP = "mcp"
"""The kind of the MCP endpoint's sessions."""


@dataclass(frozen=True)
class Terms:
    idle: timedelta
    """A session ends after this long without a request."""
    max_age: timedelta
    """A session ends this long after its start."""
    most: int
    """At most this many of a kind live at once; a start past it ends the one used least recently."""
    touch: timedelta
    """A request writes its session's use only when the last written one is older than this."""
