"""The run record: every call of every run, in order, in a real database.

SQLAlchemy 2 async, one engine per Store (make one Store per process). SQLite
(``sqlite+aiosqlite``) by default, at ``<data>/guilds.db``; PostgreSQL
(``postgresql+asyncpg``) by changing the URL ($GUILDS_DATABASE_URL).

Tables:

    runs   id (the run id), agent_id, created_at, updated_at,
           next_seq (the last seq given out), used_calls (calls counted against
           the budget), admitted_seq (the last seq admitted within the budget)
    calls  run_id + seq, call_id, tool, args, text, is_error, meta, cut (by the
           pipeline's cap), counted (against the budget), status (running, done,
           or cancelled),
           started_at, finished_at, duration_ms, row
    context_marks  run_id, after_seq, at: the run's model context was compacted
           or rewound after its call after_seq

Seqs and budget slots are given out by one ``INSERT INTO runs ... ON CONFLICT DO
UPDATE ... RETURNING`` in the transaction that inserts the call: atomic on PostgreSQL (a row lock) and on
SQLite (one writer), so concurrent calls of one run, from one process or many,
never share a seq and never pass the budget. On SQLite the writes of one
process also queue on an asyncio lock, so they never wait on SQLITE_BUSY.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .errors import BadInput
from .records import CallRecord, RunRecord, Slot

DATABASE_URL_ENV = "GUILDS_DATABASE_URL"
DB_FILE = "guilds.db"
DEFAULT_PAGE = 100
SQLITE_BUSY_MS = 10_000
"""Another process writing the same SQLite file: wait this long for it."""

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TS = sa.DateTime(timezone=True)
metadata = sa.MetaData()
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False, index=True),
    sa.Column("created_at", _TS, nullable=False),
    sa.Column("updated_at", _TS, nullable=False, index=True),
    sa.Column("next_seq", sa.Integer, nullable=False, default=0),
    sa.Column("used_calls", sa.Integer, nullable=False, default=0),
    sa.Column("admitted_seq", sa.Integer, nullable=False, default=0),
)
calls = sa.Table(
    "calls", metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("tool", sa.Text, nullable=False),  # as the model named it: any length
    sa.Column("args", _JSON, nullable=False),
    sa.Column("text", sa.Text),
    sa.Column("is_error", sa.Boolean, nullable=False, default=False),
    sa.Column("meta", _JSON),
    sa.Column("cut", sa.Boolean, nullable=False, default=False),
    sa.Column("counted", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("started_at", _TS, nullable=False),
    sa.Column("finished_at", _TS),
    sa.Column("duration_ms", sa.Integer),
    sa.Column("row", sa.Text),
)
context_marks = sa.Table(
    "context_marks", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False, index=True),
    sa.Column("after_seq", sa.Integer, nullable=False),
    sa.Column("at", _TS, nullable=False),
)
"""Where a run's model context was compacted or rewound: no file_read points to
a call at or before after_seq (toolbox/ledger.py)."""


_INSERT_CALL = sa.insert(calls)
_FINISH_CALL = sa.update(calls).where(
    calls.c.run_id == sa.bindparam("k_run_id"), calls.c.seq == sa.bindparam("k_seq")
)
_FILE_READS = (
    sa.select(calls.c.seq, calls.c.meta)
    .where(calls.c.run_id == sa.bindparam("run_id"), calls.c.tool == "file_read", calls.c.status == "done",
           calls.c.is_error.is_(False), calls.c.cut.is_(False), calls.c.seq < sa.bindparam("before_seq"))
    .order_by(calls.c.seq)
)
"""Built once: building it per call (and its cache key) was a third of the ledger's query time."""


def _allocate_statement(dialect: Any) -> Any:
    """Make the run if new and take the next seq and, within the budget, a slot: one statement.

    Under ON CONFLICT ... SET the right-hand sides read the row as it was, so
    admitted_seq == next_seq afterwards exactly when this call got a slot.
    """
    now, budget = sa.bindparam("now"), sa.bindparam("budget")
    insert = dialect.insert(runs).values(
        id=sa.bindparam("run_id"), agent_id=sa.bindparam("agent_id"), created_at=now,
        updated_at=now, next_seq=1, used_calls=1, admitted_seq=1,
    )
    has_room = runs.c.used_calls < budget
    return insert.on_conflict_do_update(index_elements=["id"], set_={
        "next_seq": runs.c.next_seq + 1,
        "updated_at": insert.excluded.updated_at,
        "used_calls": sa.case((has_room, runs.c.used_calls + 1), else_=runs.c.used_calls),
        "admitted_seq": sa.case((has_room, runs.c.next_seq + 1), else_=runs.c.admitted_seq),
    }).returning(runs.c.agent_id, runs.c.next_seq, runs.c.used_calls, runs.c.admitted_seq)


def database_url(data: Path, env: Mapping[str, str]) -> str:
    """$GUILDS_DATABASE_URL, else SQLite at <data>/guilds.db."""
    return normalize_url(env.get(DATABASE_URL_ENV) or f"sqlite:///{Path(data) / DB_FILE}")


def normalize_url(url: str) -> str:
    """Give a plain sqlite:// or postgresql:// URL its async driver."""
    for plain, driver in (("sqlite://", "sqlite+aiosqlite://"), ("postgresql://", "postgresql+asyncpg://"),
                          ("postgres://", "postgresql+asyncpg://")):
        if url.startswith(plain):
            return driver + url[len(plain):]
    return url


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", f"busy_timeout={SQLITE_BUSY_MS}", "foreign_keys=ON"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


class Store:
    """The run record. ``async with Store(url) as store`` makes the tables and disposes the engine."""

    def __init__(self, url: str):
        url = normalize_url(url)
        self.sqlite = url.startswith("sqlite")
        # SQLite: every write commits in engine.begin() and a read opens no
        # transaction, so the pool's rollback on check-in is one round trip for nothing.
        extra = {"pool_reset_on_return": None} if self.sqlite else {}
        self.engine: AsyncEngine = create_async_engine(url, **extra)
        if self.sqlite:
            sa.event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self._write_lock = asyncio.Lock() if self.sqlite else None
        self._allocate = _allocate_statement(sqlite if self.sqlite else postgresql)

    async def __aenter__(self) -> "Store":
        await self.setup()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def setup(self) -> None:
        """Create the tables where missing (idempotent)."""
        async with self.engine.begin() as conn:
            await conn.run_sync(metadata.create_all)

    async def close(self) -> None:
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def _writing(self) -> AsyncIterator[sa.ext.asyncio.AsyncConnection]:
        lock = self._write_lock or contextlib.nullcontext()
        async with lock, self.engine.begin() as conn:
            yield conn

    async def begin_call(self, *, run_id: str, agent_id: str, tool: str, args: Any, call_id: str,
                         started_at: datetime, budget: int) -> Slot:
        """Give the call its seq and a slot within the run's budget; record it as running.

        A call past the budget gets ``admitted=False``: it is recorded, not counted.
        """
        async with self._writing() as conn:
            allocated = await conn.execute(self._allocate, {
                "run_id": run_id, "agent_id": agent_id, "now": started_at, "budget": budget,
            })
            owner, seq, used, admitted_seq = allocated.one()
            if owner != agent_id:
                raise BadInput(f"run {run_id!r} belongs to agent {owner!r}, not {agent_id!r}")
            admitted = admitted_seq == seq
            await conn.execute(_INSERT_CALL, {
                "run_id": run_id, "seq": seq, "call_id": call_id, "tool": tool, "args": args,
                "counted": admitted, "status": "running", "started_at": started_at,
                "is_error": False, "cut": False,
            })
        return Slot(seq=seq, used=used, admitted=admitted)

    async def finish_call(self, *, run_id: str, seq: int, text: str, is_error: bool, meta: dict,
                          cut: bool, finished_at: datetime, duration_ms: int, row: str,
                          status: str = "done") -> None:
        """Record a call's result; status "done", or "cancelled" for a call stopped midway."""
        async with self._writing() as conn:
            await conn.execute(_FINISH_CALL, {
                "k_run_id": run_id, "k_seq": seq, "text": text, "is_error": is_error, "meta": meta,
                "cut": cut, "status": status, "finished_at": finished_at, "duration_ms": duration_ms,
                "row": row,
            })

    async def file_reads(self, run_id: str, before_seq: int) -> list[tuple[int, dict]]:
        """(seq, meta) of the run's finished file_read calls that did not fail and were not cut."""
        params = {"run_id": run_id, "before_seq": before_seq}
        async with self.engine.connect() as conn:
            return [(seq, meta) for seq, meta in (await conn.execute(_FILE_READS, params)).all()]

    async def mark_context_reset(self, run_id: str, at: datetime) -> int:
        """Record that the run's model context was compacted or rewound now; the
        run's last seq given out (0 for a run with no call yet)."""
        async with self._writing() as conn:
            last = (await conn.execute(sa.select(runs.c.next_seq).where(runs.c.id == run_id))).scalar()
            await conn.execute(sa.insert(context_marks), {"run_id": run_id, "after_seq": last or 0, "at": at})
        return last or 0

    async def context_reset_seq(self, run_id: str) -> int:
        """The seq after which the run's latest context reset came (0: none)."""
        query = sa.select(sa.func.max(context_marks.c.after_seq)).where(context_marks.c.run_id == run_id)
        async with self.engine.connect() as conn:
            return (await conn.execute(query)).scalar() or 0

    async def list_runs(self, agent_id: str | None = None, *, limit: int = DEFAULT_PAGE,
                        offset: int = 0) -> list[RunRecord]:
        """Runs, the most recently active first."""
        query = sa.select(runs).order_by(runs.c.updated_at.desc(), runs.c.id).limit(limit).offset(offset)
        if agent_id is not None:
            query = query.where(runs.c.agent_id == agent_id)
        async with self.engine.connect() as conn:
            return [RunRecord.from_row(r) for r in (await conn.execute(query)).mappings()]

    async def calls(self, run_id: str, *, after_seq: int = 0, limit: int = DEFAULT_PAGE) -> list[CallRecord]:
        """A page of a run's calls, in seq order, after after_seq."""
        query = (sa.select(calls).where(calls.c.run_id == run_id, calls.c.seq > after_seq)
                 .order_by(calls.c.seq).limit(limit))
        async with self.engine.connect() as conn:
            return [CallRecord.from_row(r) for r in (await conn.execute(query)).mappings()]

    async def call(self, run_id: str, seq: int) -> CallRecord | None:
        query = sa.select(calls).where(calls.c.run_id == run_id, calls.c.seq == seq)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return CallRecord.from_row(row) if row else None
