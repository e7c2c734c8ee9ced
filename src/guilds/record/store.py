"""The run record: every call of every run, in order, in a real database.

SQLAlchemy 2 async, one engine per Store (make one Store per process). SQLite
(``sqlite+aiosqlite``) by default, at ``<data>/guilds.db``; PostgreSQL
(``postgresql+asyncpg``) by changing the URL ($GUILDS_DATABASE_URL).

Tables:

    runs   id (the run id), agent_id, created_at, updated_at,
           next_seq (the last seq given out), used_calls (calls counted against
           the budget), admitted_seq (the last seq admitted within the budget),
           returned_bytes, elided_bytes, pointer_saved_bytes, secrets_redacted
           (the totals of its finished calls: ``records.call_savings`` of
           each, added in the transaction that records the call's end)
    calls  run_id + seq, call_id, tool, args, text, is_error, meta, cut (by the
           pipeline's cap), counted (against the budget), status (running, done,
           cancelled, or lost: its process ended first), started_at,
           finished_at, duration_ms, row, owner (the process running it; none
           once it has ended)
    owners the processes that have the record open (``guilds.record.owners``): id,
           machine, pid, pid_start, heartbeat_at
    context_marks  run_id, after_seq, at: the run's model context was compacted
           or rewound after its call after_seq
    run_principals run_id, principal: who made the run, for fronts that
           authenticate (the MCP endpoint: a fingerprint of its token; "" for
           none); claimed once, by the run's first such call
    tasks  id (a task id, unguessable), run_id, agent_id, tool, background_id,
           principal, status (working, completed, failed, cancelled),
           status_message, result (the final result or error, as sent),
           created_at, updated_at, owner (the process following it; none once
           it has ended): the MCP front's tasks (guilds/fronts/mcp_tasks.py)

The schema is made once, whichever process comes first (``_create_schema``).
Opening a Store registers its process as an owner and records as ``lost`` the
running calls of owners known to be gone; its lease task repeats that every
``limits.OWNER_HEARTBEAT_SECONDS``. A write that fails (a full disk) raises
RecordError, one line saying what could not be written.

Seqs and budget slots are given out by one ``INSERT INTO runs ... ON CONFLICT DO
UPDATE ... RETURNING`` in the transaction that inserts the call: atomic on PostgreSQL (a row lock) and on
SQLite (one writer), so concurrent calls of one run, from one process or many,
never share a seq and never pass the budget. On SQLite the writes of one
process also queue on an asyncio lock, so they never wait on SQLITE_BUSY.

A call's own statements (its start, its end, the reads a file_read and its
savings need) are each one function on a plain connection (``_in_transaction``,
``_reading``). On a SQLite file a write runs at once on the event loop, on a
synchronous connection of its own, when SQLite's write lock is free (a fraction
of a millisecond: less than the hops to a thread and back, each waiting for a
thread to be scheduled); one that would wait for another writer, every read,
and the checkpoints of the loop's writes (RECORD_CHECKPOINT_COMMITS) run in the
Store's one record thread, on a synchronous engine of the same file: one hop
per transaction, never one per statement. On PostgreSQL they run on the async
engine's connection (``run_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, CreateTable

from ..config.private import private_file
from ..errors import BadInput, RecordError
from ..limits import RECORD_BUSY_RETRY_SECONDS, RECORD_BUSY_WAIT_SECONDS, RECORD_CHECKPOINT_COMMITS
from .migration import migrate
from .owners import LOST, Lease, Owner, is_gone, machine_id
from .rows import row_text
from .values import CallRecord, RunRecord, Savings, Slot, answer_bytes, answer_text, call_savings

DATABASE_URL_ENV = "GUILDS_DATABASE_URL"
DB_FILE = "guilds.db"
DEFAULT_PAGE = 100
SQLITE_BUSY_MS = int(RECORD_BUSY_WAIT_SECONDS * 1000)
"""Another process writing the same SQLite file: SQLite's busy handler waits this long for it."""
T = TypeVar("T")
SCHEMA_LOCK_KEY = 0x6775_696C_6473
"""The PostgreSQL advisory lock held while the schema is made ("guilds" in ASCII)."""

class _JSON(sa.types.TypeDecorator):
    """JSON; JSONB on PostgreSQL. A dialect is imported only when a URL uses it (a fast CLI)."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(sa.JSON())


SAVINGS_COLUMNS = ("returned_bytes", "elided_bytes", "pointer_saved_bytes", "secrets_redacted")
"""A run's totals (``records.Savings``, its fields in this order)."""
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
    *(sa.Column(name, sa.BigInteger, nullable=False, server_default="0") for name in SAVINGS_COLUMNS),
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
    sa.Column("owner", sa.String(32), index=True),
    sa.Column("remaining", sa.Integer),  # the trailer's count; NULL while running
)
owners = sa.Table(
    "owners", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("machine", sa.String(160), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_start", sa.BigInteger, nullable=False),
    sa.Column("heartbeat_at", _TS, nullable=False),
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
run_principals = sa.Table(
    "run_principals", metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("principal", sa.String(64), nullable=False),
)
tasks = sa.Table(
    "tasks", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("tool", sa.String(32), nullable=False),
    sa.Column("background_id", sa.String(32)),
    sa.Column("principal", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_message", sa.Text),
    sa.Column("result", _JSON),
    sa.Column("created_at", _TS, nullable=False),
    sa.Column("updated_at", _TS, nullable=False),
    sa.Column("owner", sa.String(32)),
)


FLOW_PAGE = 200
"""Calls per page of a run's flow: the newest first, then "Load earlier"."""
_FLOW_COLUMNS = [c for c in calls.c if c.name != "text"] + [
    sa.case((calls.c.tool == "code_task", calls.c.text), else_=None).label("text")
]
_INSERT_CALL = sa.insert(calls)
_FINISH_CALL = sa.update(calls).where(
    calls.c.run_id == sa.bindparam("k_run_id"), calls.c.seq == sa.bindparam("k_seq")
)
_FINISH_RUNNING = _FINISH_CALL.where(calls.c.status == "running")
_SAVINGS_PARAMS = [f"d_{name}" for name in SAVINGS_COLUMNS]
_ADD_SAVINGS = sa.update(runs).where(runs.c.id == sa.bindparam("k_run_id")).values(
    {name: runs.c[name] + sa.bindparam(param) for name, param in zip(SAVINGS_COLUMNS, _SAVINGS_PARAMS, strict=True)})
_ORPHANED = sa.select(calls.c.owner).distinct().where(calls.c.owner.is_not(None),
                                                      calls.c.owner.not_in(sa.select(owners.c.id)))
"""Owners of running calls that are no longer registered (closed while a call ran)."""
_RUNNING = sa.select(calls.c.run_id, calls.c.seq, calls.c.tool, calls.c.args, calls.c.started_at)
class _Utf8Bytes(sa.sql.expression.FunctionElement):
    """A text column's size in UTF-8 bytes (SQLite before 3.43 has no octet_length)."""

    type = sa.Integer()
    name = "utf8_bytes"
    inherit_cache = True


@compiles(_Utf8Bytes)
def _octet_length(element: Any, compiler: Any, **kw: Any) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


@compiles(_Utf8Bytes, "sqlite")
def _blob_length(element: Any, compiler: Any, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


_FILE_READS = (
    sa.select(calls.c.seq, calls.c.meta, _Utf8Bytes(calls.c.text),
              sa.func.substr(calls.c.text, sa.func.length(calls.c.text), 1), calls.c.remaining)
    .where(calls.c.run_id == sa.bindparam("run_id"), calls.c.tool == "file_read", calls.c.status == "done",
           calls.c.is_error.is_(False), calls.c.cut.is_(False), calls.c.seq < sa.bindparam("before_seq"))
    .order_by(calls.c.seq)
)
"""Built once: building it per call (and its cache key) was a third of the ledger's query time."""
_RESET_SEQ = sa.select(sa.func.max(context_marks.c.after_seq)).where(context_marks.c.run_id == sa.bindparam("run_id"))


def _allocate_statement(dialect: Any) -> Any:
    """Make the run if new and take the next seq and, within the budget, a slot: one statement.

    Under ON CONFLICT ... SET the right-hand sides read the row as it was, so
    admitted_seq == next_seq afterwards exactly when this call got a slot.
    """
    now: Any = sa.bindparam("now")
    budget: Any = sa.bindparam("budget")
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
    _pragmas(dbapi_conn, f"busy_timeout={SQLITE_BUSY_MS}", "journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON")


def _at_once_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """The event loop's connection: a lock held elsewhere fails at once (the record
    thread waits for it instead), and no checkpoint (the record thread makes them)."""
    _pragmas(dbapi_conn, "busy_timeout=0", "journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
             "wal_autocheckpoint=0")


def _pragmas(dbapi_conn: Any, *pragmas: str) -> None:
    cur = dbapi_conn.cursor()
    for pragma in pragmas:
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def _is_locked(exc: sa.exc.OperationalError) -> bool:
    return "database is locked" in str(exc.orig)


def _dialect_module(is_sqlite: bool) -> Any:
    """sqlalchemy.dialects.sqlite or .postgresql (their insert ... on conflict), imported on use."""
    if is_sqlite:
        from sqlalchemy.dialects import sqlite

        return sqlite
    from sqlalchemy.dialects import postgresql

    return postgresql


def _now() -> datetime:
    return datetime.now(UTC)


def _reason(exc: BaseException) -> str:
    """The driver's own words, on one line: "database or disk is full"."""
    orig = getattr(exc, "orig", None) or exc
    text = getattr(orig, "strerror", None) or str(orig) or type(orig).__name__
    return " ".join(text.split())[:300]


def _utc_row(row: Mapping[Any, Any]) -> dict[str, Any]:
    """An owners row, its heartbeat in UTC (SQLite hands it back naive)."""
    beat = row["heartbeat_at"]
    return {**row, "heartbeat_at": beat.replace(tzinfo=UTC) if beat.tzinfo is None else beat}


def _lost(call: Any, now: datetime) -> dict[str, Any]:
    """The finish of a call whose process is gone: an error, "· lost" on its row."""
    started = call.started_at if call.started_at.tzinfo else call.started_at.replace(tzinfo=UTC)
    return {"k_run_id": call.run_id, "k_seq": call.seq, "text": LOST, "is_error": True, "meta": None,
            "cut": False, "status": "lost", "finished_at": now, "owner": None,
            "row": f"{row_text(call.tool, call.args, {}, False)} · lost",
            "duration_ms": max(0, round((now - started).total_seconds() * 1000))}


def _file_reads(conn: sa.Connection, run_id: str, before_seq: int) -> list[tuple[int, dict, int]]:
    rows = conn.execute(_FILE_READS, {"run_id": run_id, "before_seq": before_seq})
    return [(seq, meta, answer_bytes(size or 0, last or "", remaining)) for seq, meta, size, last, remaining in rows]


def _reset_seq(conn: sa.Connection, run_id: str) -> int:
    return conn.execute(_RESET_SEQ, {"run_id": run_id}).scalar() or 0


def _savings(finish: Mapping[str, Any]) -> Savings:
    """The amounts of a call finished with these _FINISH_CALL parameters."""
    return call_savings(answer_text(finish["text"], finish.get("remaining")), finish["meta"])


def add_savings(conn: sa.Connection, per_run: Mapping[str, Savings]) -> None:
    """Add to each run's totals (in run id order: two writers lock runs rows in one order)."""
    changes = [{"k_run_id": run_id, **dict(zip(_SAVINGS_PARAMS, astuple(amounts), strict=True))}
               for run_id, amounts in sorted(per_run.items()) if amounts != Savings()]
    if changes:
        conn.execute(_ADD_SAVINGS, changes)


def _finish(conn: sa.Connection, finish: Mapping[str, Any]) -> None:
    """Record a call's end and add its amounts to its run's totals.

    A call already ended (recorded lost while its process was only slow) has its
    old amounts taken back, so the totals stay the sum over the calls as they are."""
    run_id, seq = finish["k_run_id"], finish["k_seq"]
    if conn.execute(_FINISH_RUNNING, finish).rowcount:
        add_savings(conn, {run_id: _savings(finish)})
        return
    old = conn.execute(sa.select(calls.c.text, calls.c.remaining, calls.c.meta)
                       .where(calls.c.run_id == run_id, calls.c.seq == seq)).first()
    if old is not None:
        conn.execute(_FINISH_CALL, finish)
        add_savings(conn, {run_id: _savings(finish) - call_savings(answer_text(old.text, old.remaining), old.meta)})


def _finish_lost(conn: sa.Connection, running: Any, now: datetime) -> list[tuple[str, int]]:
    """Record as lost those of these calls that are still running, with their runs' totals; their (run, seq)."""
    lost: list[tuple[str, int]] = []
    per_run: dict[str, Savings] = {}
    for call in sorted(running, key=lambda c: (c.run_id, c.seq)):
        finish = _lost(call, now)
        if conn.execute(_FINISH_RUNNING, finish).rowcount:
            lost.append((call.run_id, call.seq))
            per_run[call.run_id] = per_run.get(call.run_id, Savings()) + _savings(finish)
    add_savings(conn, per_run)
    return lost


def _create_schema(conn: sa.Connection) -> None:
    """Make the missing tables and indexes, once, whichever process comes first.

    PostgreSQL: under a transaction-level advisory lock (its CREATE TABLE IF NOT
    EXISTS still fails when two run at once). SQLite: each CREATE ... IF NOT
    EXISTS is atomic under its one writer. An index already there is not made
    again: CREATE INDEX takes a lock on its table first, which would wait on the
    calls other processes are writing while this transaction holds the lock on
    another table (a deadlock on PostgreSQL).
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
    for table in metadata.sorted_tables:
        conn.execute(CreateTable(table, if_not_exists=True))
    migrate(conn)  # an older record brought up to date, under the same lock
    _add_owner_column(conn)
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:  # CREATE INDEX locks its table even when the index exists
                conn.execute(CreateIndex(index, if_not_exists=True))


def _add_owner_column(conn: sa.Connection) -> None:
    """A record made before calls had owners gets the column; its calls still ``running``
    then (no process can finish them any more) are recorded lost."""
    if "owner" in {c["name"] for c in sa.inspect(conn).get_columns("calls")}:
        return
    try:
        conn.execute(sa.text("ALTER TABLE calls ADD COLUMN owner VARCHAR(32)"))
    except sa.exc.OperationalError as exc:  # SQLite: another process added it meanwhile
        if "duplicate column" in str(exc):
            return
        raise
    now = _now()
    _finish_lost(conn, conn.execute(_RUNNING.where(calls.c.status == "running")).all(), now)


def _private_record(database: str | None) -> None:
    """Make the SQLite file 0600 before SQLite does (its -wal and -shm files take its mode)."""
    if database and database != ":memory:" and not database.startswith("file:"):
        os.close(private_file(Path(database)))


class _RecordThread:
    """A SQLite file's synchronous engine and the one thread that uses it; and the
    event loop's own connection, for a write that can be had at once."""

    def __init__(self, url: sa.URL):
        self.engine = sa.create_engine(url.set(drivername="sqlite"), pool_reset_on_return=None)
        sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="guilds-record")
        self.at_once = sa.create_engine(url.set(drivername="sqlite"), poolclass=sa.pool.StaticPool,
                                        pool_reset_on_return=None)
        sa.event.listen(self.at_once, "connect", _at_once_pragmas)
        self._unchecked = 0
        """Transactions written on the loop since the last checkpoint was handed to the thread."""
        self._checkpointing = False
        """A checkpoint is in the thread: writes queue behind it there, so the next one
        finds the log copied whole and SQLite writes it over from its start."""
        self._loop_thread: int | None = None
        """The thread whose loop writes at once (the first to write): one connection, one user."""

    async def run(self, work: Callable[[sa.Connection], T], *, write: bool) -> T:
        """work(conn): in a transaction that commits when write, else on a plain connection.

        A write runs on the event loop when SQLite's write lock is free (a call's
        start or end is a fraction of a millisecond of work, less than the two
        hops to a thread and back, which wait for the thread to be scheduled);
        one that would wait for another writer, and every read, runs in the thread.
        """
        if write and not self._checkpointing and self._is_loop_thread():
            try:
                return self._write_at_once(work)
            except sa.exc.DBAPIError as exc:  # nothing of it was written
                self.at_once.dispose()  # nor is anything of it left open on the connection
                if not (isinstance(exc, sa.exc.OperationalError) and _is_locked(exc)):
                    raise
        return await asyncio.get_running_loop().run_in_executor(
            self.thread, self._write if write else self._read, work)

    def _is_loop_thread(self) -> bool:
        if self._loop_thread is None:
            self._loop_thread = threading.get_ident()
        return self._loop_thread == threading.get_ident()

    def _write_at_once(self, work: Callable[[sa.Connection], T]) -> T:
        with self.at_once.begin() as conn:
            done = work(conn)
        self._unchecked += 1
        if self._unchecked >= RECORD_CHECKPOINT_COMMITS:
            self._unchecked = 0
            self._checkpointing = True
            self.thread.submit(self._checkpoint)
        return done

    def _checkpoint(self) -> None:
        """Copy the write-ahead log into the database, as SQLite's own automatic checkpoint
        would; not done now (another process reading, a full disk) is for the next one."""
        try:
            with contextlib.suppress(sa.exc.DBAPIError), self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            self._checkpointing = False

    def _write(self, work: Callable[[sa.Connection], T]) -> T:
        with self.engine.begin() as conn:
            return work(conn)

    def _read(self, work: Callable[[sa.Connection], T]) -> T:
        with self.engine.connect() as conn:
            return work(conn)

    async def close(self) -> None:
        self.at_once.dispose()
        await asyncio.get_running_loop().run_in_executor(self.thread, self.engine.dispose)
        self.thread.shutdown()


class Store:
    """The run record. ``async with Store(url) as store`` makes the tables and disposes the engine."""

    def __init__(self, url: str):
        self.owner = Owner.of_this_process()
        self._lease = Lease(self)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        url = normalize_url(url)
        self.sqlite = url.startswith("sqlite")
        # SQLite: every write commits in engine.begin() and a read opens no
        # transaction, so the pool's rollback on check-in is one round trip for nothing.
        extra = {"pool_reset_on_return": None} if self.sqlite else {}
        self.engine: AsyncEngine = create_async_engine(url, **extra)
        if self.sqlite:
            sa.event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self._write_lock = asyncio.Lock() if self.sqlite else None
        where = self.engine.url
        self.where = where.database if self.sqlite else f"{where.host}/{where.database}"
        """The record's place for messages: the SQLite file, or host/database (no password)."""
        self._allocate = _allocate_statement(_dialect_module(self.sqlite))
        self._record_thread = (_RecordThread(where) if self.sqlite and where.database not in (None, "", ":memory:")
                               else None)

    async def __aenter__(self) -> Store:
        await self.setup()
        self._lease.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def setup(self) -> None:
        """Create the tables where missing (idempotent, and safe when processes race:
        ``_create_schema``); a SQLite record file is made 0600."""
        if self.sqlite:
            _private_record(self.engine.url.database)
        async def create() -> None:
            async with self.engine.begin() as conn:
                await conn.run_sync(_create_schema)

        try:
            await self._again_while_busy(create)
        except sa.exc.DBAPIError as exc:
            raise RecordError(f"the run record at {self.where} could not be made: {_reason(exc)}") from None
        await self._register()
        await self.sweep_lost()

    async def close(self) -> None:
        await self._lease.stop()
        with contextlib.suppress(RecordError):  # a full disk: the owner is found gone later
            await self._in_transaction("the owner's end",
                                       lambda conn: conn.execute(sa.delete(owners).where(owners.c.id == self.owner.id)))
        if self._record_thread is not None:
            await self._record_thread.close()
        await self.engine.dispose()

    async def _register(self) -> None:
        me = self.owner
        entry = sa.insert(owners).values(id=me.id, machine=me.machine, pid=me.pid, pid_start=me.pid_start,
                                         heartbeat_at=_now())
        await self._in_transaction("this process's owner entry", lambda conn: conn.execute(entry))

    async def heartbeat(self) -> None:
        """Refresh this process's heartbeat (register again if another process forgot it)."""
        beat = sa.update(owners).where(owners.c.id == self.owner.id).values(heartbeat_at=_now())
        if await self._in_transaction("the heartbeat", lambda conn: conn.execute(beat).rowcount) == 0:
            await self._register()

    async def sweep_lost(self) -> list[tuple[str, int]]:
        """Record as ``lost`` the running calls of every owner known to be gone (or no longer
        registered); their (run, seq)."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.select(owners).where(owners.c.id != self.owner.id))).mappings().all()
            orphaned = (await conn.execute(_ORPHANED)).scalars().all()
        now, here = _now(), machine_id()
        gone = [r["id"] for r in rows if is_gone(Owner(**_utc_row(r)), now, here)]
        gone += orphaned
        if not gone:
            return []
        def sweep(conn: sa.Connection) -> list[tuple[str, int]]:
            running = conn.execute(_RUNNING.where(calls.c.owner.in_(gone), calls.c.status == "running")).all()
            lost = _finish_lost(conn, running, now)
            conn.execute(sa.delete(owners).where(owners.c.id.in_(gone)))
            return lost
        return await self._in_transaction("the lost calls", sweep)

    async def _in_transaction(self, what: str, work: Callable[[sa.Connection], T]) -> T:
        """work(conn) in one write transaction (see the module docstring); a database
        failure (a full disk) becomes RecordError naming ``what``."""
        async def attempt() -> T:
            if self._record_thread is not None:
                return await self._record_thread.run(work, write=True)
            async with self.engine.begin() as conn:
                return await conn.run_sync(work)

        try:
            async with self._write_lock or contextlib.nullcontext():
                return await self._again_while_busy(attempt)
        except (sa.exc.DBAPIError, OSError) as exc:
            raise RecordError(f"the run record at {self.where} could not be written ({what}): "
                              f"{_reason(exc)}") from None

    async def _again_while_busy(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """attempt() (a whole transaction); on SQLite run again while it fails with
        "database is locked" at once (RECORD_BUSY_RETRY_SECONDS)."""
        deadline, pause = time.monotonic() + RECORD_BUSY_WAIT_SECONDS, RECORD_BUSY_RETRY_SECONDS
        while True:
            try:
                return await attempt()
            except sa.exc.OperationalError as exc:
                if not (self.sqlite and _is_locked(exc)) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))  # noqa: S311 - a jitter, not a secret
            pause = min(pause * 2, 0.32)

    async def _reading(self, work: Callable[[sa.Connection], T]) -> T:
        """work(conn) on a connection that only reads, in the record thread on SQLite."""
        if self._record_thread is None:
            async with self.engine.connect() as conn:
                return await conn.run_sync(work)
        return await self._record_thread.run(work, write=False)

    async def begin_call(self, *, run_id: str, agent_id: str, tool: str, args: Any, call_id: str,
                         started_at: datetime, budget: int) -> Slot:
        """Give the call its seq and a slot within the run's budget; record it as running.

        A call past the budget gets ``admitted=False``: it is recorded, not counted.
        """
        def begin(conn: sa.Connection) -> tuple[int, int, bool]:
            allocated = conn.execute(self._allocate, {
                "run_id": run_id, "agent_id": agent_id, "now": started_at, "budget": budget,
            })
            owner, seq, used, admitted_seq = allocated.one()
            if owner != agent_id:
                raise BadInput(f"run {run_id!r} belongs to agent {owner!r}, not {agent_id!r}")
            conn.execute(_INSERT_CALL, {
                "run_id": run_id, "seq": seq, "call_id": call_id, "tool": tool, "args": args,
                "counted": admitted_seq == seq, "status": "running", "started_at": started_at,
                "is_error": False, "cut": False, "owner": self.owner.id,
            })
            return seq, used, admitted_seq == seq

        seq, used, admitted = await self._in_transaction(f"the start of a {tool[:40]!r} call", begin)
        self._in_flight += 1
        self._idle.clear()
        return Slot(seq=seq, used=used, admitted=admitted)

    async def finish_call(self, *, run_id: str, seq: int, text: str, is_error: bool, meta: dict,
                          cut: bool, finished_at: datetime, duration_ms: int, row: str,
                          status: str = "done", remaining: int | None = None) -> None:
        """Record a call's result, and its amounts in its run's totals (one transaction);
        status "done", or "cancelled" for a call stopped midway.

        ``text`` is the body, ``remaining`` the trailer's count (None: none), ``meta`` the tool's own
        metadata: the call's fields are columns already (``records.CALL_FIELDS``).
        """
        try:
            params = {
                "k_run_id": run_id, "k_seq": seq, "text": text, "is_error": is_error, "meta": meta,
                "cut": cut, "status": status, "finished_at": finished_at, "duration_ms": duration_ms,
                "row": row, "owner": None, "remaining": remaining,
            }
            await self._in_transaction(f"the result of call {seq} of run {run_id}",
                                       lambda conn: _finish(conn, params))
        finally:
            self._in_flight = max(0, self._in_flight - 1)
            if not self._in_flight:
                self._idle.set()

    async def settled(self, timeout: float) -> bool:
        """Wait up to timeout until every call this Store began has its end recorded; True if so.
        A server's shutdown waits here for its cancelled calls before the record closes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self._idle.is_set()

    async def file_reads(self, run_id: str, before_seq: int) -> list[tuple[int, dict, int]]:
        """(seq, meta, size) of the run's finished file_read calls that did not fail and were
        not cut; size: the result's UTF-8 bytes as the model got it (its text is not read)."""
        return await self._reading(lambda conn: _file_reads(conn, run_id, before_seq))

    async def reads_since_reset(self, run_id: str, before_seq: int) -> list[tuple[int, dict, int]]:
        """``file_reads`` made after the run's latest context reset: what the read ledger
        may offer, in one round trip."""
        def read(conn: sa.Connection) -> list[tuple[int, dict, int]]:
            after = _reset_seq(conn, run_id)
            return [read for read in _file_reads(conn, run_id, before_seq) if read[0] > after]
        return await self._reading(read)

    async def mark_context_reset(self, run_id: str, at: datetime) -> int:
        """Record that the run's model context was compacted or rewound now; the
        run's last seq given out (0 for a run with no call yet)."""
        def mark(conn: sa.Connection) -> int:
            last = conn.execute(sa.select(runs.c.next_seq).where(runs.c.id == run_id)).scalar() or 0
            conn.execute(sa.insert(context_marks), {"run_id": run_id, "after_seq": last, "at": at})
            return last
        return await self._in_transaction(f"a context reset of run {run_id}", mark)

    async def context_reset_seq(self, run_id: str) -> int:
        """The seq after which the run's latest context reset came (0: none)."""
        return await self._reading(lambda conn: _reset_seq(conn, run_id))

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
        row = await self._reading(lambda conn: conn.execute(query).mappings().first())
        return CallRecord.from_row(row) if row else None

    # --- the app's flow: paged by seq on the primary key, no result text but code_task's
    async def get_run(self, run_id: str) -> RunRecord | None:
        """One run, or None."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(sa.select(runs).where(runs.c.id == run_id))).mappings().first()
        return RunRecord.from_row(row) if row else None

    async def flow_before(self, run_id: str, before_seq: int | None = None,
                          limit: int = FLOW_PAGE) -> list[CallRecord]:
        """The last ``limit`` calls of a run before ``before_seq`` (all when None), in seq order.

        A flow row needs a call's tool, row, status, arguments and metadata, not its
        result text: the text (up to 64 KiB a call) is selected only for code_task
        calls, whose block shows their final message."""
        query = sa.select(*_FLOW_COLUMNS).where(calls.c.run_id == run_id)
        if before_seq is not None:
            query = query.where(calls.c.seq < before_seq)
        query = query.order_by(calls.c.seq.desc()).limit(limit)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [CallRecord.from_row(r) for r in reversed(rows)]

    async def flow_after(self, run_id: str, after_seq: int, limit: int = FLOW_PAGE) -> list[CallRecord]:
        """The first ``limit`` calls of a run after ``after_seq``, in seq order (for live updates)."""
        query = (sa.select(*_FLOW_COLUMNS).where(calls.c.run_id == run_id, calls.c.seq > after_seq)
                 .order_by(calls.c.seq).limit(limit))
        async with self.engine.connect() as conn:
            return [CallRecord.from_row(r) for r in (await conn.execute(query)).mappings()]

    # --- the MCP front's run principals and tasks
    async def claim_run(self, run_id: str, principal: str) -> str:
        """The principal of run_id: ``principal`` when this is the run's first claim, else the one
        recorded (two first claims at once: one insert wins, both read it)."""
        claim = (_dialect_module(self.sqlite).insert(run_principals)
                 .values(run_id=run_id, principal=principal).on_conflict_do_nothing(index_elements=["run_id"]))
        recorded = sa.select(run_principals.c.principal).where(run_principals.c.run_id == run_id)

        def claimed(conn: sa.Connection) -> str:
            conn.execute(claim)
            return str(conn.execute(recorded).scalar_one())
        return await self._in_transaction(f"the principal of run {run_id}", claimed)

    async def create_task(self, **values: Any) -> None:
        """Record a new task (the ``tasks`` columns), owned by this process."""
        row = {**values, "owner": self.owner.id}
        await self._in_transaction("a new task", lambda conn: conn.execute(sa.insert(tasks), row))

    async def update_task(self, task_id: str, **values: Any) -> None:
        """Change a task's columns (an ended task: ``owner=None``)."""
        change = sa.update(tasks).where(tasks.c.id == task_id).values(**values)
        await self._in_transaction(f"task {task_id[:12]}", lambda conn: conn.execute(change))

    async def get_task(self, task_id: str) -> dict[str, Any] | None:
        """A task's columns, and ``owner_alive``: its owner is this process or still registered."""
        query = (sa.select(tasks, owners.c.id.label("registered"))
                 .select_from(tasks.outerjoin(owners, owners.c.id == tasks.c.owner))
                 .where(tasks.c.id == task_id))
        row = await self._reading(lambda conn: conn.execute(query).mappings().first())
        if row is None:
            return None
        task = {k: v for k, v in row.items() if k != "registered"}
        task["owner_alive"] = row["owner"] is not None and (row["registered"] is not None
                                                            or row["owner"] == self.owner.id)
        return task
