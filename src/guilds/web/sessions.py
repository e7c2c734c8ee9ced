"""The app's login sessions: a browser's cookie holds a session's value, never the server's token.

    sessions = Sessions(store)
    value = await sessions.start(principal)         at the ``?token=`` login: a new session's random value
    await sessions.holds(value, principal) -> bool   a live session of that token's (its idle time starts again)
    await sessions.end(value) -> bool                the logout: the session ends (False: it was not live)

A session is kept in the run record (``guilds.record.session_rows``), so every server on
the record holds it: a restart of ``guilds serve``, or another replica of a deployment,
takes the same cookie. It ends after ``guilds.limits.APP_SESSION_IDLE_SECONDS`` without a
request, ``guilds.limits.APP_SESSION_MAX_AGE_SECONDS`` after its login however much it is
used, and at once when the token changes (a session is its token's: ``principal``). At
most ``guilds.limits.APP_SESSIONS_MAX`` are live at once, and a login past that ends the
session used least recently, so logging in again and again cannot grow the record. A
request writes the session's use only when the last one written is older than
``guilds.limits.APP_SESSION_TOUCH_SECONDS``.

A value is kept by its SHA-256 only: looking one up takes no time that depends on how
much of a guessed value matches, and the record holds no cookie a browser could send.
A session is good for the app's pages only: the MCP endpoint takes the token alone
(``guilds.web.endpoint_lock``).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from ..limits import APP_SESSION_IDLE_SECONDS, APP_SESSION_MAX_AGE_SECONDS, APP_SESSION_TOUCH_SECONDS, APP_SESSIONS_MAX
from ..record.session_terms import APP, Terms

if TYPE_CHECKING:
    from ..record.store import Store

SESSION_BYTES = 32
"""256 random bits, as 43 URL-safe characters (cookie-safe as they are)."""
TERMS = Terms(idle=timedelta(seconds=APP_SESSION_IDLE_SECONDS), max_age=timedelta(seconds=APP_SESSION_MAX_AGE_SECONDS),
              most=APP_SESSIONS_MAX, touch=timedelta(seconds=APP_SESSION_TOUCH_SECONDS))


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class Sessions:
    """The login sessions of the servers on ``store`` (the module docstring); ``terms``: their
    lifetimes and count (a test's own)."""

    def __init__(self, store: Store, terms: Terms | None = None):
        self.store, self.terms = store, terms or TERMS

    async def start(self, principal: str) -> str:
        value = secrets.token_urlsafe(SESSION_BYTES)
        await self.store.session_start(APP, _digest(value), principal, self.terms)
        return value

    async def holds(self, value: str | None, principal: str) -> bool:
        return bool(value) and await self.store.session_holds(APP, _digest(value or ""), principal, self.terms)

    async def end(self, value: str | None) -> bool:
        return bool(value) and await self.store.session_end(APP, _digest(value or ""))
