"""The toolbox of one agent: a tool call in, the result text, is_error and metadata out.

One call, in order:

1. the run id is checked (it names files in the home): BadInput if unsafe;
2. the run record gives the call its seq and a slot in the run's budget
   (``max_tool_calls``), atomically; a call past the budget is recorded, runs
   nothing, is not counted, and gets an error result;
3. the call runs: an unknown tool or bad arguments get the helper's own
   error without a process; code_task goes to guilds-harness (with the
   agent's harness and repositories), a status other than ``completed``
   being an error; the other tools go to guilds-code in the sandbox (a
   file_read carries the read ledger). HelperFailed and SandboxError become
   error results here, and only here;
4. the pipeline: redaction, the 64 KiB cap, the ``remaining_tool_calls`` trailer;
5. the result is recorded with its metadata (the helper's, plus ``call``,
   ``tool``, ``run``, ``seq``, ``started_at``, ``duration_ms`` and ``row``,
   and what shaping saved: ``secrets_redacted``, ``pointer_bytes_saved``, see
   savings.py);
   if the record cannot take it (a full disk), the result is still returned,
   its metadata's ``not_recorded`` saying what could not be written.

Every admitted call counts against the budget, also one that failed.
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from guilds_code.protocol import RequestError
from guilds_code.redact import Redactor

from ..config.checks import is_safe_name
from ..config.settings import AgentSettings
from ..errors import BadInput, HelperFailed, RecordError, SandboxError
from ..record.rows import row_text
from ..record.store import Store
from ..record.values import call_fields, decision_rows
from ..sandbox.base import Sandbox
from ..sandbox.helpers import HARNESS_HELPER
from . import transport
from .ledger import Ledger, read_ledger
from .pipeline import redact_meta, run_pipeline
from .savings import savings_meta
from .tools import TOOL_NAMES, ToolSpec, tool_specs

BUDGET_REFUSED = (
    "tool call budget exhausted: this run has made all {n} of its tool calls "
    "(max_tool_calls = {n}); nothing was run"
)
CANCELLED = "the call was cancelled before it finished"
NOT_RECORDED = "not_recorded"
"""Metadata key, only when the record could not take the result (a full disk): what failed."""
_SPECS = tuple(tool_specs())
_BY_NAME = {spec.name: spec for spec in _SPECS}


@dataclass(frozen=True)
class CallResult:
    text: str
    is_error: bool
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Outcome:
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


def _error(text: str) -> _Outcome:
    return _Outcome(text, True)


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
    budget are read from ``settings`` once, when the toolbox is made.
    """

    def __init__(self, settings: AgentSettings, sandbox: Sandbox, store: Store, *,
                 coding: Callable[[], bool] | None = None):
        self.settings = settings
        self.sandbox = sandbox
        self.store = store
        self._coding = coding or (lambda: settings.coding)
        self._redactor = Redactor(settings.secret_values())
        self._redact_env = sorted(settings.secrets)
        self._started = False
        self._start_lock = asyncio.Lock()
        self._transport = transport.Transport(sandbox, settings.transport,
                                              max_in_flight=settings.max_in_flight)

    def tools(self) -> list[ToolSpec]:
        """The tools to offer in this generation: all five while coding is on, else none."""
        return list(_SPECS) if self._coding() else []

    def default_cwd(self) -> str:
        """repos/<name> when the agent has exactly one repository, else the home (as the sandbox sees it)."""
        folders = self._repo_folders()
        return next(iter(folders.values())) if len(folders) == 1 else self.sandbox.home

    async def _ensure_started(self) -> None:
        if self._started:
            return
        async with self._start_lock:
            if not self._started:
                await self.sandbox.start()
                self._started = True

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

    async def call(self, run_id: str, tool: str, args: Any, *, context_reset: bool = False) -> CallResult:
        """Run one tool call of a run through the whole pipeline, and record it.

        context_reset: the model's context was compacted or rewound just
        before this call (``context_reset`` first). A call cancelled while it
        runs is recorded as ``cancelled`` (an error), then the cancellation
        goes on; any other surprise is recorded as ``internal error: <type>``
        and raised.
        """
        check_run_id(run_id)
        if context_reset:
            await self.context_reset(run_id)
        if not isinstance(tool, str):
            raise BadInput(f"tool: must be a string, got {tool!r}")
        started_at, t0 = datetime.now(timezone.utc), time.monotonic()
        call_id = new_call_id()
        budget = self.settings.max_tool_calls
        recorded_tool, recorded_args = redact_meta(self._redactor, [tool, args])
        beginning = asyncio.ensure_future(self.store.begin_call(
            run_id=run_id, agent_id=self.settings.id, tool=recorded_tool, args=recorded_args,
            call_id=call_id, started_at=started_at, budget=budget))
        try:
            slot = await asyncio.shield(beginning)
        except asyncio.CancelledError:  # its transaction goes on: the call it records is ended as cancelled
            slot = await beginning
            cancelled = True
        else:
            cancelled = False
        call = _Call(run_id, tool, args, slot.seq, call_id, started_at, t0, max(0, budget - slot.used), recorded_tool)
        try:
            if cancelled:
                raise asyncio.CancelledError
            if slot.admitted:
                outcome = await self._run(call)
            else:
                outcome = _error(BUDGET_REFUSED.format(n=budget))
        except asyncio.CancelledError:
            await self._record(call, _error(CANCELLED), status="cancelled")
            raise
        except BaseException as exc:
            await self._record(call, _error(f"internal error: {type(exc).__name__}"))
            raise
        return await self._record(call, outcome)

    async def _run(self, call: _Call) -> _Outcome:
        tool, spec = call.tool, _BY_NAME.get(call.tool)
        if spec is None:
            return _error(f"unknown tool {tool!r} (known: {', '.join(TOOL_NAMES)})")
        try:
            valid = spec.checked(call.args)
        except RequestError as exc:
            return _error(str(exc))
        request = self._request(call)
        ledger = Ledger()
        if tool == "file_read":
            ledger = await read_ledger(self.store, call.run_id, call.seq)
            request["reads"] = ledger.entries
        if spec.helper == HARNESS_HELPER:  # the harness's request also names the harness and the repositories
            request.update(harness=self.settings.harness, repos=self._repo_folders())
        try:
            await self._ensure_started()
            await self._keep_egress()
            envelope = await self._transport.call(request, wait=transport.wait_for(tool, valid), helper=spec.helper)
        except HelperFailed as exc:
            return _error(exc.message)
        except SandboxError as exc:
            return _error(f"sandbox error: {exc}")
        if not envelope["ok"]:
            return _error(envelope["error"])
        status = spec.error_unless_status
        failed = status is not None and envelope["meta"].get("status") != status
        pointed = ledger.size_of(envelope["meta"].get("repeat_of"))
        return _Outcome(envelope["text"], failed, envelope["meta"], pointed)

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

    def _request(self, call: _Call) -> dict[str, Any]:
        return {
            "op": call.tool, "args": call.args, "run_id": call.run_id, "agent_id": self.settings.id,
            "call_id": call.call_id, "cwd": self.default_cwd(), "home": self.sandbox.home,
            "max_bytes": self.settings.result_max_bytes, "seq": call.seq, "redact_env": self._redact_env,
        }

    async def _record(self, call: _Call, outcome: _Outcome, status: str = "done") -> CallResult:
        shaped = run_pipeline(self._redactor, outcome.text, call.remaining)
        duration_ms = round((time.monotonic() - call.t0) * 1000)
        row = self._redactor.redact(row_text(call.tool, call.args, outcome.meta, outcome.is_error))
        tool_meta = {**redact_meta(self._redactor, outcome.meta),
                     **savings_meta(shaped.text, outcome.pointed_bytes)}
        fields = call_fields(call.call_id, call.recorded_tool, call.run_id, call.seq, call.started_at, duration_ms, row)
        meta = {**tool_meta, **fields}
        try:
            await self.store.finish_call(
                run_id=call.run_id, seq=call.seq, text=shaped.body, is_error=outcome.is_error, meta=tool_meta,
                cut=shaped.cut, finished_at=datetime.now(timezone.utc), duration_ms=duration_ms, row=row,
                status=status, remaining=shaped.remaining,
            )
        except RecordError as exc:  # a full disk: the result still goes back, saying it is not recorded
            meta[NOT_RECORDED] = str(exc)
        await self._record_egress(call)
        return CallResult(shaped.text, outcome.is_error, meta)

    async def _keep_egress(self) -> None:
        """agent.network a list: the sandbox's egress proxy started again if it died
        (``keep_egress``, a sandbox's optional method), before the call is sent."""
        keep = getattr(self.sandbox, "keep_egress", None)
        if keep is not None:
            await keep()

    async def _record_egress(self, call: _Call) -> None:
        """agent.network a list: the egress proxy's decisions since the last call's end,
        into the run record, each under the call its command named (that call's own
        by default). A record that cannot take them loses them, not the call."""
        files = getattr(self.sandbox, "egress", None)
        if files is None:
            return
        from ..sandbox.egress_process import read_decisions

        rows = decision_rows(await asyncio.to_thread(read_decisions, files), call.run_id, call.call_id)
        try:
            await self.store.add_egress(rows)
        except RecordError:
            pass
