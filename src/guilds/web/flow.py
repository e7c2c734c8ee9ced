"""A run's flow as the app shows it: pure functions of the run record, table-tested.

The product page: each call other than code_task is a row of the run's flow
on its Chat tab, with a summary of what it did; a code_task is a block of its
own. The row is the text stored with the call (``guilds.record.rows.row_text``,
computed when the call finished); a call still running has none yet and gets
the same function's text without a result.

Where the page is silent: the code_task block reads ``status``, ``diffstat``
and ``final_message`` from the call's metadata; a call without them (one
refused, say) shows its result text as the message.

Every record reaching these functions has been through ``redact_call``. The
toolbox redacts a call's tool, arguments, text and metadata once, when it
writes them; ``redact_call`` is a guard for what that could not cover: a call
recorded before a secret was added to the agent's settings, and records
written by versions that kept arguments as the model gave them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Mapping
from urllib.parse import urlencode

from guilds_code.redact import Redactor

from ..record.redaction import redact_meta
from ..record.rows import row_text
from ..record.values import CallRecord, RunRecord
from .savings_view import row_savings


def run_path(run_id: str) -> str:
    return f"/runs/{run_id}"


def call_path(run_id: str, seq: int, view: str | None = None, fmt: str | None = None) -> str:
    """A call's page, with the view and the Result's format when given."""
    query = "&".join(f"{k}={v}" for k, v in (("view", view), ("format", fmt)) if v)
    return f"/runs/{run_id}/calls/{seq}" + (f"?{query}" if query else "")


def log_url(run_id: str, seq: int) -> str:
    """A call's Full output log."""
    return f"/runs/{run_id}/calls/{seq}/log"


def redact_call(call: CallRecord, redactor: Redactor) -> CallRecord:
    """The record with every string the app could show redacted."""
    if not redactor:
        return call
    return replace(call, tool=redactor.redact(call.tool),
                   args=redact_meta(redactor, call.args), meta=redact_meta(redactor, call.meta),
                   text=None if call.text is None else redactor.redact(call.text),
                   body=None if call.body is None else redactor.redact(call.body),
                   row=None if call.row is None else redactor.redact(call.row))


def text_of(value: Any) -> str:
    """A metadata value that should be a string: itself, else empty."""
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class CodeTaskBlock:
    status: str
    diffstat: str
    message: str
    log_href: str = ""
    """The harness's event log, opened through the app's redacted log view; "" when none."""


@dataclass(frozen=True)
class FlowItem:
    seq: int
    text: str
    """The row; "Code task" for a code_task block."""
    state: str
    """running, done, error, cancelled or lost."""
    duration: str
    href: str
    task: CodeTaskBlock | None = None
    savings: str = ""
    """What shaping saved on the call (savings.row_savings); "" when nothing."""
    checkpoint: str = ""
    """The checkpoint of the home taken before the call (agent.checkpoints); "" when none."""
    rewindable: bool = False
    """A checkpoint was taken before the call: its files can go back to it (the row's Rewind button)."""


def row_of(call: CallRecord) -> str:
    """The stored row, or, while the call runs, the row of its arguments alone."""
    if call.row is not None:
        return call.row
    return row_text(call.tool, call.args, {}, False)


def running(call: CallRecord) -> bool:
    """No result yet (a call finishes "done", or "cancelled" when stopped midway)."""
    return call.status == "running"


def state_of(call: CallRecord) -> str:
    """running, done, error, cancelled, or lost (its process ended before it finished)."""
    if running(call) or call.status in ("cancelled", "lost"):
        return call.status
    return "error" if call.is_error else "done"


def duration_text(ms: int | None) -> str:
    """350 ms, 1.2 s, 95 s; empty while running."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    return f"{ms / 1000:.1f} s" if ms < 10_000 else f"{round(ms / 1000)} s"


def code_task_block(call: CallRecord) -> CodeTaskBlock:
    meta = call.meta or {}
    message = text_of(meta.get("final_message")) or (call.body or "")
    log_href = f"{call_path(call.run_id, call.seq)}/log" if meta.get("log_path") else ""
    return CodeTaskBlock(status=text_of(meta.get("status")) or state_of(call),
                         diffstat=text_of(meta.get("diffstat")), message=message, log_href=log_href)


def flow_item(call: CallRecord) -> FlowItem:
    task = code_task_block(call) if call.tool == "code_task" else None
    return FlowItem(seq=call.seq, text=row_of(call), state=state_of(call),
                    duration=duration_text(call.duration_ms), href=call_path(call.run_id, call.seq), task=task,
                    savings=row_savings(call.meta), checkpoint=checkpoint_of(call.meta),
                    rewindable=bool(text_of((call.meta or {}).get("checkpoint"))))


def checkpoint_of(meta: Mapping[str, Any] | None) -> str:
    """The call's checkpoints as the row shows them: "checkpoint k…", and "+ after k…" for code_task's end."""
    before, after = (text_of((meta or {}).get(key)) for key in ("checkpoint", "checkpoint_after"))
    shown = [f"checkpoint {before}"] if before else []
    return " ".join([*shown, f"after {after}"] if after else shown)


def resume_after(calls: list[CallRecord], after: int) -> int:
    """The seq a live stream continues after, given the calls past ``after`` in seq order:
    the last one, or just before the first still running (it will change)."""
    for call in calls:
        if running(call):
            return call.seq - 1
        after = call.seq
    return after


@dataclass(frozen=True)
class RunItem:
    id: str
    agent_id: str
    calls: int
    updated: str
    href: str
    agent_href: str = ""
    """The runs list filtered to the run's agent."""


def when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def run_item(run: RunRecord) -> RunItem:
    return RunItem(run.id, run.agent_id, run.calls, when(run.updated_at), run_path(run.id), runs_href(run.agent_id))


MAX_SEQ = 2**63 - 1
"""The largest seq the record can hold (a signed 64-bit column); a larger one names no call."""


def seq_in_range(seq: int) -> bool:
    """True for a seq that can name a call (1 to MAX_SEQ)."""
    return 1 <= seq <= MAX_SEQ


@dataclass(frozen=True)
class FlowPage:
    """A page of a run's flow: its items, the links to the pages before and after it,
    where live updates start.

    A page ends at the run's newest call (the run page's default) or, when it was
    asked to start at a seq (a jump), may stop before it: ``later_href`` then
    loads the next page, and ``events_href`` is empty, for live updates make sense
    only once the flow reaches the newest call (the browser starts them then).
    """

    items: list[FlowItem]
    earlier_href: str
    """Empty when the page starts at the run's first call."""
    events_href: str
    later_href: str = ""
    """Empty when the page ends at the run's newest call."""


def flow_page(run_id: str, calls: list[CallRecord], *, more_after: bool = False,
              start: int | None = None) -> FlowPage:
    """Calls are a run's consecutive seqs from 1, so a page starting past 1 has calls before it.
    more_after: calls follow the page's last one; start: the seq the page was asked to start
    at (used when it is empty)."""
    first = calls[0].seq if calls else (start or 1)
    earlier = f"/runs/{run_id}/flow?before={first}" if first > 1 else ""
    if more_after:
        return FlowPage([flow_item(c) for c in calls], earlier, "", f"/runs/{run_id}/flow?after={calls[-1].seq}")
    after = resume_after(calls, first - 1)
    return FlowPage([flow_item(c) for c in calls], earlier, f"/runs/{run_id}/events?after={after}")


def later_page(run_id: str, calls: list[CallRecord], *, more_after: bool) -> FlowPage:
    """The page after a page that stopped before the newest call: its items, and, when
    more follow, the link to the next one (the page before is already shown)."""
    later = f"/runs/{run_id}/flow?after={calls[-1].seq}" if more_after and calls else ""
    return FlowPage([flow_item(c) for c in calls], "", "", later)


@dataclass(frozen=True)
class RunsPage:
    items: list[RunItem]
    newer_href: str
    older_href: str
    agent: str | None = None
    """The agent whose runs these are; None: every agent's."""


def runs_href(agent: str | None = None, offset: int = 0) -> str:
    """The runs list (of one agent when given) from offset."""
    query: list[tuple[str, str | int]] = [("agent", agent)] if agent is not None else []
    query += [("offset", offset)] if offset else []
    return "/" + (f"?{urlencode(query)}" if query else "")


def runs_page(runs: list[RunRecord], offset: int, limit: int, agent: str | None = None) -> RunsPage:
    """``runs`` holds up to limit + 1 runs from offset: one more means there are older ones.
    agent: the agent they are filtered to, kept in the pages' links."""
    newer = runs_href(agent, max(0, offset - limit)) if offset > 0 else ""
    older = runs_href(agent, offset + limit) if len(runs) > limit else ""
    return RunsPage([run_item(r) for r in runs[:limit]], newer, older, agent)
