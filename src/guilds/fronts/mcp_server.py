"""The MCP front: one agent's code tools for MCP clients, on stdio and streamable HTTP.

A thin translation over ``Toolbox.call``; no tool logic lives here.

    build_server(toolbox, run_id=None) -> GuildsServer, an MCPServer
    run_stdio(wired)          the server on stdio (`guilds mcp` runs it behind guilds.fronts.mcp_stdio)
    http_endpoint(toolbox, ...) -> McpEndpoint                `/mcp` in `guilds serve`
    streamable_http_app(toolbox, ...) -> Starlette            the endpoint as an app of its own

Built on the SDK's high-level ``MCPServer`` (``mcp>=2.3,<3``), through its
public surface, but for one thing: ``guilds.fronts.mcp_sessions`` sits inside the
session manager (its body limit's inner handler, the sessions it holds, its handler of
a request of no session) so that any server on the record serves a session; its
tests (tests/test_mcp_sessions.py) fail if the SDK moves those:

- its tool registry (``MCPServer(tools=...)``) holds one ``ToolboxTool`` per
  tool of the toolbox's registry (``guilds.toolbox.tools``): an SDK ``Tool`` whose
  ``parameters`` are the tool's JSON Schema and
  whose ``run`` hands the client's arguments, untouched, to the toolbox. Not
  ``add_tool``/``@tool``: those derive the schema from a Python signature, and
  ``Tool.run`` validates through it (a pydantic model that turns "5" into 5);
  the toolbox checks the arguments itself and names a bad field;
- ``GuildsServer`` overrides the two public methods MCPServer's ``tools/list``
  and ``tools/call`` handlers call: ``list_tools`` (the registered tools that
  ``toolbox.tools()`` offers now) and ``call_tool`` (a name not registered
  goes to the toolbox as well, which records it and names the known tools);
- ``subscriptions=False`` (SDK 2.3): no ``subscriptions/listen``, as before;
- the transports are MCPServer's (``run_stdio_async``, ``streamable_http_app``,
  ``session_manager``); its ``lifespan`` tells the stdio runner's signal
  handling when the calls have stopped.

MCPServer adds what it always serves: empty ``prompts/list`` and
``resources/list`` (and their capabilities). Its extension interface
(``MCPServer(extensions=...)``) carries the tasks (``TasksExtension``).

Contract:

- ``tools/list`` asks ``toolbox.tools()`` at every call (the live coding
  flag): each tool as ``guilds tools --format mcp`` prints it
  (``guilds.toolbox.tools.formats.to_mcp``): its title, description, input
  schema with the optional ``run`` argument, and annotations (the tool's ``hints``).
- ``tools/call`` -> one ``Toolbox.call``: the result text as one text content
  block, ``isError`` as the toolbox says, its metadata under
  ``_meta["guilds/meta"]`` (``run``, ``seq``, ``call``, ``row``, ...). Bad
  arguments, an unknown tool, a call while coding is off, any GuildsError:
  an ``isError`` result naming what was wrong, made in ``_as_result`` only.
- Runs (``guilds.fronts.mcp_runs``): every tool takes an optional ``run`` argument,
  the handle of a run an earlier result gave (SEP-2567), checked against the
  token that made the run. Without it: stdio, the process's connection
  (``run_id``); ``_meta["guilds/run"]`` on the call; HTTP with a session
  (``Mcp-Session-Id``, the handshake era), a run derived from that id; HTTP
  without a session (the 2026-07-28 revision), the principal's current
  sessionless run (new after limits.MCP_SESSIONLESS_IDLE_SECONDS without such a call),
  named to the model in the result's first line (``mcp_runs.RUN_LINE``). No
  result carries ``structuredContent``: the tools declare no output schema,
  and a client that shows it shows it in place of the text.
- Tasks (``guilds.fronts.mcp_tasks``, the ``io.modelcontextprotocol/tasks``
  extension, on the 2026-07-28 revision for a client that declares it): a
  background ``shell`` command and a long ``code_task`` call answer with a
  task; ``tasks/get``, ``tasks/update``, ``tasks/cancel``.
- Rewind (``guilds.fronts.mcp_checkpoints``): ``guilds/rewind`` puts the
  agent's files back to before a call of one of the caller's runs.
- Traces (``guilds.observe.traces``): a call's span takes ``_meta``'s ``traceparent``
  and ``tracestate`` as its parent, else the HTTP request's headers of those names.
- Call keys: ``_meta["guilds/call-key"]`` (a string of the client's choosing, unique per
  call, at most limits.CALL_KEY_MAX_CHARS) names the call, for the token and the agent: a
  call whose key the run record already holds runs nothing and is answered that call's
  answer (``guilds.toolbox.keyed_calls``): a client whose connection broke mid-call sends it
  again, to any server on the record, and the call has run once. A key of a call of
  another run is refused, unless the server chose the run (then the answer is that run's).
- Context resets: ``_meta["guilds/context_reset"]: true`` on a call says the
  model's context was compacted or rewound before it (``Toolbox.context_reset``):
  no file_read points to a result from before that call.
- Progress: while a call runs, ``notifications/progress`` every
  limits.MCP_PROGRESS_SECONDS with the elapsed seconds, when the client sent a token.
- Cancel: the client's cancel, its disconnect, or the server's shutdown
  cancels the toolbox call once (it runs in a task of its own, so the SDK's
  repeated cancellation cannot cut its clean-up short) and waits for it,
  shielded: the spawn path stops the helper, which stops its command's
  group, and the toolbox records the call as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from .. import limits
from ..errors import BadInput, GuildsError
from ..observe.trace_context import Carrier, carried, carrier_of
from ..record.call_keys import CallKey
from ..toolbox import CallResult, Toolbox
from ..toolbox.keyed_calls import KeyOfAnotherRun
from ..toolbox.tools import TOOLS, tool_named
from ..toolbox.tools import Tool as GuildsTool
from ..toolbox.tools.formats import to_mcp
from .mcp_checkpoints import CheckpointsExtension
from .mcp_quick import INSTRUCTIONS, SERVER_EXTENSIONS, SERVER_NAME
from .mcp_quick import server_version as _version
from .mcp_runs import META_KEY, RunChoice, Runs, new_run_id, principal_of, with_run_line
from .mcp_runs import RUN_KEY as RUN_KEY  # the tests and embedders name it from here
from .mcp_sessions import SessionsOnRecord
from .mcp_tasks import TasksExtension
from .wiring import Wired, open_toolbox

log = logging.getLogger(__name__)

CONTEXT_RESET_KEY = "guilds/context_reset"
"""A request ``_meta`` key: true when the model's context was compacted or
rewound before this call (Toolbox.context_reset): no read points before it."""
CALL_KEY = "guilds/call-key"
"""A request ``_meta`` key: the call's key of the client's choosing (``guilds.toolbox.keyed_calls``)."""
CODING_OFF = "tool {name!r} is not offered: the agent's coding capability is off (agent.coding)"


ToolCall = Callable[[Context | None, str, dict[str, Any]], Awaitable[types.CallToolResult]]
"""(context, tool name, the client's arguments) -> the result: ``_Front.call``."""


class ToolboxTool(Tool):
    """One toolbox tool in MCPServer's registry.

    ``parameters`` is the tool's input schema as it is; ``run`` gives ``fn``
    the arguments exactly as the client sent them. ``fn_metadata`` is an empty
    model, never used: ``Tool.run`` would validate through it.
    """

    @classmethod
    def of(cls, tool: GuildsTool, call: ToolCall) -> ToolboxTool:
        """The tool as ``guilds tools --format mcp`` prints it (``to_mcp``)."""
        served = to_mcp(tool)
        return cls(fn=call, name=served["name"], title=served["title"], description=served["description"],
                   parameters=served["inputSchema"],
                   annotations=types.ToolAnnotations.model_validate(served["annotations"]),
                   fn_metadata=FuncMetadata(arg_model=ArgModelBase), is_async=True, context_kwarg=None)

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any],
                  convert_result: bool = False) -> types.CallToolResult:
        return await self.fn(context, self.name, arguments)


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def to_result(result: CallResult, choice: RunChoice) -> types.CallToolResult:
    """The MCP result of a toolbox call: its text, with the run line when the server chose the run.

    No ``structuredContent``: a client that has one shows it to the model in
    place of the text, and the text is the whole result.
    """
    text = with_run_line(result.text, choice.run_id) if choice.chosen else result.text
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=result.is_error,
                                _meta={META_KEY: result.meta})


Report = Callable[[float], Awaitable[None]]
"""Told the elapsed seconds while a call runs (``notifications/progress``)."""


@dataclass(frozen=True)
class Prepared:
    """A call whose run is settled: the run, the arguments for the toolbox, the context reset flag."""

    choice: RunChoice
    arguments: dict[str, Any]
    context_reset: bool
    key: CallKey | None = None


async def _quiet(elapsed: float) -> None:
    """The progress report of a call no request waits for (a task)."""


async def run_call(call: Awaitable[CallResult], report: Callable[[float], Awaitable[None]]) -> CallResult:
    """Await a toolbox call in a task of its own, reporting elapsed seconds every limits.MCP_PROGRESS_SECONDS.

    When the awaiting side is cancelled, the task is cancelled once and awaited,
    shielded, for up to limits.CALL_CANCEL_WAIT_SECONDS; then the cancellation goes on.
    """
    task = asyncio.ensure_future(call)
    started = time.monotonic()
    try:
        while not (await asyncio.wait({task}, timeout=limits.MCP_PROGRESS_SECONDS))[0]:
            await report(time.monotonic() - started)
        return task.result()
    except BaseException:
        task.cancel()
        with anyio.move_on_after(limits.CALL_CANCEL_WAIT_SECONDS, shield=True):
            await asyncio.wait({task})
        raise


class _Front:
    """A server's calls, over one toolbox; ``run_id`` fixed for a stdio connection."""

    def __init__(self, toolbox: Toolbox, run_id: str | None,
                 sessionless_idle_seconds: float = limits.MCP_SESSIONLESS_IDLE_SECONDS):
        self.toolbox = toolbox
        self.runs = Runs(toolbox.store, run_id, sessionless_idle_seconds, toolbox.settings.id)
        self.ended = asyncio.Event()
        """Set as the server's lifespan ends (``_lifespan``): every call has stopped."""

    async def call(self, context: Context | None, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        request = _request_of(context)
        return await self.call_in(request, name, arguments, functools.partial(_progress, request, name))

    async def call_in(self, request: ServerRequestContext | None, name: str, arguments: dict[str, Any],
                      report: Report) -> types.CallToolResult:
        return await _as_result(name, self._call_in(request, name, arguments, report))

    async def _call_in(self, request: ServerRequestContext | None, name: str, arguments: dict[str, Any],
                       report: Report) -> types.CallToolResult:
        if not self.toolbox.tools():
            return error_result(CODING_OFF.format(name=name))
        prepared = await self.prepare(request, arguments)
        return await self._run_prepared(request, name, prepared, report)

    async def prepare(self, request: ServerRequestContext | None, arguments: dict[str, Any]) -> Prepared:
        """The call's run (``mcp_runs``) and arguments; GuildsError naming what was wrong."""
        key = _call_key(request)
        choice, rest = await self.runs.choose(request, arguments)
        reset = (request.meta or {}).get(CONTEXT_RESET_KEY) is True if request is not None else False
        return Prepared(choice, rest, reset, key)

    async def run_prepared(self, request: ServerRequestContext | None, name: str, prepared: Prepared,
                           report: Report) -> types.CallToolResult:
        """A prepared call (a task's, ``mcp_tasks``), its failure made a result by ``_as_result``."""
        return await _as_result(name, self._run_prepared(request, name, prepared, report))

    async def _run_prepared(self, request: ServerRequestContext | None, name: str, prepared: Prepared,
                            report: Report) -> types.CallToolResult:
        choice = prepared.choice
        try:
            with carried(_trace_carrier(request)):
                try:
                    result = await run_call(self._toolbox_call(choice.run_id, name, prepared), report)
                except KeyOfAnotherRun as other:
                    if not choice.chosen:
                        raise
                    choice = RunChoice(other.held_run, True)  # the server chose the run: the key's is the one
                    result = await run_call(self._toolbox_call(choice.run_id, name, prepared), report)
        finally:
            await self.runs.ended(request, prepared.choice.run_id)
        return to_result(result, choice)

    def _toolbox_call(self, run_id: str, name: str, prepared: Prepared) -> Awaitable[CallResult]:
        return self.toolbox.call(run_id, name, prepared.arguments, context_reset=prepared.context_reset,
                                 key=prepared.key)


async def _as_result(name: str, call: Awaitable[types.CallToolResult]) -> types.CallToolResult:
    """The one place a failed call becomes an isError result: a GuildsError says what was
    wrong; anything else is logged and answered ``internal error: <type>``."""
    try:
        return await call
    except GuildsError as exc:
        return error_result(str(exc))
    except Exception as exc:
        log.exception("tool %s failed", name)
        return error_result(f"internal error: {type(exc).__name__}")


def _call_key(request: ServerRequestContext | None) -> CallKey | None:
    """The call's key (``CALL_KEY``) for its principal; None without one; BadInput when it is not a key."""
    value = (request.meta or {}).get(CALL_KEY) if request is not None else None
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= limits.CALL_KEY_MAX_CHARS:
        raise BadInput(f"_meta[{CALL_KEY!r}]: must be a string of 1 to {limits.CALL_KEY_MAX_CHARS} characters, "
                       f"unique per call, got {str(value)[:60]!r}")
    return CallKey(principal_of(request), value)


def _trace_carrier(request: ServerRequestContext | None) -> Carrier | None:
    """The W3C trace context of a call: its ``_meta``'s ``traceparent``, else its HTTP request's header."""
    if request is None:
        return None
    return carrier_of(request.meta) or carrier_of(getattr(request.request, "headers", None))


def _request_of(context: Context | None) -> ServerRequestContext | None:
    """The request a call came in; None for a direct ``call_tool`` (its Context has none and raises)."""
    try:
        return context.request_context if context is not None else None
    except ValueError:
        return None


async def _progress(request: ServerRequestContext | None, tool: str, elapsed: float) -> None:
    """Best effort: a client gone away is noticed by the transport, not here."""
    if request is None:
        return
    seconds = round(elapsed)
    try:
        await request.session.report_progress(seconds, None, f"{tool}: running for {seconds} s")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


class GuildsServer(MCPServer):
    """An MCPServer offering one toolbox's tools; see the module docstring for what it overrides.

    ``log_level="WARNING"``: MCPServer configures the root logger when it has no
    handler; at WARNING that prints what Python's last-resort handler would.
    """

    def __init__(self, toolbox: Toolbox, *, run_id: str | None = None,
                 sessionless_idle_seconds: float = limits.MCP_SESSIONLESS_IDLE_SECONDS):
        self.front = _Front(toolbox, run_id, sessionless_idle_seconds)
        self.tasks = TasksExtension(self.front)
        made = {extension.identifier: extension for extension in (self.tasks, CheckpointsExtension(toolbox))}
        if set(made) != set(SERVER_EXTENSIONS):
            raise RuntimeError(f"the extensions made {sorted(made)} are not the ones advertised early "
                               f"(mcp_quick.SERVER_EXTENSIONS) {sorted(SERVER_EXTENSIONS)}")
        super().__init__(SERVER_NAME, version=_version(), instructions=INSTRUCTIONS, log_level="WARNING",
                         subscriptions=False, lifespan=_lifespan,
                         extensions=[made[identifier] for identifier in SERVER_EXTENSIONS],
                         tools=[ToolboxTool.of(tool, self.front.call) for tool in TOOLS])

    async def list_tools(self) -> list[types.Tool]:
        """The registered tools the toolbox offers now (the live coding flag)."""
        offered = {tool.name for tool in self.front.toolbox.tools()}
        return [tool for tool in await super().list_tools() if tool.name in offered]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        """A registered tool through the registry; any other name to the toolbox, which records the call."""
        if tool_named(name) is not None:
            return await super().call_tool(name, arguments, context)
        return await self.front.call(context, name, arguments)


@contextlib.asynccontextmanager
async def _lifespan(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
    """MCPServer's lifespan, around its serving (stdio: the connection; HTTP: the session
    manager's run): it ends once every call has stopped, and says so in ``front.ended``."""
    try:
        yield {}
    finally:
        if isinstance(server, GuildsServer):  # the only server it is given
            await server.tasks.close()
            server.front.ended.set()


def build_server(toolbox: Toolbox, *, run_id: str | None = None,
                 sessionless_idle_seconds: float = limits.MCP_SESSIONLESS_IDLE_SECONDS) -> GuildsServer:
    """An MCP server offering toolbox's tools; every call goes to ``run_id`` when given."""
    return GuildsServer(toolbox, run_id=run_id, sessionless_idle_seconds=sessionless_idle_seconds)


# --- streamable HTTP ---------------------------------------------------------
@dataclass(frozen=True)
class McpEndpoint:
    """``/mcp`` for a web app: add ``route`` to its routes, enter ``lifespan()`` in its lifespan."""

    route: BaseRoute
    lifespan: Callable[[], AbstractAsyncContextManager[None]]
    """Runs the session manager; every session's calls end (cancelled) when it exits."""


def http_endpoint(toolbox: Toolbox, *, path: str = "/mcp", host: str = "127.0.0.1") -> McpEndpoint:
    """The streamable HTTP endpoint at path. host: the address served; for 127.0.0.1,
    localhost or ::1 the SDK's DNS-rebinding protection admits only local Host headers."""
    app = streamable_http_app(toolbox, path=path, host=host)
    server: GuildsServer = app.state.mcp_server
    return McpEndpoint(route=app.routes[0], lifespan=server.session_manager.run)


def streamable_http_app(toolbox: Toolbox, *, path: str = "/mcp", host: str = "127.0.0.1",
                        sessionless_idle_seconds: float = limits.MCP_SESSIONLESS_IDLE_SECONDS) -> Starlette:
    """A Starlette app serving only the endpoint at path, with its own lifespan; its sessions
    of the older handshake are kept in the run record too (``guilds.fronts.mcp_sessions``)."""
    server = build_server(toolbox, sessionless_idle_seconds=sessionless_idle_seconds)
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    SessionsOnRecord.install(server.session_manager, toolbox.store)
    app.state.mcp_server = server
    return app


# --- stdio ---------------------------------------------------------------------
def run_stdio(wired: Wired, before_exit: Callable[[], None] | None = None) -> None:
    """`guilds mcp`: serve the agent's tools on stdin/stdout until the client closes stdin.

    ``wired`` comes from ``guilds.fronts.wiring.resolve`` (settings, data folder,
    environment, overrides), as for every front. SIGTERM, SIGINT and SIGHUP
    end the server as a closed stdin does: running calls are cancelled, their
    commands stopped and the calls recorded. Nothing but MCP messages is
    written to stdout. ``before_exit``: called on a signal once the calls have
    stopped, before the process ends (the stdio relay forwards what is left).
    """
    anyio.run(serve_stdio, wired, before_exit)


async def serve_stdio(wired: Wired, before_exit: Callable[[], None] | None = None) -> None:
    async with open_toolbox(wired) as toolbox:
        await serve_streams(build_server(toolbox, run_id=new_run_id()), before_exit)


async def serve_streams(server: GuildsServer, before_exit: Callable[[], None] | None = None) -> None:
    """Run server on this process's stdio (MCPServer's runner) until EOF, SIGTERM, SIGINT or SIGHUP.

    On a signal the server is cancelled; once its lifespan has ended (its
    running calls stopped and recorded) the process ends by that signal: the
    runner cannot return before the client's EOF, as the SDK's stdin reader
    sits in a thread that only EOF releases.
    """
    async with anyio.create_task_group() as tg:
        tg.start_soon(_end_on_signal, tg.cancel_scope, server.front.ended, before_exit)
        await server.run_stdio_async()
        tg.cancel_scope.cancel()


async def _end_on_signal(scope: anyio.CancelScope, ended: asyncio.Event,
                         before_exit: Callable[[], None] | None) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        signum = await anext(signals)
    scope.cancel()
    with anyio.move_on_after(limits.STDIO_STOP_WAIT_SECONDS, shield=True):
        await ended.wait()
    if before_exit is not None:
        before_exit()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
