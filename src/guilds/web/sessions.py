"""The app's login sessions: a browser's cookie holds a session's value, never the server's token.

    sessions = Sessions()
    value = sessions.start()        at the ``?token=`` login: a new session's random value
    sessions.holds(value) -> bool   a live session (its idle time starts again); else False
    sessions.end(value) -> bool     the logout: the session ends (False: it was not live)

A session is kept in the serving process's memory only: a restart of ``guilds serve``
ends every session (open the URL it prints again). A session ends after
``guilds.limits.APP_SESSION_IDLE_SECONDS`` without a request, and
``guilds.limits.APP_SESSION_MAX_AGE_SECONDS`` after its login however much it is used; at most
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
from dataclasses import dataclass

from ..limits import APP_SESSION_IDLE_SECONDS, APP_SESSION_MAX_AGE_SECONDS, APP_SESSIONS_MAX

SESSION_BYTES = 32
"""256 random bits, as 43 URL-safe characters (cookie-safe as they are)."""


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


@dataclass
class _Session:
    started: float
    used: float


class Sessions:
    """The live sessions of one server: each value's digest, when it started and when it was
    last used, the least recently used first. ``clock``: monotonic seconds (a test's own clock)."""

    def __init__(self, *, idle_seconds: float = APP_SESSION_IDLE_SECONDS,
                 max_age_seconds: float = APP_SESSION_MAX_AGE_SECONDS, most: int = APP_SESSIONS_MAX,
                 clock: Callable[[], float] = time.monotonic):
        self.idle_seconds, self.max_age_seconds, self.most, self.clock = idle_seconds, max_age_seconds, most, clock
        self._live: OrderedDict[bytes, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def start(self) -> str:
        """A new session's value; the ended ones go first, then the longest idle while at ``most``."""
        self._end_stale()
        while len(self._live) >= self.most:
            self._live.popitem(last=False)
        value = secrets.token_urlsafe(SESSION_BYTES)
        now = self.clock()
        self._live[_digest(value)] = _Session(started=now, used=now)
        return value

    def holds(self, value: str | None) -> bool:
        """Whether ``value`` is a live session's; a live one counts as used now."""
        if not value:
            return False
        key, now = _digest(value), self.clock()
        session = self._live.get(key)
        if session is None:
            return False
        if self._stale(session, now):
            del self._live[key]
            return False
        session.used = now
        self._live.move_to_end(key)
        return True

    def end(self, value: str | None) -> bool:
        """The logout: ``value``'s session ends at once; False when it was not a live one."""
        return bool(value) and self._live.pop(_digest(value or ""), None) is not None

    def _stale(self, session: _Session, now: float) -> bool:
        return now - session.used >= self.idle_seconds or now - session.started >= self.max_age_seconds

    def _end_stale(self) -> None:
        now = self.clock()
        for key in [key for key, session in self._live.items() if self._stale(session, now)]:
            del self._live[key]
