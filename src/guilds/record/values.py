"""The run record's value types, as the store hands them out.

The store keeps a call's result in the parts the pipeline made: the body
(redacted, capped, ending with the cut mark when cut), ``cut``, and
``remaining``, the trailer's count; and the call's fields (its id, tool, run,
seq, start, duration and row) once, as columns, apart from the tool's own
metadata. A ``CallRecord`` read back holds both: ``body`` and ``remaining``
apart, and ``text`` and ``meta`` joined as the call's answer carried them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Container, Mapping

from ..config.checks import is_safe_name

TRAILER = "remaining_tool_calls: {n}"
"""The answer's last line: the run's calls left after this one."""
CALL_FIELDS = ("call", "tool", "run", "seq", "started_at", "duration_ms", "row")
"""The metadata keys a call's answer carries beside the tool's own, from the record's columns."""


def with_trailer(text: str, remaining: int) -> str:
    """The text as the model gets it: the trailer on a line of its own after the body."""
    sep = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{sep}{TRAILER.format(n=remaining)}"


def answer_bytes(body_bytes: int, last_char: str, remaining: int | None) -> int:
    """The UTF-8 size of answer_text(body, remaining), from the body's size and its last character."""
    if remaining is None:
        return body_bytes
    sep = 0 if body_bytes == 0 or last_char == "\n" else 1
    return body_bytes + sep + len(TRAILER.format(n=remaining))


def answer_text(body: str | None, remaining: int | None) -> str | None:
    """The result as the model got it: the body with its trailer when it has one; None while running."""
    return with_trailer(body, remaining) if body is not None and remaining is not None else body


def count(meta: Mapping[str, Any] | None, key: str) -> int:
    """A count the tool put in its metadata: an int above 0, else 0 (a bool is not a count)."""
    value = (meta or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class Savings:
    """What calls returned and what shaping saved on them: one call's (``call_savings``),
    or a run's together (its ``RunRecord.savings``, kept as the run's counters)."""

    returned: int = 0
    """Bytes of the result text as the model got it (UTF-8, trailer included)."""
    elided: int = 0
    pointer_saved: int = 0
    secrets: int = 0

    def amounts(self) -> tuple[int, int, int, int]:
        """The four in the order of ``schema.SAVINGS_COLUMNS`` (``dataclasses.astuple`` deep-copies)."""
        return self.returned, self.elided, self.pointer_saved, self.secrets

    def __add__(self, other: Savings) -> Savings:
        return Savings(self.returned + other.returned, self.elided + other.elided,
                       self.pointer_saved + other.pointer_saved, self.secrets + other.secrets)

    def __sub__(self, other: Savings) -> Savings:
        return Savings(self.returned - other.returned, self.elided - other.elided,
                       self.pointer_saved - other.pointer_saved, self.secrets - other.secrets)


def call_savings(text: str | None, meta: Mapping[str, Any] | None) -> Savings:
    """One call's amounts from its answer text (``answer_text``) and metadata; nothing while running."""
    if text is None:
        return Savings()
    return Savings(len(text.encode("utf-8", "surrogateescape")), count(meta, "bytes_elided"),
                   count(meta, "pointer_bytes_saved"), count(meta, "secrets_redacted"))


def call_fields(call_id: str, tool: str, run_id: str, seq: int, started_at: datetime,
                duration_ms: int, row: str) -> dict[str, Any]:
    """The call's own metadata keys (``CALL_FIELDS``), as its answer carries them."""
    return {"call": call_id, "tool": tool, "run": run_id, "seq": seq,
            "started_at": started_at.isoformat(timespec="milliseconds"), "duration_ms": duration_ms, "row": row}


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive: they were written in UTC."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _utc_set(value: datetime) -> datetime:
    """_utc of a column that is never NULL."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@dataclass(frozen=True)
class Slot:
    """What begin_call gives a call: its seq and its place in the budget."""

    seq: int
    used: int
    """Calls of the run counted against the budget, this one included when admitted."""
    admitted: bool
    """False: the run had no calls left; the call runs nothing."""


@dataclass(frozen=True)
class RunRecord:
    id: str
    agent_id: str
    created_at: datetime
    updated_at: datetime
    calls: int
    used_calls: int
    savings: Savings = Savings()
    """The totals of the run's finished calls, kept up to date with each call's end."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> RunRecord:
        return cls(
            id=row["id"], agent_id=row["agent_id"], created_at=_utc_set(row["created_at"]),
            updated_at=_utc_set(row["updated_at"]), calls=row["next_seq"], used_calls=row["used_calls"],
            savings=Savings(row["returned_bytes"], row["elided_bytes"], row["pointer_saved_bytes"],
                            row["secrets_redacted"]),
        )


@dataclass(frozen=True)
class CallRecord:
    run_id: str
    seq: int
    call_id: str
    tool: str
    args: Any
    text: str | None
    is_error: bool
    meta: dict | None
    cut: bool
    counted: bool
    status: str
    """running (no result yet), done, cancelled (stopped midway; an error result), or lost
    (its process ended before it finished; an error result)."""
    started_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    row: str | None
    body: str | None = None
    """The result without its trailer, as the record keeps it; None while running."""
    remaining: int | None = None
    """The trailer's count; None while running."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> CallRecord:
        """A call from its columns: ``text`` is the body column, joined here with the trailer."""
        values = {name: row[name] for name in cls.__dataclass_fields__ if name != "body"}
        values["started_at"] = _utc(values["started_at"])
        values["finished_at"] = _utc(values["finished_at"])
        values["body"], remaining = values["text"], values["remaining"]
        values["text"] = answer_text(values["text"], remaining)  # a flow row selects no text but code_task's
        if remaining is not None:
            values["meta"] = {**(values["meta"] or {}), **call_fields(
                values["call_id"], values["tool"], values["run_id"], values["seq"], values["started_at"],
                values["duration_ms"], values["row"])}
        return cls(**values)

    @property
    def trailer(self) -> str:
        """The answer's trailer line; "" while running."""
        return "" if self.remaining is None else TRAILER.format(n=self.remaining)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _tagged(decision: dict[str, Any]) -> tuple[str, str] | None:
    """The run and call a decision's tag names (``<run id>/<call id>``), or None."""
    tag = decision.get("tag")
    run, _, call = (tag if isinstance(tag, str) else "").partition("/")
    return (run, call) if is_safe_name(run) and is_safe_name(call) else None


def tagged_runs(decisions: list[dict[str, Any]]) -> set[str]:
    """The runs the decisions' tags name."""
    return {tagged[0] for tagged in map(_tagged, decisions) if tagged is not None}


def decision_rows(decisions: list[dict[str, Any]], run_id: str, call_id: str,
                  own_runs: Container[str] | None = None) -> list[dict[str, Any]]:
    """The egress proxy's decisions (its JSON lines) as ``egress`` rows: each under the
    run and call its tag names (``<run id>/<call id>``, the proxy user of the command's
    proxy variables) when that run is in own_runs (the runs of the proxy's agent; None:
    any run), else under run_id and call_id (the call whose end reads them). A command
    names its proxy user itself: own_runs keeps it from writing into another agent's run."""
    rows = []
    for d in decisions:
        tagged = _tagged(d)
        run, call = tagged if tagged is not None and (own_runs is None or tagged[0] in own_runs) \
            else (run_id, call_id)
        at = d.get("time")
        rows.append({
            "run_id": run, "call_id": call,
            "at": float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else 0.0,
            "host": str(d.get("host", ""))[:255], "port": _count(d.get("port")),
            "allowed": d.get("allowed") is True, "reason": str(d.get("reason", ""))[:1000],
            "bytes_up": _count(d.get("bytes_up")), "bytes_down": _count(d.get("bytes_down")),
        })
    return rows
