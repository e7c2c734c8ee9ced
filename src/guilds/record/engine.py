"""Where the run record lives and how it is opened: its URL, SQLite's settings,
the one record thread of a SQLite file, and the schema made once.

SQLAlchemy 2 async, one engine per Store (make one Store per process). SQLite
(``sqlite+aiosqlite``) by default, at ``<data>/guilds.db``; PostgreSQL
(``postgresql+asyncpg``) by changing the URL ($GUILDS_DATABASE_URL).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable

from ..limits import RECORD_BUSY_WAIT_SECONDS
from ..private import private_file
from ..record_migration import migrate
from .schema import calls, metadata
from .statements import RUNNING, finish_lost, utc_now

DATABASE_URL_ENV = "GUILDS_DATABASE_URL"
DB_FILE = "guilds.db"
SQLITE_BUSY_MS = int(RECORD_BUSY_WAIT_SECONDS * 1000)
"""Another process writing the same SQLite file: SQLite's busy handler waits this long for it."""
T = TypeVar("T")
SCHEMA_LOCK_KEY = 0x6775_696C_6473
"""The PostgreSQL advisory lock held while the schema is made ("guilds" in ASCII)."""


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


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    for pragma in (f"busy_timeout={SQLITE_BUSY_MS}", "journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def dialect_module(is_sqlite: bool) -> Any:
    """sqlalchemy.dialects.sqlite or .postgresql (their insert ... on conflict), imported on use."""
    if is_sqlite:
        from sqlalchemy.dialects import sqlite

        return sqlite
    from sqlalchemy.dialects import postgresql

    return postgresql



def reason(exc: BaseException) -> str:
    """The driver's own words, on one line: "database or disk is full"."""
    orig = getattr(exc, "orig", None) or exc
    text = getattr(orig, "strerror", None) or str(orig) or type(orig).__name__
    return " ".join(text.split())[:300]



def create_schema(conn: sa.Connection) -> None:
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
    add_owner_column(conn)
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:  # CREATE INDEX locks its table even when the index exists
                conn.execute(CreateIndex(index, if_not_exists=True))


def add_owner_column(conn: sa.Connection) -> None:
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
    now = utc_now()
    finish_lost(conn, conn.execute(RUNNING.where(calls.c.status == "running")).all(), now)


def private_record(database: str | None) -> None:
    """Make the SQLite file 0600 before SQLite does (its -wal and -shm files take its mode)."""
    if database and database != ":memory:" and not database.startswith("file:"):
        os.close(private_file(Path(database)))


class RecordThread:
    """A SQLite file's synchronous engine and the one thread that uses it."""

    def __init__(self, url: sa.URL):
        self.engine = sa.create_engine(url.set(drivername="sqlite"), pool_reset_on_return=None)
        sa.event.listen(self.engine, "connect", sqlite_pragmas)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="guilds-record")

    async def run(self, work: Callable[[sa.Connection], T], *, write: bool) -> T:
        """work(conn) in the thread: in a transaction that commits when write, else on a plain connection."""
        return await asyncio.get_running_loop().run_in_executor(
            self.thread, self._write if write else self._read, work)

    def _write(self, work: Callable[[sa.Connection], T]) -> T:
        with self.engine.begin() as conn:
            return work(conn)

    def _read(self, work: Callable[[sa.Connection], T]) -> T:
        with self.engine.connect() as conn:
            return work(conn)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.thread, self.engine.dispose)
        self.thread.shutdown()
