"""The app's login sessions: a browser's cookie holds a session's value, never the server's token.

    sessions = Sessions()
    value = sessions.start()        at the ``?token=`` login: a new session's random value
    sessions.holds(value) -> bool   a live session (its idle time starts again); else False

A session is kept in the serving process's memory only: a restart of ``guilds serve``
ends every session (open the URL it prints again). A session ends after
``guilds.limits.APP_SESSION_IDLE_SECONDS`` without a request; at most
``guilds.limits.APP_SESSIONS_MAX`` are live at once, and a login past that ends the session
idle longest, so logging in again and again cannot grow the server's memory.

A value is kept by its SHA-256 only: looking one up takes no time that depends on how
much of a guessed value matches, and the memory holds no cookie a browser could send.
A session is good for the app's pages only: the MCP endpoint takes the token alone
(``guilds.web.endpoint_lock``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from ..limits import APP_SESSION_IDLE_SECONDS, APP_SESSIONS_MAX

SESSION_BYTES = 32
"""256 random bits, as 43 URL-safe characters (cookie-safe as they are)."""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


class Sessions:
    """The live sessions of one server: each value's digest and when it was last used,
    the least recently used first. ``clock``: monotonic seconds (a test's own clock)."""

    def __init__(self, *, idle_seconds: float = APP_SESSION_IDLE_SECONDS, most: int = APP_SESSIONS_MAX,
                 clock: Callable[[], float] = time.monotonic):
        self.idle_seconds, self.most, self.clock = idle_seconds, most, clock
        self._used: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._used)

    def start(self) -> str:
        """A new session's value; the idle ones end first, then the longest idle while at ``most``."""
        self._end_idle()
        while len(self._used) >= self.most:
            self._used.popitem(last=False)
        value = secrets.token_urlsafe(SESSION_BYTES)
        self._used[_digest(value)] = self.clock()
        return value

    def holds(self, value: str | None) -> bool:
        """Whether ``value`` is a live session's; a live one counts as used now."""
        if not value:
            return False
        key, now = _digest(value), self.clock()
        used = self._used.get(key)
        if used is None:
            return False
        if now - used >= self.idle_seconds:
            del self._used[key]
            return False
        self._used[key] = now
        self._used.move_to_end(key)
        return True

    def _end_idle(self) -> None:
        now = self.clock()
        while self._used:
            key, used = next(iter(self._used.items()))
            if now - used < self.idle_seconds:
                return
            del self._used[key]
