"""A call's own record writes on SQLite, on a plain ``sqlite3`` connection: each
statement compiled once, then only its values bound.

A call's start and end are two transactions of two or three statements each.
Through SQLAlchemy each statement pays for its cache key, its compiled form's
lookup and its result's making, and each transaction for a Connection's begin
and commit: two thirds of a transaction's time, measured on the event loop.
Here the statements that opt in (``Store`` passes them: a call's start, its
end, its run's totals) are compiled once per set of value names, with the
dialect's own bind processors (JSON, timestamps and booleans written as
SQLAlchemy writes them), and run on a connection of the event loop's own.

A transaction that meets anything else falls back whole: a statement not
passed (``NotPrepared``: a rare path, such as a call recorded lost before it
ended) or a database error (the lock held by another process, a full disk) is
rolled back and the caller runs the same work through SQLAlchemy, which
waits for the lock or names the failure as it always does.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import sqlalchemy as sa

T = TypeVar("T")


class NotPrepared(Exception):
    """A statement of the work was not among those passed: run it all through SQLAlchemy."""


class _Compiled:
    """One statement for one set of value names: its SQL and, per placeholder, the
    value's name and its bind processor (None: written as it is); or, for one of the
    statement's own values (its literals), no name and that value, processed once."""

    __slots__ = ("sql", "binds")

    def __init__(self, statement: Any, keys: Sequence[str], dialect: Any):
        compiled = statement.compile(dialect=dialect, column_keys=list(keys))
        if compiled.positiontup is None or compiled.insert_prefetch or compiled.update_prefetch:
            raise NotPrepared("a column default to compute")  # SQLAlchemy's execution fills those
        self.sql = compiled.string
        self.binds: list[tuple[str | None, Any, Any]] = []
        for name in compiled.positiontup:
            bind = compiled.binds[name]
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if name in keys:
                self.binds.append((name, process, None))
            elif bind.callable is not None:
                raise NotPrepared("a value to compute")  # at each execution: not one to keep
            else:
                own = bind.effective_value
                self.binds.append((None, None, own if process is None else process(own)))

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        return [own if name is None else params[name] if process is None else process(params[name])
                for name, process, own in self.binds]


class Rows:
    """A statement's outcome, as much of SQLAlchemy's Result as a call's writes use."""

    def __init__(self, cursor: sqlite3.Cursor):
        self._rows = cursor.fetchall()
        self.rowcount = cursor.rowcount

    def one(self) -> tuple[Any, ...]:
        if len(self._rows) != 1:
            raise sa.exc.NoResultFound("expected one row") if not self._rows else sa.exc.MultipleResultsFound(
                "expected one row")
        return tuple(self._rows[0])


class PreparedConnection:
    """``execute(statement, params)`` for the statements passed, on one sqlite3 connection."""

    def __init__(self, writer: PreparedWriter):
        self._writer = writer

    def execute(self, statement: Any, params: Mapping[str, Any] | list[Mapping[str, Any]] | None = None) -> Rows:
        connection = self._writer.connection
        if isinstance(params, list):
            compiled = self._writer.compiled(statement, params[0].keys())
            return Rows(connection.executemany(compiled.sql, [compiled.values(row) for row in params]))
        one = params or {}
        compiled = self._writer.compiled(statement, one.keys())
        return Rows(connection.execute(compiled.sql, compiled.values(one)))


class PreparedWriter:
    """The event loop's sqlite3 connection to one file, and the statements it may run."""

    def __init__(self, database: str, dialect: Any, statements: Iterable[Any], pragmas: Sequence[str]):
        self._database, self._dialect, self._pragmas = database, dialect, pragmas
        self._statements = {id(s): s for s in statements}
        """By id: held here, so no other statement can take one of their ids."""
        self._compiled: dict[tuple[int, tuple[str, ...]], _Compiled] = {}
        self._connection: sqlite3.Connection | None = None

    @property
    def connection(self) -> sqlite3.Connection:
        if self._connection is None:
            conn = sqlite3.connect(self._database, isolation_level=None)  # BEGIN and COMMIT said here
            for pragma in self._pragmas:
                conn.execute(f"PRAGMA {pragma}")
            self._connection = conn
        return self._connection

    def compiled(self, statement: Any, keys: Iterable[str]) -> _Compiled:
        names = tuple(keys)  # in the caller's order: the same set in another order is compiled again, alike
        found = self._compiled.get((id(statement), names))
        if found is None:
            if id(statement) not in self._statements:
                raise NotPrepared(type(statement).__name__)
            found = self._compiled[(id(statement), names)] = _Compiled(statement, names, self._dialect)
        return found

    def write(self, work: Callable[[Any], T]) -> tuple[bool, T | None]:
        """(True, work(conn)) committed; (False, None) when the work must run through
        SQLAlchemy instead, with nothing of it written (see the module docstring)."""
        conn = self.connection
        try:
            conn.execute("BEGIN")
            done = work(PreparedConnection(self))
            conn.execute("COMMIT")
        except (NotPrepared, sqlite3.Error):
            self._roll_back()
            return False, None
        except BaseException:
            self._roll_back()
            raise
        return True, done

    def _roll_back(self) -> None:
        conn = self._connection
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # the connection is no good: the next write opens another
                self.close()

    def close(self) -> None:
        conn, self._connection = self._connection, None
        if conn is not None:
            conn.close()
