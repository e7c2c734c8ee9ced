"""Tasks (SEP-2663, ``io.modelcontextprotocol/tasks``) as an extension of the SDK's own kind.

The SDK this front pins (``mcp`` 2.3) binds extension methods and wraps
``tools/call`` (``mcp.server.extension``) but serves no ``tasks/*``:
``TasksExtension`` is such an extension, so the SDK's own can take its place
once it has one. Only on the 2026-07-28 revision, only for a request whose
``_meta`` client capabilities declare the extension; every other call is
answered as before.

Which calls become tasks (the server decides, as the extension says; each
tool says which of its calls do, ``Tool.task``):

- ``shell`` with ``background: true`` (``TASK_COMMAND``): the command starts as always (a
  recorded call, ``started b1 …``), and the answer is a task that follows the
  command: ``working`` while it runs, ``statusMessage`` its state and the last
  lines of its log; ``completed`` once it ended, its result what
  ``shell_status`` with its id says (state, exit code, the log's end);
- ``code_task`` still running after MCP_TASK_AFTER_SECONDS (``TASK_CALL``): the call goes on
  unattached to the request (a client that goes away leaves it running), and
  ``completed`` carries its result, exactly the ``tools/call`` result it would
  have had.

``tasks/get`` reads the task's state (its row in the run record's ``tasks``
table, and for a command the sandbox's own record of it); ``tasks/cancel`` stops
the command's process group (``shell_status`` stop) or cancels the code_task
call (its helper stops the harness's group; the call is recorded
``cancelled``), through any server on the run record: a code_task call another
server runs is marked in its row (``cancel_asked``), which that server reads every
MCP_TASK_CANCEL_ASKED_SECONDS while the call runs, and cancels it; ``tasks/update``
acknowledges (no task of guilds asks for input). A task is its principal's (the token that made it): another's task id
is unknown to it (-32602), as is an id never made. A client that did not
declare the extension gets -32021; over HTTP, a ``Mcp-Name`` header other
than the task id gets -32020 (HTTP 400).

A task outlives its request, not its process: a server that stops (or dies)
while a code_task task runs leaves its row ``working`` under an owner that is
gone, and the next ``tasks/get`` says ``failed``, "lost", with a -32603 error.
A background command is the sandbox's and outlives the server: its task goes
on being followed by the next process. A command's task names it by its id and
the id of the call that started it (``background_call``): ids begin again at b1
in a replaced sandbox, and the helper answers ``ended``, reading and signalling
nothing, for a bN that call did not start. A cancelled command's task becomes
``cancelled`` only once the command is known gone; a stop that cannot reach
the sandbox, or leaves the command running, is an error (-32603) and the task
stays ``working``. ``ttlMs`` is null: a task is kept as
long as the run record.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from .. import limits
from ..errors import GuildsError, RecordError
from ..record.owners import LOST
from ..toolbox import Toolbox
from ..toolbox.background_read import background_state
from ..toolbox.tools import TASK_CALL, TASK_COMMAND, tool_named
from .mcp_quick import TASKS_EXTENSION
from .mcp_runs import META_KEY, principal_of

log = logging.getLogger(__name__)

POLL_INTERVAL_MS = round(limits.MCP_TASK_POLL_SECONDS * 1000)
RUNNING_STATES = ("running", "stopping")
"""A background command's states while its task is working."""
NOT_FOUND = "Failed to retrieve task: Task not found"
LOST_MESSAGE = f"lost: {LOST}"
UNNAMED_COMMAND = "unrecorded"
"""What a command's task made before tasks kept the starting call asks by: no call has
this id (call ids are ``c`` and hex), so the command reads ``ended``."""
MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] = Field(default_factory=dict)


class Front(Protocol):
    """What the tasks need of the MCP front (guilds.fronts.mcp_server._Front)."""

    toolbox: Toolbox

    async def prepare(self, request: ServerRequestContext | None, arguments: dict[str, Any]) -> Any: ...

    async def run_prepared(self, request: ServerRequestContext | None, name: str, prepared: Any,
                           report: Callable[[float], Awaitable[None]]) -> types.CallToolResult: ...


def new_task_id() -> str:
    """256 random bits: a task id cannot be guessed."""
    return "task-" + secrets.token_urlsafe(32)


def _iso(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat().replace("+00:00", "Z")


def wire_task(row: dict[str, Any]) -> dict[str, Any]:
    """A task row as the extension's (detailed) Task: its result or error inlined when it has one."""
    task: dict[str, Any] = {"taskId": row["id"], "status": row["status"], "createdAt": _iso(row["created_at"]),
                            "lastUpdatedAt": _iso(row["updated_at"]), "ttlMs": None,
                            "pollIntervalMs": POLL_INTERVAL_MS}
    if row.get("status_message"):
        task["statusMessage"] = row["status_message"]
    if row["status"] == "completed":
        task["result"] = row["result"]
    elif row["status"] == "failed":
        task["error"] = row["result"]
    return task


def dump(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def _quiet(elapsed: float) -> None:
    """A task's call reports no progress: no request waits for it."""


async def _awaited(call: asyncio.Future, timeout: float | None = None) -> bool:
    """Wait for call up to timeout; True if it is done. Cancelled meanwhile: the call is
    cancelled too and waited for, shielded, for up to limits.CALL_CANCEL_WAIT_SECONDS."""
    try:
        done, _ = await asyncio.wait({call}, timeout=timeout)
        return bool(done)
    except BaseException:
        call.cancel()
        with anyio.move_on_after(limits.CALL_CANCEL_WAIT_SECONDS, shield=True):
            await asyncio.wait({call})
        raise


class TasksExtension(Extension):
    """``tasks/get``, ``tasks/update``, ``tasks/cancel``, and the ``tools/call`` wrapper that makes tasks."""

    identifier = TASKS_EXTENSION

    def __init__(self, front: Front):
        self.front = front
        self.store = front.toolbox.store
        self._calls: dict[str, asyncio.Future] = {}
        """The code_task calls this process runs as tasks, by task id."""
        self._cancelled: set[str] = set()
        self._followers: set[asyncio.Task] = set()

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", types.GetTaskRequestParams, self._get, protocol_versions=MODERN),
                MethodBinding("tasks/update", UpdateTaskParams, self._update, protocol_versions=MODERN),
                MethodBinding("tasks/cancel", types.CancelTaskRequestParams, self._cancel, protocol_versions=MODERN)]

    # --- making tasks -----------------------------------------------------------------
    async def intercept_tool_call(self, params: types.CallToolRequestParams, ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        arguments = params.arguments or {}
        if not _takes_tasks(ctx) or not self.front.toolbox.tools():
            return await call_next(ctx)
        tool = tool_named(params.name)
        kind = tool.task(arguments) if tool is not None else None
        if kind == TASK_COMMAND:
            return await self._background_task(ctx, params.name, await call_next(ctx))
        if kind == TASK_CALL:
            return await self._call_task(ctx, params.name, arguments, call_next)
        return await call_next(ctx)

    async def _background_task(self, ctx: ServerRequestContext, name: str, result: HandlerResult) -> HandlerResult:
        """A started background command as a task; any other answer as it is."""
        if not isinstance(result, types.CallToolResult) or result.is_error:
            return result
        meta = (result.meta or {}).get(META_KEY, {})
        if not (isinstance(meta.get("background_id"), str) and isinstance(meta.get("call"), str)):
            return result
        text = result.content[0].text if result.content and isinstance(result.content[0], types.TextContent) else ""
        row = await self._new_row(ctx, meta["run"], name, meta["background_id"], text, meta["call"])
        return result if row is None else self._created(row, result.meta)

    async def _call_task(self, ctx: ServerRequestContext, name: str, arguments: dict[str, Any],
                         call_next: CallNext) -> HandlerResult:
        try:
            prepared = await self.front.prepare(ctx, arguments)
        except GuildsError:
            return await call_next(ctx)  # the ordinary path answers the same error
        call = asyncio.ensure_future(self.front.run_prepared(ctx, name, prepared, _quiet))
        if await _awaited(call, limits.MCP_TASK_AFTER_SECONDS):
            return call.result()
        run_id = prepared.choice.run_id
        row = await self._new_row(ctx, run_id, name, None, f"{name}: running")
        if row is None:  # no record for it: the call is answered as an ordinary one
            await _awaited(call)
            return call.result()
        self._calls[row["id"]] = call
        follower = asyncio.ensure_future(self._follow(row["id"], call))
        self._followers.add(follower)
        follower.add_done_callback(self._followers.discard)
        return self._created(row, {META_KEY: {"run": run_id, "tool": name}})

    async def _new_row(self, ctx: ServerRequestContext, run_id: str, tool: str, bid: str | None,
                       message: str, started_by: str | None = None) -> dict[str, Any] | None:
        """Record a new task (durably, before it is answered); None when the record cannot take it.
        A command's task: bid, and started_by, the id of the call that started it."""
        now = datetime.now(UTC)
        row = {"id": new_task_id(), "run_id": run_id, "agent_id": self.front.toolbox.settings.id, "tool": tool,
               "background_id": bid, "background_call": started_by, "principal": principal_of(ctx),
               "status": "working", "status_message": message, "result": None, "created_at": now, "updated_at": now}
        try:
            await self.store.create_task(**row)
        except RecordError as exc:
            log.warning("no task made: %s", exc)
            return None
        return row

    @staticmethod
    def _created(row: dict[str, Any], meta: dict[str, Any] | None) -> dict[str, Any]:
        """The CreateTaskResult, with the call's metadata (its run) in ``_meta``."""
        return {"resultType": "task", **wire_task(row), "_meta": meta}

    async def _follow(self, task_id: str, call: asyncio.Future) -> None:
        """Record the task's end once its call ends; meanwhile, cancel the call once another
        process on the run record was asked to (``tasks/cancel`` there). A call cancelled by the
        server's end leaves the task working under this process, which the next process reports lost."""
        while not (await asyncio.wait({call}, timeout=limits.MCP_TASK_CANCEL_ASKED_SECONDS))[0]:
            if await self._asked_elsewhere(task_id):
                self._cancelled.add(task_id)
                call.cancel()
                await asyncio.wait({call})
        self._calls.pop(task_id, None)
        if call.cancelled():
            if task_id in self._cancelled:
                await self._end(task_id, "cancelled", None, "cancelled at the client's request")
            return
        await self._end(task_id, "completed", dump(call.result()), None)

    async def _end(self, task_id: str, status: str, result: dict[str, Any] | None, message: str | None) -> None:
        try:
            await self.store.update_task(task_id, status=status, result=result, status_message=message,
                                         updated_at=datetime.now(UTC), owner=None)
        except RecordError as exc:
            log.warning("task %s: its end is not recorded: %s", task_id[:12], exc)

    async def close(self) -> None:
        """The server's end: cancel the task calls still running and wait, shielded, until they stopped."""
        with anyio.CancelScope(shield=True):
            for call in list(self._calls.values()):
                call.cancel()
            if self._followers:
                with anyio.move_on_after(limits.CALL_CANCEL_WAIT_SECONDS):
                    await asyncio.wait(set(self._followers))

    # --- tasks/* ----------------------------------------------------------------------
    async def _row(self, ctx: ServerRequestContext, task_id: str) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        _check_routing_header(ctx, task_id)
        row = await self.store.get_task(task_id)
        if (row is None or row["principal"] != principal_of(ctx)
                or row["agent_id"] != self.front.toolbox.settings.id):
            raise MCPError(code=types.INVALID_PARAMS, message=NOT_FOUND)
        return row

    async def _get(self, ctx: ServerRequestContext, params: types.GetTaskRequestParams) -> dict[str, Any]:
        return wire_task(await self._current(await self._row(ctx, params.task_id)))

    async def _update(self, ctx: ServerRequestContext, params: UpdateTaskParams) -> dict[str, Any]:
        await self._row(ctx, params.task_id)  # no task of guilds asks for input: nothing to take
        return {}

    async def _cancel(self, ctx: ServerRequestContext, params: types.CancelTaskRequestParams) -> dict[str, Any]:
        row = await self._current(await self._row(ctx, params.task_id))
        if row["status"] != "working":
            return {}
        if _follows_command(row):
            message = await self._stop_command(row)
            await self._end(row["id"], "cancelled", None, f"cancelled at the client's request: {message}")
        elif (call := self._calls.get(row["id"])) is not None:
            self._cancelled.add(row["id"])
            call.cancel()
        elif row["owner_alive"]:  # another server runs it: it cancels the call once it reads this
            await self.store.ask_cancel(row["id"])
        return {}

    async def _asked_elsewhere(self, task_id: str) -> bool:
        try:
            return await self.store.cancel_asked(task_id)
        except RecordError as exc:  # read again at the next interval
            log.warning("task %s: whether a cancel was asked is not read: %s", task_id[:12], exc)
            return False

    async def _current(self, row: dict[str, Any]) -> dict[str, Any]:
        """The task as it is now: a working one looked at (its command's state, its owner's life)."""
        if row["status"] != "working":
            return row
        if _follows_command(row):
            return await self._command_state(row)
        if row["owner_alive"]:
            elapsed = (datetime.now(UTC) - _aware(row["created_at"])).total_seconds()
            return {**row, "status_message": f"{row['tool']}: running for {round(elapsed)} s"}
        return await self._lost(row, LOST_MESSAGE)

    async def _lost(self, row: dict[str, Any], message: str) -> dict[str, Any]:
        """The task ended without its result: failed, with an internal error saying so."""
        error = {"code": types.INTERNAL_ERROR, "message": message}
        await self._end(row["id"], "failed", error, message)
        return {**row, "status": "failed", "result": error, "status_message": message, "updated_at": datetime.now(UTC)}

    async def _stop_command(self, row: dict[str, Any]) -> str:
        """Stop the task's command (``shell_status`` stop) and wait, up to
        MCP_TASK_CANCEL_WAIT_SECONDS, until it is gone; what the stop said. MCPError (-32603)
        when it cannot be known gone: the sandbox cannot be reached, or the command runs on."""
        state = await self._background(row, stop=True)
        said = state.get("text", "")
        deadline = asyncio.get_running_loop().time() + limits.MCP_TASK_CANCEL_WAIT_SECONDS
        while (state.get("ok") and state["meta"].get("state") == "stopping"
               and asyncio.get_running_loop().time() < deadline):
            await asyncio.sleep(limits.MCP_TASK_CANCEL_POLL_SECONDS)
            state = await self._background(row)
            said = state.get("text", "").split("\n", 1)[0] or said
        if not state.get("ok"):
            raise MCPError(code=types.INTERNAL_ERROR, message=f"not cancelled, the command may still run: "
                                                                 f"{state['error']}")
        if state["meta"].get("state") in RUNNING_STATES:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"not cancelled: {said.splitlines()[0]}")
        return said

    async def _background(self, row: dict[str, Any], stop: bool = False) -> dict[str, Any]:
        """background_state of the task's command, named by the call that started it."""
        started_by = row.get("background_call") or UNNAMED_COMMAND
        return await background_state(self.front.toolbox, row["run_id"], row["background_id"], started_by, stop=stop)

    async def _command_state(self, row: dict[str, Any]) -> dict[str, Any]:
        state = await self._background(row)
        if not state.get("ok") and state.get("unreachable"):
            return {**row, "status_message": state["error"]}
        if not state.get("ok"):  # the helper refused the request
            return await self._lost(row, f"lost: {state['error']}")
        if state["meta"].get("state") in RUNNING_STATES:
            return {**row, "status_message": state["text"]}
        meta = {**state["meta"], "run": row["run_id"], "background_id": row["background_id"]}
        result = {"content": [{"type": "text", "text": state["text"]}], "isError": False, "_meta": {META_KEY: meta}}
        await self._end(row["id"], "completed", result, None)
        return {**row, "status": "completed", "result": result, "status_message": None,
                "updated_at": datetime.now(UTC)}


def _follows_command(row: dict[str, Any]) -> bool:
    """The task follows a background command (TASK_COMMAND), not a call of this process."""
    return row["background_id"] is not None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _check_routing_header(ctx: ServerRequestContext, task_id: str) -> None:
    """Over HTTP a tasks/* request names its task in ``Mcp-Name`` too (SEP-2663); else -32020."""
    headers = getattr(ctx.request, "headers", None)
    if headers is not None and decode_header_value(headers.get(MCP_NAME_HEADER)) != task_id:
        raise MCPError(code=types.HEADER_MISMATCH,
                       message=f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter")


def _takes_tasks(ctx: ServerRequestContext) -> bool:
    """The request is of the 2026-07-28 revision and its client capabilities declare the extension."""
    if ctx.protocol_version not in MODERN:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions)
