"""Each in-sandbox request of an E2B sandbox, recorded as a call of its run.

A command is a ``shell`` call (``{"command": ..., "e2b": {...}}``; its row
``Run <command>``, ``exit N`` or ``timed out`` as a shell call's), recorded
when it ends with its output (stdout, then stderr) redacted and capped as any
result. Every other request is a call of its own tool name (``e2b
filesystem.Stat``, ``e2b files.write``...) with its arguments. Each counts
against the agent's ``max_tool_calls`` as a tool call does: past it, the request
is refused (``resource_exhausted``) and recorded as refused. Behind the egress
proxy, a command's connections are recorded under its call when it ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...record.redaction import redact_meta
from ...record.rows import row_text
from ...sandbox.base import Sandbox
from ...toolbox import Toolbox
from ...toolbox.pipeline import run_pipeline
from ...toolbox.toolbox import new_call_id
from .connect import ConnectError

BUDGET_REFUSED = "tool call budget exhausted: this run has made all {n} of its tool calls (max_tool_calls = {n})"


@dataclass
class Open:
    """A call begun and not yet finished."""

    seq: int
    call_id: str
    tool: str
    args: Any
    t0: float
    remaining: int


class Recorder:
    def __init__(self, toolbox: Toolbox, run_id: str):
        self.toolbox, self.run_id = toolbox, run_id
        self.redactor = toolbox.redactor

    async def begin(self, tool: str, args: Any) -> Open:
        """Record the call as running; ConnectError(resource_exhausted) past the budget (recorded so)."""
        budget = self.toolbox.settings.max_tool_calls
        recorded = redact_meta(self.redactor, args)
        call_id = new_call_id()
        slot = await self.toolbox.store.begin_call(
            run_id=self.run_id, agent_id=self.toolbox.settings.id, tool=tool, args=recorded,
            call_id=call_id, started_at=datetime.now(UTC), budget=budget)
        call = Open(slot.seq, call_id, tool, recorded, time.monotonic(), max(0, budget - slot.used))
        if not slot.admitted:
            await self.finish(call, BUDGET_REFUSED.format(n=budget), is_error=True)
            raise ConnectError("resource_exhausted", BUDGET_REFUSED.format(n=budget))
        return call

    async def finish(self, call: Open, text: str, *, is_error: bool, meta: dict[str, Any] | None = None,
                     status: str = "done") -> None:
        meta = redact_meta(self.redactor, meta or {})
        shaped = run_pipeline(self.redactor, text, call.remaining)
        row = self.redactor.redact(row_text(call.tool, call.args, meta, is_error))
        await self.toolbox.store.finish_call(
            run_id=self.run_id, seq=call.seq, text=shaped.body, is_error=is_error, meta=meta, cut=shaped.cut,
            finished_at=datetime.now(UTC), duration_ms=round((time.monotonic() - call.t0) * 1000),
            row=row, status=status, remaining=shaped.remaining)

    async def egress(self, call: Open, sandbox: Sandbox) -> None:
        """The sandbox's egress decisions since the last read (agent.network a list), into the
        record: each under the call its command named (a command's: its own), else under call.
        A record that cannot take them loses them, not the call."""
        await self.toolbox.record_egress(sandbox, self.run_id, call.call_id)

    async def one(self, tool: str, args: Any, result: Any) -> Any:
        """Record one request around awaiting ``result`` (a coroutine); its answer, or its error."""
        call = await self.begin(tool, args)
        try:
            answer = await result
        except ConnectError as exc:
            await self.finish(call, str(exc), is_error=True, meta={"code": exc.code})
            raise
        except BaseException:
            await self.finish(call, "cancelled", is_error=True, status="cancelled")
            raise
        await self.finish(call, "ok", is_error=False)
        return answer
