"""The toolbox of one agent: a tool call in, the result text, is_error and metadata out.

One call, in order:

1. the run id is checked (it names files in the home): BadInput if unsafe;
2. the run record gives the call its seq and a slot in the run's budget
   (``max_tool_calls``), atomically; a call past the budget is recorded, runs
   nothing, is not counted, and gets an error result;
3. the call runs: an unknown tool or bad arguments get the helper's own
   error without a process; otherwise the tool (``guilds.toolbox.tools``)
   says what its request carries beyond the common fields (file_read the
   read ledger, code_task the agent's harness and repositories), which
   helper runs it, how long to wait, whether it may run again on a new
   resident channel, and whether its result is an error (code_task: a
   status other than ``completed``). The request goes through ``send``, the
   one door to the helper; NoAnswer becomes an error result here, and only here;
4. the pipeline: redaction, the 64 KiB cap, the ``remaining_tool_calls`` trailer;
5. the result is recorded with its metadata (the helper's, plus ``call``,
   ``tool``, ``run``, ``seq``, ``started_at``, ``duration_ms`` and ``row``,
   and what shaping saved: ``secrets_redacted``, ``pointer_bytes_saved``, see
   savings.py);
   if the record cannot take it (a full disk), the result is still returned,
   its metadata's ``not_recorded`` saying what could not be written.

Every admitted call counts against the budget, also one that failed. The
toolbox's observer (``guilds.toolbox.observer``) traces each call, times the
sandbox's start, the helper and the record, and hears of each call's end and
egress decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, AsyncContextManager, Awaitable, Callable

from guilds_code import limits as code_limits
from guilds_code.protocol import Request, RequestError
from guilds_code.redact import Redactor

from ..checkpoints.point_store import CheckpointError
from ..config.checks import is_safe_name
from ..config.settings import AgentSettings
from ..errors import BadInput, HelperFailed, NoAnswer, RecordError, SandboxError
from ..record.call_keys import CallKey, KeyHeld
from ..record.redaction import redact_meta
from ..record.rows import row_text
from ..record.store import Store
from ..record.values import Slot, call_fields, decision_rows, tagged_runs
from ..sandbox.base import Sandbox, keep_egress
from ..sandbox.helpers import CODE_HELPER
from . import transport
from .keyed_calls import KeyOfAnotherRun, held_answer
from .observer import CANCELLED as CANCELLED_OUTCOME
from .observer import ERROR, HELPER, NO_OBSERVER, OK, RECORD, SANDBOX_START, CallEnded, Observer
from .pipeline import run_pipeline
from .results import CallResult
from .savings import savings_meta
from .tools import TOOL_NAMES, TOOLS, CallSite, Tool, tool_named

if TYPE_CHECKING:
    from ..toolbox.checkpointing import AgentCheckpoints

BUDGET_REFUSED = (
    "tool call budget exhausted: this run has made all {n} of its tool calls "
    "(max_tool_calls = {n}); nothing was run"
)
CANCELLED = "the call was cancelled before it finished"
NOT_RECORDED = "not_recorded"
"""Metadata key, only when the record could not take the result (a full disk): what failed."""


@dataclass(frozen=True)
class Outcome:
    """What running a call gave, before the pipeline."""

    text: str
    is_error: bool
    meta: dict[str, Any] = field(default_factory=dict)
    pointed_bytes: int | None = None
    """A file_read pointer: the size of the earlier result it points to (the ledger's)."""


@dataclass(frozen=True)
class _Call:
    """One call in flight: who it is, and what the run record gave it."""

    run_id: str
    tool: str
    args: Any
    seq: int
    call_id: str
    started_at: datetime
    t0: float
    """time.monotonic() at the start, for duration_ms."""
    remaining: int
    """The run's calls left after this one: the trailer's N."""
    recorded_tool: str = ""
    """The tool's name as recorded: redacted once, at the call's start."""
    key: CallKey | None = None
    """The call's key (``keyed_calls``), marked sent just before its request goes to the sandbox."""


def _error(text: str) -> Outcome:
    return Outcome(text, True)


def new_call_id() -> str:
    """Unique per call, safe as a file name (the log is <call id>.log)."""
    return "c" + secrets.token_hex(6)


def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not is_safe_name(run_id):
        raise BadInput(
            f"run id: must be letters, digits, '.', '_' or '-' (at most 128, no '..'), got {run_id!r}"
        )
    return run_id


class Toolbox:
    """The five tools for one agent: its settings, its sandbox, the shared run record.

    ``coding`` is the live coding flag, asked at every ``tools()``: by default
    the flag in ``settings``; pass ``guilds.config.settings.coding_flag(path)`` to
    follow the settings file, or any callable. Secrets, repositories and the
    budget are read from ``settings`` once, when the toolbox is made. ``observer``
    hears of its calls, their stages and its sandbox (``guilds.toolbox.observer``).
    """

    def __init__(self, settings: AgentSettings, sandbox: Sandbox, store: Store, *,
                 coding: Callable[[], bool] | None = None, observer: Observer = NO_OBSERVER):
        self.settings = settings
        self.sandbox = sandbox
        self.store = store
        self._coding = coding or (lambda: settings.coding)
        self._redacted = settings.secret_values()
        self._redactor = Redactor(self._redacted)
        self._redact_env = sorted(settings.secrets)
        self._started = False
        self._start_lock = asyncio.Lock()
        self._transport = transport.Transport(sandbox, settings.transport,
                                              max_in_flight=settings.max_in_flight)
        self.observer = observer
        observer.watch(self)
        self.checkpoints: AgentCheckpoints | None = None
        """The agent's checkpoints and rewind (its home on this machine); set by ``open_toolbox``."""

    def tools(self) -> list[Tool]:
        """The tools to offer in this generation: all five while coding is on, else none."""
        return list(TOOLS) if self._coding() else []

    @property
    def redactor(self) -> Redactor:
        """The agent's secrets' redactor (its secret environment and repository tokens)."""
        return self._redactor

    def redact_also(self, values: list[str]) -> None:
        """From the next result on, values are redacted too (an E2B sandbox's header
        rules set while it runs); the earlier ones stay redacted."""
        added = [value for value in values if value not in self._redacted]
        if added:
            self._redacted = [*self._redacted, *added]
            self._redactor = Redactor(self._redacted)

    def default_cwd(self) -> str:
        """repos/<name> when the agent has exactly one repository, else the home (as the sandbox sees it)."""
        return self._cwd(self._repo_folders())

    def _cwd(self, folders: dict[str, str]) -> str:
        """default_cwd from the repositories' folders (``_repo_folders``)."""
        return next(iter(folders.values())) if len(folders) == 1 else self.sandbox.home

    @property
    def started(self) -> bool:
        """This toolbox started its sandbox (at its first call)."""
        return self._started

    def started_by_maker(self, seconds: float) -> None:
        """Say that whoever made this toolbox started its sandbox just now, in seconds: its first
        call does not start it again (each call still finds it, ``Sandbox.exec``)."""
        self._started = True
        self.observer.sandbox_started(self.settings.id, self.sandbox.name, seconds)

    async def _ensure_started(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if not self._started:
                t0 = time.monotonic()
                with self.observer.timed(SANDBOX_START):
                    await self.sandbox.start()
                self._started = True
                self.observer.sandbox_started(self.settings.id, self.sandbox.name, time.monotonic() - t0)

    async def warm(self) -> None:
        """Start the sandbox (once) and open the resident helper now (``agent.transport``
        resident or auto), so that the first call waits for neither (a warm pool's agents,
        ``guilds.agents.pool``); SandboxError when the sandbox cannot start."""
        await self._ensure_started()
        await self._transport.warm()

    async def context_reset(self, run_id: str) -> int:
        """Say that the model's context for run_id was compacted or rewound.

        From now on no file_read of the run is answered with a pointer to a
        result from before this point: the model may no longer hold that text,
        so the first read of a file after it returns content. Recorded in the
        run record, so every process serving the run follows it. Returns the
        run's last seq before the reset (0 for a run with no call yet).
        """
        check_run_id(run_id)
        return await self.store.mark_context_reset(run_id, datetime.now(timezone.utc))

    async def call(self, run_id: str, tool: str, args: Any, *, context_reset: bool = False,
                   key: CallKey | None = None) -> CallResult:
        """Run one tool call of a run through the whole pipeline, and record it.

        context_reset: the model's context was compacted or rewound just
        before this call (``context_reset`` first). A call cancelled while it
        runs is recorded as ``cancelled`` (an error), then the cancellation
        goes on; any other surprise is recorded as ``internal error: <type>``
        and raised. ``key``: a key naming the call (``keyed_calls``): a key that names
        a call already runs nothing, and is answered that call's answer once it has
        one (or the error saying it was lost); KeyOfAnotherRun when that call is of
        another run.
        """
        check_run_id(run_id)
        if context_reset:
            await self.context_reset(run_id)
        if not isinstance(tool, str):
            raise BadInput(f"tool: must be a string, got {tool!r}")
        try:
            return await self._recorded(run_id, tool, args, self._run, key)
        except KeyHeld as held:
            if key is None:
                raise
            if held.run_id != run_id:
                raise KeyOfAnotherRun(key.key, held.run_id, run_id) from None
            return await held_answer(self.store, self.settings.id, key)

    async def call_outside(self, run_id: str, tool: str, args: Any,
                           run: Callable[[str], Awaitable[Outcome]]) -> CallResult:
        """A call that runs outside the helper (a request of the E2B front), on the path of
        every call: its slot in the budget, then ``run(call_id)``, awaited only when the
        budget admits the call (past it: ``BUDGET_REFUSED``), then the pipeline and the
        record with its savings (``secrets_redacted``), its cancellation or its failure
        recorded as ``call``'s are."""
        check_run_id(run_id)
        return await self._recorded(run_id, tool, args, lambda call: run(call.call_id))

    async def _recorded(self, run_id: str, tool: str, args: Any,
                        run: Callable[[_Call], Awaitable[Outcome]], key: CallKey | None = None) -> CallResult:
        started_at, t0 = datetime.now(timezone.utc), time.monotonic()
        call_id = new_call_id()
        recorded_tool, recorded_args = redact_meta(self._redactor, [tool, args])
        with self.observer.traced(call_id, recorded_tool):
            budget = self.settings.max_tool_calls
            start = {"run_id": run_id, "agent_id": self.settings.id, "tool": recorded_tool, "args": recorded_args,
                     "call_id": call_id, "started_at": started_at, "budget": budget}
            slot = None if key is not None else self.store.begin_call_at_once(**start)  # no task needed
            cancelled = False
            if slot is None:
                slot, cancelled = await self._begin_shielded(start, key)
            call = _Call(run_id, tool, args, slot.seq, call_id, started_at, t0, max(0, budget - slot.used),
                         recorded_tool, key)
            try:
                if cancelled:
                    raise asyncio.CancelledError
                if slot.admitted:
                    outcome = await run(call)
                else:
                    outcome = _error(BUDGET_REFUSED.format(n=budget))
            except asyncio.CancelledError:
                await self._record(call, _error(CANCELLED), status="cancelled")
                raise
            except BaseException as exc:
                await self._record(call, _error(f"internal error: {type(exc).__name__}"))
                raise
            return await self._record(call, outcome)

    async def _begin_shielded(self, start: dict[str, Any], key: CallKey | None) -> tuple[Slot, bool]:
        """The call's start written in a task of its own (``Store.begin_call``): its slot, and
        whether the call was cancelled meanwhile. Its transaction goes on through a cancellation:
        the call it records is then ended as cancelled."""
        beginning = asyncio.ensure_future(self.store.begin_call(**start, key=key))
        try:
            return await asyncio.shield(beginning), False
        except asyncio.CancelledError:
            return await beginning, True

    async def _run(self, call: _Call) -> Outcome:
        tool = tool_named(call.tool)
        if tool is None:
            return _error(f"unknown tool {call.tool!r} (known: {', '.join(TOOL_NAMES)})")
        try:
            valid = tool.check(call.args)
        except RequestError as exc:
            return _error(str(exc))
        folders = self._repo_folders()
        extra = await tool.extra_fields(CallSite(call.run_id, call.seq, self.store, self.settings, folders))
        request = self.request(tool.name, call.args, run_id=call.run_id, call_id=call.call_id, seq=call.seq,
                               cwd=self._cwd(folders), max_bytes=self.settings.result_max_bytes,
                               kind=tool.request_type, **extra.fields)
        if call.key is not None:
            await self.store.mark_key_sent(self.settings.id, call.key)
        try:
            async with self._checkpointed(call, tool) as kept:
                envelope = await self.send(request, wait=tool.wait(valid), helper=tool.helper,
                                           rerunnable=tool.rerunnable(valid))
        except (NoAnswer, CheckpointError) as exc:
            return _error(str(exc))
        if not envelope["ok"]:
            return _error(envelope["error"])
        meta = {**envelope["meta"], **kept}
        return Outcome(envelope["text"], tool.failed(meta), meta, extra.pointed_bytes(meta))

    def request(self, op: str, args: Any, *, run_id: str, call_id: str, seq: int = 0, cwd: str | None = None,
                max_bytes: int = code_limits.DEFAULT_MAX_BYTES, kind: type[Request] = Request,
                **fields: Any) -> dict[str, Any]:
        """The wire request of one op for this agent, built as the helper's parser reads it
        (``guilds_code.protocol.Request``, or ``kind``, a subclass such as code_task's
        ``HarnessRequest``): the agent's id, its home, ``cwd`` (default: the home), the
        names of its secret variables; ``fields``: the type's other fields (``reads``,
        ``started_by``, ``harness``, ``repos``)."""
        home = self.sandbox.home
        return kind(op=op, args=args, run_id=run_id, agent_id=self.settings.id, call_id=call_id, home=home,
                    cwd=cwd or home, max_bytes=max_bytes, seq=seq, redact_env=self._redact_env, **fields).wire()

    async def send(self, request: dict[str, Any], *, wait: float, helper: str = CODE_HELPER,
                   rerunnable: bool = False) -> dict[str, Any]:
        """The one door to the helper: start the sandbox (once), keep its egress proxy
        running, and send ``request`` through the transport (the resident channel or a
        process, ``agent.transport``); the helper's envelope. ``rerunnable``: the request
        changes nothing, so it may run again when the resident helper died under it.

        HelperFailed and SandboxError are mapped here, once, to NoAnswer.
        """
        try:
            await self._ensure_started()
            await self._keep_egress()
            with self.observer.timed(HELPER):
                return await self._transport.call(request, wait=wait, helper=helper, rerunnable=rerunnable)
        except HelperFailed as exc:
            raise NoAnswer(exc.message, sandbox=False) from exc
        except SandboxError as exc:
            raise NoAnswer(str(exc), sandbox=True) from exc

    def _checkpointed(self, call: _Call, tool: Tool) -> AsyncContextManager[dict[str, str]]:
        """The call gate and the call's checkpoints (``guilds.checkpoints``), when the agent has
        them; it gives the ids of those taken (``checkpoint``, ``checkpoint_after``) for the metadata."""
        if self.checkpoints is None:
            return contextlib.nullcontext({})
        return self.checkpoints.around(call.run_id, call.seq, call.call_id, tool.checkpoint_moments())

    @property
    def transport(self) -> transport.Transport:
        """How this agent's calls reach the helper (``agent.transport``)."""
        return self._transport

    async def close(self) -> None:
        """End the agent's resident helper, if it runs (a later call opens it again)."""
        await self._transport.close()

    def _repo_folders(self) -> dict[str, str]:
        """Each repository's absolute folder as the sandbox sees it."""
        home = self.sandbox.home
        return {r.name: posixpath.normpath(posixpath.join(home, r.path)) for r in self.settings.repos}

    async def _record(self, call: _Call, outcome: Outcome, status: str = "done") -> CallResult:
        shaped = run_pipeline(self._redactor, outcome.text, call.remaining)
        text = shaped.text
        duration_ms = round((time.monotonic() - call.t0) * 1000)
        row = self._redactor.redact(row_text(call.tool, call.args, outcome.meta, outcome.is_error))
        tool_meta = {**redact_meta(self._redactor, outcome.meta),
                     **savings_meta(text, outcome.pointed_bytes)}
        fields = call_fields(call.call_id, call.recorded_tool, call.run_id, call.seq, call.started_at, duration_ms, row)
        meta = {**tool_meta, **fields}
        try:
            with self.observer.timed(RECORD):
                await self.store.finish_call(
                    run_id=call.run_id, seq=call.seq, text=shaped.body, is_error=outcome.is_error, meta=tool_meta,
                    cut=shaped.cut, finished_at=datetime.now(timezone.utc), duration_ms=duration_ms, row=row,
                    status=status, remaining=shaped.remaining,
                )
        except RecordError as exc:  # a full disk: the result still goes back, saying it is not recorded
            meta[NOT_RECORDED] = str(exc)
            self.observer.record_error("call")
        await self._record_egress(call)
        self._ended(call, outcome.is_error, status, NOT_RECORDED not in meta)
        return CallResult(text, outcome.is_error, meta)

    def _ended(self, call: _Call, is_error: bool, status: str, recorded: bool) -> None:
        """The observer told of a call's end: its outcome, its time, the redacted run id and tool."""
        outcome = CANCELLED_OUTCOME if status == "cancelled" else ERROR if is_error else OK
        self.observer.call_ended(CallEnded(call.call_id, self._redactor.redact(call.run_id), self.settings.id,
                                           call.recorded_tool, outcome, time.monotonic() - call.t0, recorded))

    async def _keep_egress(self) -> None:
        """agent.network a list: the sandbox's egress proxy started again if it died
        (``Egress.keep``), once before the call is sent."""
        await keep_egress(self.sandbox)

    async def _record_egress(self, call: _Call) -> None:
        await self.record_egress(self.sandbox, call.run_id, call.call_id)

    async def record_egress(self, sandbox: Sandbox, run_id: str, call_id: str) -> None:
        """agent.network a list: the sandbox's egress proxy's decisions since the last
        read, into the run record, each under the call its command named (call_id by
        default, and when the run it names is not one the record holds as this agent's: a
        command cannot write into another agent's run). A record that cannot take them loses
        them, not the call."""
        egress = sandbox.egress
        if egress is None:
            return
        decisions = await asyncio.to_thread(egress.decisions)
        self.observer.egress(decisions)
        try:
            own = await self.store.runs_of_agent(self.settings.id, tagged_runs(decisions) - {run_id})
            await self.store.add_egress(decision_rows(decisions, run_id, call_id, own | {run_id}))
        except RecordError:
            self.observer.record_error("egress")
