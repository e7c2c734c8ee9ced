"""Where the run record lives and how it is opened: its URL, SQLite's settings,
the one record thread of a SQLite file, and the schema made once, whichever
process comes first (``create_schema``, the migration of an older record in it).

A SQLite file is set up (``RecordThread.make_schema``) by one process at a time,
under an exclusive flock of the folder that holds it: SQLite's switch to WAL
fails at once, without its busy handler, while another connection holds any lock
on the file, and a schema transaction that reads before it writes cannot wait
for the writer's lock either; under the flock neither meets another process
setting up. The processes queue in the kernel instead of retrying against each
other, and one that finds the schema whole (``schema_is_current``) writes
nothing: on an existing record a process's setup takes no write lock at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable

from ..config.private import private_file
from ..limits import (
    RECORD_BUSY_RETRY_SECONDS,
    RECORD_BUSY_WAIT_SECONDS,
    RECORD_CHECKPOINT_COMMITS,
    RECORD_SETUP_WAIT_SECONDS,
)
from .migration import durations_are_wide, migrate
from .prepared import PreparedWriter
from .schema import calls, metadata
from .statements import RUNNING, finish_lost, utc_now

T = TypeVar("T")
DATABASE_URL_ENV = "GUILDS_DATABASE_URL"
DB_FILE = "guilds.db"
SQLITE_BUSY_MS = int(RECORD_BUSY_WAIT_SECONDS * 1000)
"""Another process writing the same SQLite file: SQLite's busy handler waits this long for it."""
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
    _pragmas(dbapi_conn, f"busy_timeout={SQLITE_BUSY_MS}", "journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON")


AT_ONCE_PRAGMAS = ("busy_timeout=0", "journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                   "wal_autocheckpoint=0")
"""The event loop's connections: a lock held elsewhere fails at once (the record
thread waits for it instead), and no checkpoint (the record thread makes them)."""


def _at_once_pragmas(dbapi_conn: Any, _record: Any) -> None:
    _pragmas(dbapi_conn, *AT_ONCE_PRAGMAS)


def _pragmas(dbapi_conn: Any, *pragmas: str) -> None:
    cur = dbapi_conn.cursor()
    for pragma in pragmas:
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def is_locked(exc: sa.exc.OperationalError) -> bool:
    return "database is locked" in str(exc.orig)


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
    _add_owner_column(conn)
    inspector = sa.inspect(conn)
    for table in metadata.sorted_tables:
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in present:  # CREATE INDEX locks its table even when the index exists
                conn.execute(CreateIndex(index, if_not_exists=True))


def schema_is_current(conn: sa.Connection) -> bool:
    """Does the record hold every table, column and index of the schema? (Reads only.)"""
    inspector = sa.inspect(conn)
    present = set(inspector.get_table_names())
    for table in metadata.sorted_tables:
        if table.name not in present:
            return False
        if {c.name for c in table.columns} - {c["name"] for c in inspector.get_columns(table.name)}:
            return False
        if {i.name for i in table.indexes} - {i["name"] for i in inspector.get_indexes(table.name)}:
            return False
    return durations_are_wide(conn)


@contextlib.contextmanager
def setup_lock(database: str) -> Any:
    """An exclusive flock of the folder holding the SQLite file, for one process's
    setup at a time; TimeoutError past RECORD_SETUP_WAIT_SECONDS. The folder, not
    the file: closing any descriptor of the file would drop SQLite's own locks
    on it in this process."""
    fd = os.open(os.path.dirname(os.path.abspath(database)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + RECORD_SETUP_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process held the record's setup for "
                                       f"{RECORD_SETUP_WAIT_SECONDS:.0f} s") from None
                time.sleep(RECORD_BUSY_RETRY_SECONDS)
        yield
    finally:
        os.close(fd)  # the flock goes with it


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
    now = utc_now()
    finish_lost(conn, conn.execute(RUNNING.where(calls.c.status == "running")).all(), now)


def private_record(database: str | None) -> None:
    """Make the SQLite file 0600 before SQLite does (its -wal and -shm files take its mode)."""
    if database and database != ":memory:" and not database.startswith("file:"):
        os.close(private_file(Path(database)))


class RecordThread:
    """A SQLite file's synchronous engine and the one thread that uses it; and the
    event loop's own connections, for a write that can be had at once: SQLAlchemy's,
    and a plain one for the statements of ``prepared`` (``record.prepared``)."""

    def __init__(self, url: sa.URL, prepared: Iterable[Any] = ()):
        self.engine = sa.create_engine(url.set(drivername="sqlite"), pool_reset_on_return=None)
        sa.event.listen(self.engine, "connect", sqlite_pragmas)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="guilds-record")
        self.at_once = sa.create_engine(url.set(drivername="sqlite"), poolclass=sa.pool.StaticPool,
                                        pool_reset_on_return=None)
        sa.event.listen(self.at_once, "connect", _at_once_pragmas)
        assert url.database  # noqa: S101 - a RecordThread is made for a file only
        self.prepared = PreparedWriter(url.database, self.at_once.dialect, prepared, AT_ONCE_PRAGMAS)
        self._unchecked = 0
        """Transactions written on the loop since the last checkpoint was handed to the thread."""
        self._checkpointing = False
        """A checkpoint is in the thread: writes queue behind it there, so the next one
        finds the log copied whole and SQLite writes it over from its start."""
        self._loop_thread: int | None = None
        """The thread whose loop writes at once (the first to write): one connection, one user."""

    async def run(self, work: Callable[[sa.Connection], T], *, write: bool, prepared: bool = False) -> T:
        """work(conn): in a transaction that commits when write, else on a plain connection.

        A write runs on the event loop when SQLite's write lock is free (a call's
        start or end is a fraction of a millisecond of work, less than the two
        hops to a thread and back, which wait for the thread to be scheduled);
        one that would wait for another writer, and every read, runs in the thread.
        ``prepared``: work's statements are those the thread was made with, tried
        first on the plain connection (``record.prepared``).
        """
        if write and self.writes_now():
            if prepared:
                written, done = self.write_prepared(work)
                if written:
                    return done  # type: ignore[return-value]  # work's own value
            try:
                return self._write_at_once(work)
            except sa.exc.DBAPIError as exc:  # nothing of it was written
                self.at_once.dispose()  # nor is anything of it left open on the connection
                if not (isinstance(exc, sa.exc.OperationalError) and is_locked(exc)):
                    raise
        return await asyncio.get_running_loop().run_in_executor(
            self.thread, self._write if write else self._read, work)

    def writes_now(self) -> bool:
        """A write may run now, on the event loop: no checkpoint in the thread, and this is the loop's thread."""
        return not self._checkpointing and self._is_loop_thread()

    def write_prepared(self, work: Callable[[Any], T]) -> tuple[bool, T | None]:
        """``prepared.write(work)`` (call only when ``writes_now``): (True, work(conn)) committed,
        or (False, None), nothing of it written, for SQLAlchemy to write (``run``)."""
        written, done = self.prepared.write(work)
        if written:
            self._committed()
        return written, done

    async def make_schema(self) -> None:
        """Switch the file to WAL and make the schema where missing, one process at a
        time (see the module docstring), in the record thread."""
        await asyncio.get_running_loop().run_in_executor(self.thread, self._make_schema)

    def _make_schema(self) -> None:
        database = self.engine.url.database
        assert database  # noqa: S101 - a RecordThread is made for a file only
        with setup_lock(database):
            with self.engine.connect() as conn:  # its first connection switches the file to WAL
                if schema_is_current(conn):
                    return
            with self.engine.begin() as conn:
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the writer's lock first, waited for
                create_schema(conn)

    def _is_loop_thread(self) -> bool:
        if self._loop_thread is None:
            self._loop_thread = threading.get_ident()
        return self._loop_thread == threading.get_ident()

    def _write_at_once(self, work: Callable[[sa.Connection], T]) -> T:
        with self.at_once.begin() as conn:
            done = work(conn)
        self._committed()
        return done

    def _committed(self) -> None:
        """One more transaction on the loop: past RECORD_CHECKPOINT_COMMITS, a checkpoint in the thread."""
        self._unchecked += 1
        if self._unchecked >= RECORD_CHECKPOINT_COMMITS:
            self._unchecked = 0
            self._checkpointing = True
            self.thread.submit(self._checkpoint)

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
        self.prepared.close()
        self.at_once.dispose()
        await asyncio.get_running_loop().run_in_executor(self.thread, self.engine.dispose)
        self.thread.shutdown()
