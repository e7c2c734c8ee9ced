"""The run record's value types, as the store hands them out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive: they were written in UTC."""
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


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

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "RunRecord":
        return cls(
            id=row["id"], agent_id=row["agent_id"], created_at=_utc(row["created_at"]),
            updated_at=_utc(row["updated_at"]), calls=row["next_seq"], used_calls=row["used_calls"],
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

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "CallRecord":
        values = {name: row[name] for name in cls.__dataclass_fields__}
        values["started_at"] = _utc(values["started_at"])
        values["finished_at"] = _utc(values["finished_at"])
        return cls(**values)
