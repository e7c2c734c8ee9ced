"""The MCP endpoint's sessions of the older handshake (``Mcp-Session-Id``) in the run record,
so every server on the record serves them: the replicas of a deployment behind one Service.

    SessionsOnRecord.install(manager, store)   in front of the SDK's session manager's handler

A session the SDK opens here is written to the record (its id's SHA-256, the token's
principal: ``guilds.record.session_rows``) before its id reaches the client. A request naming a
session this process does not hold, that the record holds for the same token, is served
here as the SDK serves a request of no session: born ready (no handshake again), its calls
in the session's run (``guilds.fronts.mcp_runs`` derives the run from the session id). Its
GET (the stream of the server's own messages) is answered 405, so the client goes on
without that stream; its DELETE ends the session in the record. A session the record does
not hold (ended, idle past MCP_SESSION_IDLE_SECONDS, another token's) is answered as the
SDK answers an unknown one, 404: the client starts a new session. A session's use is
written at most every MCP_SESSION_TOUCH_SECONDS, by whichever server serves it.

A session this process holds is read from the record again when its use is due to be
written: one ended elsewhere (a DELETE through another server, idle past its time there) is
ended here too, and its request answered 404, within MCP_SESSION_TOUCH_SECONDS of its end.

What stays with the server that holds the session: the stream of its GET, and a request
the server sends the client (none of guilds' tools does). A call's cancel and progress
travel on the call's own request, wherever it runs.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import timedelta

from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import RecordError
from ..limits import MCP_SESSION_IDLE_SECONDS, MCP_SESSION_TOUCH_SECONDS, MCP_SESSIONS_KEPT
from ..record.session_terms import MCP, Terms
from ..record.store import Store
from ..web.endpoint_lock import principal_of_scope

log = logging.getLogger(__name__)
TERMS = Terms(idle=timedelta(seconds=MCP_SESSION_IDLE_SECONDS), max_age=timedelta(days=365),
              most=MCP_SESSIONS_KEPT, touch=timedelta(seconds=MCP_SESSION_TOUCH_SECONDS))
VERSION_HEADER = "mcp-protocol-version"
CHECKED_MAX = 4096
"""Sessions whose last check this process remembers (past this many the memory starts over)."""


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


class SessionsOnRecord:
    """The ASGI handler put between the SDK's body limit and its session handling (the
    module docstring)."""

    def __init__(self, manager: StreamableHTTPSessionManager, inner: ASGIApp, store: Store,
                 terms: Terms = TERMS):
        self.manager, self.inner, self.store, self.terms = manager, inner, store, terms
        self._checked: dict[str, float] = {}

    @classmethod
    def install(cls, manager: StreamableHTTPSessionManager, store: Store,
                terms: Terms | None = None) -> SessionsOnRecord:
        """Put in front of manager's handler; terms: TERMS (read now) unless given."""
        limited = manager.asgi_app  # the SDK's RequestBodyLimitMiddleware around its handler
        handler = cls(manager, limited.app, store, terms or TERMS)
        limited.app = handler
        return handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        session_id = headers.get(MCP_SESSION_ID_HEADER)
        version = headers.get(VERSION_HEADER)
        if scope["type"] != "http" or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.inner(scope, receive, send)  # the sessionless revision: no session to hold
            return
        principal = principal_of_scope(scope)
        if session_id is None:
            await self.inner(scope, receive, self._noting(send, principal))
        elif session_id in self.manager._server_instances:
            if not await self._kept(session_id, principal):  # ended elsewhere: unknown here too from now
                await self.manager._discard_session(session_id, self.manager._server_instances[session_id])
            await self.inner(scope, receive, send)
            if scope["method"] == "DELETE":
                await self._end(session_id)
        elif not await self._held(session_id, principal):
            await self.inner(scope, receive, send)  # the SDK's 404
        elif scope["method"] == "POST":
            await self.manager._handle_stateless_request(version, scope, receive, send)
        elif scope["method"] == "DELETE":
            await self._end(session_id)
            await Response(status_code=200)(scope, receive, send)
        else:
            await Response("Method Not Allowed: this server does not hold the session's stream", 405,
                           headers={"allow": "POST, DELETE"})(scope, receive, send)

    def _noting(self, send: Send, principal: str) -> Send:
        """send, writing a session the response opens to the record before the client learns its id."""
        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                opened = Headers(raw=message.get("headers", [])).get(MCP_SESSION_ID_HEADER)
                if opened is not None:
                    await self._start(opened, principal)
            await send(message)
        return noting

    async def _start(self, session_id: str, principal: str) -> None:
        try:
            await self.store.session_start(MCP, _digest(session_id), principal, self.terms)
        except RecordError as error:  # the session still serves here; other servers answer it 404
            log.warning("mcp: session not written to the record: %s", error)
        self._remember(session_id)

    async def _held(self, session_id: str, principal: str, unread: bool = False) -> bool:
        """Whether the record holds the session (its use written when due); unread when the
        record cannot be read."""
        try:
            held = await self.store.session_holds(MCP, _digest(session_id), principal, self.terms)
        except RecordError as error:
            log.warning("mcp: session not read from the record: %s", error)
            return unread
        if held:
            self._remember(session_id)
        return held

    async def _kept(self, session_id: str, principal: str) -> bool:
        """A session this process holds: its use written, and whether the record still holds it,
        when due; True between checks. A record that cannot be read keeps it."""
        if time.monotonic() - self._checked.get(session_id, float("-inf")) < self.terms.touch.total_seconds():
            return True
        return await self._held(session_id, principal, unread=True)

    async def _end(self, session_id: str) -> None:
        self._checked.pop(session_id, None)
        try:
            await self.store.session_end(MCP, _digest(session_id))
        except RecordError as error:
            log.warning("mcp: session's end not written to the record: %s", error)

    def _remember(self, session_id: str) -> None:
        if len(self._checked) >= CHECKED_MAX:
            self._checked.clear()
        self._checked[session_id] = time.monotonic()
