"""The app: runs, a run's flow of calls, each call's views, live. A front: it only translates.

    GET /                              the runs, the most recently active first (?agent=ID: of one agent)
    GET /agents                        the agents of the record, newest first (?owner=, ?state=)
    GET /runs/{run}                    the run's Chat tab: the newest page of its flow
    GET /runs/{run}?at=N               the run's Chat tab, its flow starting at seq N (a jump)
    GET /runs/{run}/flow?before=N      the page before seq N (a fragment: "Load earlier")
    GET /runs/{run}/flow?after=N       the page after seq N (a fragment: "Load later")
    GET /runs/{run}/calls/{seq}        a call opened (?view=arguments|result|metadata,
                                       &format=raw); a fragment for htmx, else the whole page
    GET /runs/{run}/calls/{seq}/log    the call's Full output log, redacted, bounded
    GET /runs/{run}/events?after=N     server-sent events: the run's new and changed calls
    GET /static/...                    CSS, JS and the vendored htmx

Every record is redacted (``flow.redact_call``) before a view sees it; what
the views build, the templates only lay out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, overload

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from guilds_code.redact import Redactor

from ..limits import APP_RETRY_MS
from ..record.statements import FLOW_PAGE
from ..record.store import Store
from ..record.values import CallRecord, RunRecord
from .agents_view import AgentFilters, ServingAgent, agents_page, serving_item
from .endpoint_lock import EndpointLock, Lock
from .events import call_updates, sse_message
from .flow import MAX_SEQ, FlowPage, flow_item, flow_page, later_page, redact_call, runs_href, runs_page, seq_in_range
from .logs import LogReader, LogUnavailable
from .rewind import Rewind, rewind_route
from .savings_view import run_savings_of
from .sessions import Sessions
from .views import CallPage, call_page, log_view

HERE = Path(__file__).parent
RUNS_PAGE = 50
AGENTS_PAGE = 50
MAX_FILTER_CHARS = 128
"""The longest agent id, owner or state a query may name (the record's own limit)."""
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def templates() -> Environment:
    return Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                       trim_blocks=True, lstrip_blocks=True)


@overload
def _int(value: str | None, default: int) -> int: ...
@overload
def _int(value: str | None, default: None = None) -> int | None: ...
def _int(value: str | None, default: int | None = None) -> int | None:
    """A query's number (default when absent); 400 when it is not one or is out of range."""
    try:
        number = int(value) if value is not None else default
    except ValueError:
        raise HTTPException(400, f"not a number: {value!r}") from None
    if number is not None and abs(number) > MAX_SEQ:
        raise HTTPException(400, f"out of range: {value!r}")
    return number


def _name(request: Request, key: str) -> str | None:
    """A query's agent id, owner or state (None when absent or empty); 400 when too long."""
    value = request.query_params.get(key) or None
    _check_name(key, value)
    return value


def _check_name(key: str, value: str | None) -> None:
    if value is not None and len(value) > MAX_FILTER_CHARS:
        raise HTTPException(400, f"{key}: at most {MAX_FILTER_CHARS} characters, got {len(value)}")


def _names(request: Request, key: str) -> tuple[str, ...]:
    """Every value of a query's key given more than once (empty ones left out); 400 for one too long."""
    values = tuple(dict.fromkeys(v for v in request.query_params.getlist(key) if v))
    for value in values:
        _check_name(key, value)
    return values


def _fragment(request: Request) -> bool:
    """htmx asked for a part of the page (not a history restore, which wants it whole)."""
    return "hx-request" in request.headers and "hx-history-restore-request" not in request.headers


class WebApp:
    """The routes' handlers over one store, one redactor (every served agent's secrets) and the logs."""

    def __init__(self, store: Store, redactor: Redactor, logs: LogReader, serving: ServingAgent | None = None,
                 rewind: Rewind | None = None):
        self.store, self.redactor, self.logs, self.serving, self.rewind = store, redactor, logs, serving, rewind
        self.env = templates()
        self.env.globals["rewind_served"] = rewind is not None

    def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**context), status, headers={"vary": "HX-Request"})

    async def _run(self, request: Request) -> RunRecord:
        run = await self.store.get_run(request.path_params["run_id"])
        if run is None:
            raise HTTPException(404, "no such run")
        return run

    async def _call(self, request: Request) -> CallRecord:
        if not seq_in_range(request.path_params["seq"]):
            raise HTTPException(404, "no such call")
        call = await self.store.call(request.path_params["run_id"], request.path_params["seq"])
        if call is None:
            raise HTTPException(404, "no such call")
        return redact_call(call, self.redactor)

    async def _flow(self, run_id: str, before: int | None) -> FlowPage:
        calls = await self.store.flow_before(run_id, before)
        return flow_page(run_id, [redact_call(c, self.redactor) for c in calls])

    async def _flow_from(self, run_id: str, start: int) -> FlowPage:
        """The page starting at seq start (a jump), or the newest page when start is on it."""
        newest = await self._flow(run_id, None)
        if not newest.items or start >= newest.items[0].seq:
            return newest
        calls = await self.store.flow_after(run_id, max(0, start - 1), FLOW_PAGE + 1)
        page = [redact_call(c, self.redactor) for c in calls[: FLOW_PAGE]]
        return flow_page(run_id, page, more_after=len(calls) > FLOW_PAGE, start=start)

    async def runs(self, request: Request) -> Response:
        offset = max(0, _int(request.query_params.get("offset"), 0))
        agent = _name(request, "agent")
        runs = await self.store.list_runs(agent, limit=RUNS_PAGE + 1, offset=offset)
        return self.page("runs.html", runs=runs_page(runs, offset, RUNS_PAGE, agent))

    async def agents(self, request: Request) -> Response:
        filters = AgentFilters(owner=_name(request, "owner"), states=_names(request, "state"),
                               offset=max(0, _int(request.query_params.get("offset"), 0)))
        listed = await self.store.agents_listed(owner=filters.owner, statuses=filters.states,
                                                besides=self.serving.id if self.serving else None,
                                                limit=AGENTS_PAGE + 1, offset=filters.offset)
        serving = None
        if self.serving is not None and filters.keeps_serving():
            serving = serving_item(self.serving, *await self.store.agent_run_totals(self.serving.id))
        page = agents_page(listed, filters, AGENTS_PAGE, serving=serving, states=await self.store.agent_statuses())
        return self.page("agents.html", agents=page)

    async def run(self, request: Request, opened: CallPage | None = None) -> Response:
        run = await self._run(request)
        start = _int(request.query_params.get("at"))
        if start is None and opened is not None:
            start = opened.item.seq
        flow = await (self._flow(run.id, None) if start is None else self._flow_from(run.id, max(1, start)))
        return self.page("run.html", run=run, flow=flow, opened=opened, agent_href=runs_href(run.agent_id),
                         savings=run_savings_of(run), egress=await self.store.egress_counts(run.id))

    async def earlier(self, request: Request) -> Response:
        run = await self._run(request)
        after = _int(request.query_params.get("after"))
        if after is not None:
            calls = await self.store.flow_after(run.id, max(0, after), FLOW_PAGE + 1)
            page = [redact_call(c, self.redactor) for c in calls[: FLOW_PAGE]]
            flow = later_page(run.id, page, more_after=len(calls) > FLOW_PAGE)
            return self.page("_flow_items.html", flow=flow)
        flow = await self._flow(run.id, _int(request.query_params.get("before")))
        return self.page("_flow_items.html", flow=flow)

    async def call(self, request: Request) -> Response:
        call = await self._call(request)
        view = request.query_params.get("view")
        egress = await self.store.egress_of_call(call.run_id, call.call_id) if view == "metadata" else []
        opened = call_page(call, view, request.query_params.get("format"), egress, redactor=self.redactor)
        if _fragment(request):
            return self.page("_call.html", opened=opened)
        return await self.run(request, opened)

    async def log(self, request: Request) -> Response:
        call = await self._call(request)
        path = (call.meta or {}).get("log_path")
        if not isinstance(path, str) or not path:
            raise HTTPException(404, "this call has no full output log")
        run = await self._run(request)
        try:
            view = log_view(call, await self.logs.read(run.agent_id, path))
        except LogUnavailable as exc:
            view = log_view(call, None, str(exc))
        return self.page("log.html", run=run, log=view)

    async def events(self, request: Request) -> Response:
        run = await self._run(request)
        after = max(_int(request.query_params.get("after"), 0), _int(request.headers.get("last-event-id"), 0))
        return StreamingResponse(self._stream(run.id, after), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    async def _stream(self, run_id: str, after: int) -> AsyncIterator[str]:
        yield f"retry: {APP_RETRY_MS}\n\n"
        row = self.env.get_template("_item.html")
        fetch = lambda seq: self.store.flow_after(run_id, seq)
        async for call, point in call_updates(fetch, after, page=FLOW_PAGE):
            item = flow_item(redact_call(call, self.redactor))
            yield sse_message("call", row.render(item=item).strip(), point)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        detail = getattr(exc, "detail", "not found")
        return self.page("error.html", getattr(exc, "status_code", 404), message=detail)

    def routes(self) -> list[BaseRoute]:
        rewinds = [] if self.rewind is None else [rewind_route(self.store, self.rewind)]
        return [
            *rewinds,
            Route("/", self.runs, name="runs"),
            Route("/agents", self.agents, name="agents"),
            Route("/runs/{run_id}", self.run, name="run"),
            Route("/runs/{run_id}/flow", self.earlier, name="flow"),
            Route("/runs/{run_id}/calls/{seq:int}", self.call, name="call"),
            Route("/runs/{run_id}/calls/{seq:int}/log", self.log, name="log"),
            Route("/runs/{run_id}/events", self.events, name="events"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response (a plain ASGI middleware: streams stay streams)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


def create_app(store: Store, *, redactor: Redactor, logs: LogReader, extra_routes: Sequence[BaseRoute] = (),
               lock: Lock | None = None, serving: ServingAgent | None = None, rewind: Rewind | None = None,
               lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager] | None = None) -> Starlette:
    """The app over a run record. ``redactor`` holds the secret values of every agent whose
    runs it shows; ``extra_routes`` (the MCP endpoint) come first; ``lock`` puts every route, the
    extra ones too, behind ``guilds.web.endpoint_lock.EndpointLock`` (Host, Origin, token);
    ``serving``: the server's own agent, listed first on the Agents page; ``rewind``: the call
    rows' Rewind button and its route (``guilds.web.rewind``; None: neither)."""
    web = WebApp(store, redactor, logs, serving, rewind)
    middleware = [Middleware(SecurityHeaders)]
    if lock is not None:
        middleware.append(Middleware(EndpointLock, lock=lock, sessions=Sessions(store)))
    return Starlette(routes=[*extra_routes, *web.routes()], middleware=middleware, lifespan=lifespan,
                     exception_handlers={HTTPException: web.not_found})
