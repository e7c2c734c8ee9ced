"""Which run an MCP call belongs to, and who may continue it.

    Runs(store, fixed_run, idle_seconds, agent_id).choose(request, arguments) -> (RunChoice, arguments)

Every served tool takes the optional ``run`` argument (``RUN_ARG``, added to
its schema by ``guilds.toolbox.tools.formats.with_run_argument``, the mcp format).

A call's run, first rule that applies:

1. the ``run`` argument (SEP-2567's explicit handle): a run this server already
   knows (its id came back in an earlier result); an unknown id is refused,
   so a mistyped handle never starts an empty run. A ``_meta["guilds/run"]``
   naming another run beside it is refused too;
2. stdio: the connection's own run (``fixed_run``), unless ``_meta`` names one;
3. ``_meta["guilds/run"]``: that run (made on its first call, as before);
4. an HTTP session of the handshake era (``Mcp-Session-Id``): a run derived from it;
5. none of these (the 2026-07-28 revision over HTTP, naming nothing): the
   principal's current sessionless run, new after ``idle_seconds`` without such
   a call (its start or its end). It is kept in the run record
   (``Store.sessionless_run``), so any server on the record (the replicas of a
   deployment) continues it; a sessionless call that names a run in ``_meta``
   makes that the current one. A server asks the record again only past
   MCP_SESSIONLESS_RECHECK_SECONDS since it last used the run. Its id travels back in the run line
   (``RUN_LINE``), the first line of the result's text, where the model reads
   it, besides ``_meta["guilds/meta"]``, so the model can name it from then on
   (``RunChoice.chosen``, ``with_run_line``).

Every run belongs to the principal of its first call through this front: the
endpoint's token (a fingerprint, ``guilds.web.endpoint_lock.principal_of_scope``), or ""
where no token is asked (stdio, ``--no-token``). A call of another principal
naming it, by any of the rules above, is refused by name (``BadInput``). On a
record shared by several agents' servers, a call naming a run the record holds
for another agent is refused before it claims anything (``Store.claim_run`` with
the agent id), so the run stays its own agent's to claim. A refused call leaves
the caller's current sessionless run where it was: ``_meta`` moves it (rule 3)
only once the run named passed these checks.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext

from ..config.checks import is_safe_name
from ..errors import BadInput, RecordError
from ..limits import MCP_SESSIONLESS_RECHECK_SECONDS
from ..record.store import Store
from ..toolbox.toolbox import check_run_id
from ..toolbox.tools.formats import RUN_ARG
from ..web.endpoint_lock import principal_of_scope

log = logging.getLogger(__name__)
RUN_PREFIX = "mcp-"
META_KEY = "guilds/meta"
"""Where a result's metadata travels: ``_meta["guilds/meta"]``."""
RUN_KEY = "guilds/run"
"""A request ``_meta`` key naming the run a call belongs to."""
RUN_LINE = 'run: {run_id} (pass it back as "run" to continue this run)'
"""The first line of a result whose run the server chose (rule 5): the handle, said to the model."""
SESSION_HEADER = "mcp-session-id"
PRINCIPAL_CACHE_MAX = 4096
"""Runs whose principal this process remembers (a claim never changes; past this many the memory starts over)."""


def new_run_id() -> str:
    return RUN_PREFIX + uuid.uuid4().hex


def session_run_id(session_id: str) -> str:
    """The run of an HTTP session: stable per session, without showing the session id."""
    return RUN_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def with_run_line(text: str, run_id: str) -> str:
    """The run line, then text (the result after the pipeline: redaction, the cap, the
    trailer), so neither redaction nor the cap can take it away. First, not last: a
    client that keeps only the start of a long result (Claude Code shows the model
    the first 2 KB of one over about 50 KB) still shows it."""
    line = RUN_LINE.format(run_id=run_id)
    return f"{line}\n{text}" if text else line


@dataclass(frozen=True)
class RunChoice:
    run_id: str
    chosen: bool
    """The server picked the run (rule 5): the result's text starts with the run line."""


def principal_of(request: ServerRequestContext | None) -> str:
    """The caller's principal: the token's fingerprint the endpoint lock put in the scope, else ""."""
    http = request.request if request is not None else None
    scope = getattr(http, "scope", None)
    return principal_of_scope(scope) if scope is not None else ""


def _session_of(request: ServerRequestContext | None) -> str | None:
    http = request.request if request is not None else None
    headers = getattr(http, "headers", None)
    return headers.get(SESSION_HEADER) if headers is not None else None


class Runs:
    """The run rules of the module docstring, over one run record, for one agent's server."""

    def __init__(self, store: Store, fixed_run: str | None, idle_seconds: float, agent_id: str | None = None):
        """agent_id: the server's agent; a run the record holds for another agent is refused
        before it is claimed (None: not asked)."""
        self.store = store
        self.fixed_run = fixed_run
        self.idle_seconds = idle_seconds
        self.agent_id = agent_id
        self._principals: dict[str, str] = {}
        self._recent: dict[str, tuple[str, float]] = {}
        """principal -> (its current sessionless run, when this process last used or wrote it)."""
        self._recheck = min(MCP_SESSIONLESS_RECHECK_SECONDS, idle_seconds / 2)

    async def choose(self, request: ServerRequestContext | None,
                     arguments: dict[str, Any]) -> tuple[RunChoice, dict[str, Any]]:
        """The call's run and its arguments without ``run``; BadInput naming what was wrong.
        A refused call changes nothing: no run claimed, no current sessionless run moved."""
        principal = principal_of(request)
        named = (request.meta or {}).get(RUN_KEY) if request is not None else None
        if RUN_ARG in arguments:
            rest = {k: v for k, v in arguments.items() if k != RUN_ARG}
            run_id = _checked_argument(arguments[RUN_ARG])
            if named is not None and named != run_id:
                raise BadInput(f"run: {run_id!r}, but _meta[{RUN_KEY!r}] names {named!r}; name one run")
            if run_id not in self._principals and await self.store.get_run(run_id) is None:
                raise BadInput(f"run: no run {run_id!r} on this server; omit run to start a new one")
            await self._check(run_id, principal)
            return RunChoice(run_id, False), rest
        choice = await self._by_transport(request, named, principal)
        await self._check(check_run_id(choice.run_id), principal)
        if named is not None and not _session_of(request) and isinstance(named, str) and is_safe_name(named):
            await self._sessionless(principal, named)
        return choice, arguments

    async def _sessionless(self, principal: str, named: str | None = None) -> str:
        """The principal's current sessionless run (named: made the current one), from the record
        unless this process used or wrote it less than MCP_SESSIONLESS_RECHECK_SECONDS ago."""
        now = time.monotonic()
        known = self._recent.get(principal)
        if known is not None and now - known[1] < self._recheck and named in (None, known[0]):
            return known[0]
        run_id = await self.store.sessionless_run(self.agent_id or "", principal, named or new_run_id(),
                                                  self.idle_seconds, named=named)
        if len(self._recent) >= PRINCIPAL_CACHE_MAX:
            self._recent.clear()
        self._recent[principal] = (run_id, now)
        return run_id

    async def _by_transport(self, request: ServerRequestContext | None, named: Any, principal: str) -> RunChoice:
        if self.fixed_run is not None and named is None:
            return RunChoice(self.fixed_run, False)
        session = _session_of(request)
        if named is not None:
            return RunChoice(named, False)
        if session:
            return RunChoice(session_run_id(session), False)
        return RunChoice(await self._sessionless(principal), True)

    async def _check(self, run_id: str, principal: str) -> None:
        """Claim the run for principal on its first call; refuse another principal's run, and
        (before any claim) a run of another agent."""
        owner = self._principals.get(run_id)
        if owner is None:
            owner = await self.store.claim_run(run_id, principal, self.agent_id)
            if len(self._principals) >= PRINCIPAL_CACHE_MAX:
                self._principals.clear()
            self._principals[run_id] = owner
        if owner != principal:
            raise BadInput(f"run {run_id!r} was started with another token; omit run to start a new one")

    async def ended(self, request: ServerRequestContext | None, run_id: str) -> None:
        """A sessionless call of run_id ended: its principal's idle time counts from now (a
        failure of the record here is logged: the call's answer stands)."""
        if self.fixed_run is not None or _session_of(request):
            return
        principal, now = principal_of(request), time.monotonic()
        known = self._recent.get(principal)
        if known is not None and (known[0] != run_id or now - known[1] < self._recheck):
            return  # another run is current, or the record's time of its start is near enough
        try:
            await self.store.sessionless_used(self.agent_id or "", principal, run_id)
            self._recent[principal] = (run_id, now)
        except RecordError as exc:
            log.warning("%s", exc)


def _checked_argument(value: Any) -> str:
    if not isinstance(value, str):
        raise BadInput(f"run: must be a run id from an earlier result (a string), got {value!r}")
    return check_run_id(value)
