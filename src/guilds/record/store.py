"""The run record's API: every call of every run, in order, in a real database
(its tables: ``record.schema``; its URL, engine and schema's making:
``record.engine``; its statements: ``record.statements``).

SQLAlchemy 2 async, one engine per Store (make one Store per process). SQLite
(``sqlite+aiosqlite``) by default, at ``<data>/guilds.db``; PostgreSQL
(``postgresql+asyncpg``) by changing the URL ($GUILDS_DATABASE_URL).

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
import dataclasses
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..errors import BadInput, RecordError
from ..limits import RECORD_BUSY_RETRY_SECONDS, RECORD_BUSY_WAIT_SECONDS
from . import agent_listing, agent_rows, e2b_command_rows
from . import call_keys as keys
from . import session_rows as shared_sessions
from .call_keys import CallKey, Keyed
from .engine import (
    RecordThread,
    create_schema,
    dialect_module,
    is_locked,
    normalize_url,
    private_record,
    reason,
    sqlite_pragmas,
)
from .owners import Lease, Owner, is_gone_now, machine_id
from .schema import (
    agents,
    calls,
    checkpoints,
    context_marks,
    e2b_create_keys,
    e2b_sandboxes,
    egress,
    owners,
    run_principals,
    runs,
    sessionless_runs,
    tasks,
)
from .statements import (
    CALL_WRITES,
    FLOW_COLUMNS,
    FLOW_PAGE,
    INSERT_CALL,
    ORPHANED,
    RUNNING,
    allocate_statement,
    file_reads,
    finish,
    finish_lost,
    reset_seq,
    rewound_spans,
    utc_now,
    utc_row,
)
from .values import CallRecord, RunRecord, Slot

T = TypeVar("T")
RUN_IDS_PAGE = 500
"""Run ids asked for in one query (SQLite's older builds take 999 variables at most)."""
DEFAULT_PAGE = 100


def another_agents_run(run_id: str, owner: str, agent_id: str | None) -> BadInput:
    """The refusal of a call of agent_id naming a run of agent owner."""
    return BadInput(f"run {run_id!r} belongs to agent {owner!r}, not {agent_id!r}")


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
            sa.event.listen(self.engine.sync_engine, "connect", sqlite_pragmas)
        self._write_lock = asyncio.Lock() if self.sqlite else None
        where = self.engine.url
        self.where = where.database if self.sqlite else f"{where.host}/{where.database}"
        """The record's place for messages: the SQLite file, or host/database (no password)."""
        self._insert = dialect_module(self.sqlite).insert
        self._allocate = allocate_statement(dialect_module(self.sqlite))
        on_file = self.sqlite and where.database not in (None, "", ":memory:")
        self._record_thread = RecordThread(where, prepared=(self._allocate, *CALL_WRITES)) if on_file else None

    async def __aenter__(self) -> Store:
        await self.setup()
        self._lease.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def setup(self) -> None:
        """Create the tables where missing (idempotent, and safe when processes race:
        ``create_schema``; a SQLite file one process at a time, ``RecordThread.make_schema``);
        a SQLite record file is made 0600."""
        if self.sqlite:
            private_record(self.engine.url.database)
        async def create() -> None:
            if self._record_thread is not None:
                await self._record_thread.make_schema()
                return
            async with self.engine.begin() as conn:
                await conn.run_sync(create_schema)

        try:
            await self._again_while_busy(create)
        except (sa.exc.DBAPIError, OSError) as exc:
            raise RecordError(f"the run record at {self.where} could not be made: {reason(exc)}") from None
        await self._register()
        await self.sweep_lost()

    async def close(self) -> None:
        await self._lease.stop()
        with contextlib.suppress(RecordError):  # a full disk: the owner is found gone later
            await self._in_transaction("the owner's end", self._end_owner)
        if self._record_thread is not None:
            await self._record_thread.close()
        await self.engine.dispose()

    async def _register(self) -> None:
        me = self.owner
        entry = sa.insert(owners).values(id=me.id, machine=me.machine, pid=me.pid, pid_start=me.pid_start,
                                         heartbeat_at=utc_now(), address=me.address)
        await self._in_transaction("this process's owner entry", lambda conn: conn.execute(entry))

    def _end_owner(self, conn: sa.Connection) -> None:
        conn.execute(sa.delete(owners).where(owners.c.id == self.owner.id))
        e2b_command_rows.forget_owners(conn, [self.owner.id])

    async def advertise(self, address: str) -> None:
        """Say where this process answers whether it still runs (a server's own URL,
        ``record.liveness``): the other processes on the record find it gone at once once it ended."""
        self.owner = dataclasses.replace(self.owner, address=address)
        said = sa.update(owners).where(owners.c.id == self.owner.id).values(address=address)
        await self._in_transaction("this process's address", lambda conn: conn.execute(said))

    async def put_e2b_sandbox(self, row: dict[str, Any]) -> None:
        """A shared E2B sandbox's row (the ``e2b_sandboxes`` columns), made."""
        await self._in_transaction("an E2B sandbox", lambda conn: conn.execute(sa.insert(e2b_sandboxes).values(row)))

    async def e2b_sandbox(self, sandbox_id: str) -> dict[str, Any] | None:
        """A shared E2B sandbox's row, None when there is none (never made, or killed)."""
        query = sa.select(e2b_sandboxes).where(e2b_sandboxes.c.id == sandbox_id)
        found = await self._reading(lambda conn: conn.execute(query).mappings().first())
        if found is None:
            return None
        return utc_row(found, "started_at", "end_at")

    async def e2b_sandboxes_of(self, key_name: str) -> list[dict[str, Any]]:
        """The shared E2B sandboxes' rows of one key."""
        query = sa.select(e2b_sandboxes).where(e2b_sandboxes.c.key_name == key_name)
        found = await self._reading(lambda conn: conn.execute(query).mappings().all())
        return [utc_row(row, "started_at", "end_at") for row in found]

    async def update_e2b_sandbox(self, sandbox_id: str, **values: Any) -> None:
        change = sa.update(e2b_sandboxes).where(e2b_sandboxes.c.id == sandbox_id).values(**values)
        await self._in_transaction("an E2B sandbox's change", lambda conn: conn.execute(change))

    async def forget_e2b_sandbox(self, sandbox_id: str) -> None:
        """Its row and its commands' rows gone (killed: its commands ended)."""
        def forget(conn: sa.Connection) -> None:
            conn.execute(sa.delete(e2b_sandboxes).where(e2b_sandboxes.c.id == sandbox_id))
            e2b_command_rows.forget(conn, sandbox_id)
        await self._in_transaction("an E2B sandbox's end", forget)

    async def e2b_command_started(self, row: dict[str, Any]) -> None:
        """A shared sandbox's running command (the ``e2b_commands`` columns but owner: this process)."""
        mine = {**row, "owner": self.owner.id}
        await self._in_transaction("an E2B command", lambda conn: e2b_command_rows.started(conn, mine))

    async def e2b_command_ended(self, sandbox_id: str, pid: int) -> None:
        await self._in_transaction("an E2B command's end",
                                   lambda conn: e2b_command_rows.ended(conn, sandbox_id, pid, self.owner.id))

    async def e2b_commands(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The sandbox's running commands of every server on the record, each with ``address``."""
        return await self._reading(lambda conn: e2b_command_rows.of_sandbox(conn, sandbox_id))

    async def forget_e2b_commands(self, sandbox_id: str) -> None:
        await self._in_transaction("an E2B sandbox's commands", lambda conn: e2b_command_rows.forget(conn, sandbox_id))

    async def claim_create_key(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The key's row made (None), or the row already there (another create came first)."""
        where = sa.and_(e2b_create_keys.c.key_name == row["key_name"], e2b_create_keys.c.key == row["key"])

        def claim(conn: sa.Connection) -> dict[str, Any] | None:
            found = conn.execute(sa.select(e2b_create_keys).where(where)).mappings().first()
            if found is not None:
                return utc_row(found, "at")
            conn.execute(sa.insert(e2b_create_keys).values(row))
            return None

        try:
            return await self._in_transaction("an idempotency key", claim)
        except RecordError:  # the same key made at once elsewhere: its row is there now
            return await self._in_transaction("an idempotency key", claim)

    async def keyed_create(self, key_name: str, key: str, sandbox_id: str | None) -> None:
        """The key's sandbox noted (sandbox_id), or the key forgotten (None)."""
        where = sa.and_(e2b_create_keys.c.key_name == key_name, e2b_create_keys.c.key == key)
        change = (sa.delete(e2b_create_keys).where(where) if sandbox_id is None
                  else sa.update(e2b_create_keys).where(where).values(sandbox_id=sandbox_id))
        await self._in_transaction("an idempotency key", lambda conn: conn.execute(change))

    async def answers(self) -> bool:
        """Whether the record answers a read now (a server's readiness: ``guilds.web.health``)."""
        async with self.engine.connect() as conn:
            await conn.execute(sa.select(sa.literal(1)))
        return True

    async def heartbeat(self) -> None:
        """Refresh this process's heartbeat (register again if another process forgot it)."""
        beat = sa.update(owners).where(owners.c.id == self.owner.id).values(heartbeat_at=utc_now())
        if await self._in_transaction("the heartbeat", lambda conn: conn.execute(beat).rowcount) == 0:
            await self._register()

    async def sweep_lost(self) -> list[tuple[str, int]]:
        """Record as ``lost`` the running calls of every owner known to be gone (or no longer
        registered, or found gone when asked: ``owners.is_gone_now``); their (run, seq)."""
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.select(owners).where(owners.c.id != self.owner.id))).mappings().all()
            orphaned = (await conn.execute(ORPHANED)).scalars().all()
        now, here = utc_now(), machine_id()
        found = [Owner(**utc_row(r)) for r in rows]
        gone = [o.id for o, ended in zip(found, await asyncio.gather(*(is_gone_now(o, now, here) for o in found)),
                                         strict=True) if ended]
        return await self.sweep_owners([*gone, *orphaned], now)

    async def sweep_owners(self, gone: Sequence[str], now: datetime | None = None) -> list[tuple[str, int]]:
        """Record as ``lost`` the running calls of these owners, known to have ended, and forget them."""
        if not gone:
            return []
        at = now or utc_now()

        def sweep(conn: sa.Connection) -> list[tuple[str, int]]:
            running = conn.execute(RUNNING.where(calls.c.owner.in_(gone), calls.c.status == "running")).all()
            lost = finish_lost(conn, running, at)
            conn.execute(sa.delete(owners).where(owners.c.id.in_(gone)))
            e2b_command_rows.forget_owners(conn, gone)
            return lost
        return await self._in_transaction("the lost calls", sweep)

    async def _in_transaction(self, what: str, work: Callable[[sa.Connection], T], *, prepared: bool = False) -> T:
        """work(conn) in one write transaction (see the module docstring); a database
        failure (a full disk) becomes RecordError naming ``what``. ``prepared``: work runs
        only CALL_WRITES and the allocation, prepared on a SQLite file (``record.prepared``)."""
        writer = self._loop_writer() if prepared else None
        if writer is not None:  # no lock to take, no hop: written now, or handed to SQLAlchemy below
            written, done = writer.write_prepared(work)
            if written:
                return done  # type: ignore[return-value]  # work's own value
            prepared = False

        async def attempt() -> T:
            if self._record_thread is not None:
                return await self._record_thread.run(work, write=True, prepared=prepared)
            async with self.engine.begin() as conn:
                return await conn.run_sync(work)

        try:
            async with self._write_lock or contextlib.nullcontext():
                return await self._again_while_busy(attempt)
        except (sa.exc.DBAPIError, OSError) as exc:
            raise RecordError(f"the run record at {self.where} could not be written ({what}): "
                              f"{reason(exc)}") from None

    def _loop_writer(self) -> RecordThread | None:
        """The record thread when a prepared write may run now, on the event loop, without a
        wait: its ``writes_now``, and no other write of this Store under way (the lock free)."""
        thread, lock = self._record_thread, self._write_lock
        if thread is None or lock is None or lock.locked() or not thread.writes_now():
            return None
        return thread

    async def _again_while_busy(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """attempt() (a whole transaction); on SQLite run again while it fails with
        "database is locked" at once (RECORD_BUSY_RETRY_SECONDS)."""
        deadline, pause = time.monotonic() + RECORD_BUSY_WAIT_SECONDS, RECORD_BUSY_RETRY_SECONDS
        while True:
            try:
                return await attempt()
            except sa.exc.OperationalError as exc:
                if not (self.sqlite and is_locked(exc)) or time.monotonic() > deadline:
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
                         started_at: datetime, budget: int, key: CallKey | None = None) -> Slot:
        """Give the call its seq and a slot within the run's budget; record it as running.

        A call past the budget gets ``admitted=False``: it is recorded, not counted.
        ``key``: the call's key, made in the same transaction; ``call_keys.KeyHeld`` (nothing
        recorded) when it names a call already.
        """
        begin = self._call_start(run_id, agent_id, tool, args, call_id, started_at, budget, key)
        return self._begun(*await self._in_transaction(f"the start of a {tool[:40]!r} call", begin,
                                                       prepared=key is None))

    def begin_call_at_once(self, *, run_id: str, agent_id: str, tool: str, args: Any, call_id: str,
                           started_at: datetime, budget: int) -> Slot | None:
        """``begin_call`` of a call without a key when it is written now, prepared, on the event
        loop (a SQLite file, no other write under way: ``_loop_writer``): its caller needs no task
        to see it through a cancellation. None: nothing is written, ``begin_call`` writes it."""
        writer = self._loop_writer()
        if writer is None:
            return None
        _, done = writer.write_prepared(self._call_start(run_id, agent_id, tool, args, call_id, started_at,
                                                         budget, None))
        return None if done is None else self._begun(*done)

    def _call_start(self, run_id: str, agent_id: str, tool: str, args: Any, call_id: str, started_at: datetime,
                    budget: int, key: CallKey | None) -> Callable[[sa.Connection], tuple[int, int, bool]]:
        """The transaction of a call's start (``begin_call``): its (seq, used, admitted)."""
        def begin(conn: sa.Connection) -> tuple[int, int, bool]:
            allocated = conn.execute(self._allocate, {
                "run_id": run_id, "agent_id": agent_id, "now": started_at, "budget": budget,
            })
            owner, seq, used, admitted_seq = allocated.one()
            if owner != agent_id:
                raise another_agents_run(run_id, owner, agent_id)
            conn.execute(INSERT_CALL, {
                "run_id": run_id, "seq": seq, "call_id": call_id, "tool": tool, "args": args,
                "counted": admitted_seq == seq, "status": "running", "started_at": started_at,
                "is_error": False, "cut": False, "owner": self.owner.id,
            })
            if key is not None:
                keys.claim(conn, self._insert, agent_id, key, run_id, seq, started_at)
            return seq, used, admitted_seq == seq
        return begin

    def _begun(self, seq: int, used: int, admitted: bool) -> Slot:
        """A call's start written: its slot, and one more call whose end is awaited (``settled``)."""
        self._in_flight += 1
        self._idle.clear()
        return Slot(seq=seq, used=used, admitted=admitted)

    async def mark_key_sent(self, agent_id: str, key: CallKey) -> None:
        """The keyed call's request is about to be sent to the sandbox: from now on it may have run."""
        await self._in_transaction("a call key", lambda conn: keys.mark_sent(conn, agent_id, key))

    async def keyed_call(self, agent_id: str, key: CallKey) -> Keyed | None:
        """The call a key names, with its owner's entry; None when the key names none."""
        return await self._reading(lambda conn: keys.keyed(conn, agent_id, key))

    async def finish_call(self, *, run_id: str, seq: int, text: str, is_error: bool, meta: dict,
                          cut: bool, finished_at: datetime, duration_ms: int, row: str,
                          status: str = "done", remaining: int | None = None) -> None:
        """Record a call's result, and its amounts in its run's totals (one transaction);
        status "done", or "cancelled" for a call stopped midway.

        ``text`` is the body, ``remaining`` the trailer's count (None: none), ``meta`` the tool's own
        metadata: the call's fields are columns already (``values.CALL_FIELDS``).
        """
        try:
            params = {
                "k_run_id": run_id, "k_seq": seq, "text": text, "is_error": is_error, "meta": meta,
                "cut": cut, "status": status, "finished_at": finished_at, "duration_ms": duration_ms,
                "row": row, "owner": None, "remaining": remaining,
            }
            await self._in_transaction(f"the result of call {seq} of run {run_id}",
                                       lambda conn: finish(conn, params), prepared=True)
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
        return await self._reading(lambda conn: file_reads(conn, run_id, before_seq))

    async def reads_since_reset(self, run_id: str, before_seq: int) -> list[tuple[int, dict, int]]:
        """``file_reads`` made after the run's latest context reset: what the read ledger
        may offer, in one round trip."""
        def read(conn: sa.Connection) -> list[tuple[int, dict, int]]:
            after, rewound = reset_seq(conn, run_id), rewound_spans(conn, run_id)
            return [read for read in file_reads(conn, run_id, before_seq)
                    if read[0] > after and not any(first <= read[0] <= last for first, last in rewound)]
        return await self._reading(read)

    async def mark_context_reset(self, run_id: str, at: datetime) -> int:
        """Record that the run's model context was compacted or rewound now; the
        run's last seq given out (0 for a run with no call yet)."""
        def mark(conn: sa.Connection) -> int:
            last = conn.execute(sa.select(runs.c.next_seq).where(runs.c.id == run_id)).scalar() or 0
            conn.execute(sa.insert(context_marks), {"run_id": run_id, "after_seq": last, "at": at})
            return last
        return await self._in_transaction(f"a context reset of run {run_id}", mark)

    async def mark_rewind(self, run_id: str, from_seq: int, at: datetime) -> int:
        """Record that the run's files went back to before call from_seq: no read of
        from_seq or later, up to now, is pointed to again. The run's last seq."""
        def mark(conn: sa.Connection) -> int:
            last = conn.execute(sa.select(runs.c.next_seq).where(runs.c.id == run_id)).scalar() or 0
            conn.execute(sa.insert(context_marks), {"run_id": run_id, "after_seq": last, "at": at,
                                                    "from_seq": from_seq})
            return last
        return await self._in_transaction(f"a rewind of run {run_id}", mark)

    # --- the checkpoints of agents' homes (``guilds.checkpoints``)
    async def add_checkpoint(self, row: dict[str, Any]) -> None:
        """Record a checkpoint taken (the ``checkpoints`` table's columns)."""
        await self._in_transaction(f"the checkpoint {row['id']}",
                                   lambda conn: conn.execute(sa.insert(checkpoints), row))

    async def mark_checkpoints_pruned(self, ids: Iterable[str]) -> None:
        pruned = sorted(ids)
        if pruned:
            await self._in_transaction("the pruned checkpoints", lambda conn: conn.execute(
                sa.update(checkpoints).where(checkpoints.c.id.in_(pruned)).values(status="pruned")))

    async def checkpoints_of_run(self, run_id: str) -> list[dict[str, Any]]:
        """The run's checkpoints, in the order of its calls (before, then after)."""
        query = (sa.select(checkpoints).where(checkpoints.c.run_id == run_id)
                 .order_by(checkpoints.c.seq, checkpoints.c.at))
        return await self._reading(lambda conn: [dict(r) for r in conn.execute(query).mappings()])

    async def context_reset_seq(self, run_id: str) -> int:
        """The seq after which the run's latest context reset came (0: none)."""
        return await self._reading(lambda conn: reset_seq(conn, run_id))

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
        query = sa.select(*FLOW_COLUMNS).where(calls.c.run_id == run_id)
        if before_seq is not None:
            query = query.where(calls.c.seq < before_seq)
        query = query.order_by(calls.c.seq.desc()).limit(limit)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [CallRecord.from_row(r) for r in reversed(rows)]

    async def flow_after(self, run_id: str, after_seq: int, limit: int = FLOW_PAGE) -> list[CallRecord]:
        """The first ``limit`` calls of a run after ``after_seq``, in seq order (for live updates)."""
        query = (sa.select(*FLOW_COLUMNS).where(calls.c.run_id == run_id, calls.c.seq > after_seq)
                 .order_by(calls.c.seq).limit(limit))
        async with self.engine.connect() as conn:
            return [CallRecord.from_row(r) for r in (await conn.execute(query)).mappings()]

    # --- the egress proxy's decisions
    async def add_egress(self, decisions: list[dict[str, Any]]) -> None:
        """Record decisions, each the ``egress`` table's columns but its id."""
        if decisions:
            await self._in_transaction("the egress decisions",
                                       lambda conn: conn.execute(sa.insert(egress), decisions))

    async def runs_of_agent(self, agent_id: str, run_ids: Iterable[str]) -> set[str]:
        """Those of run_ids the record holds as agent_id's runs."""
        wanted = sorted(set(run_ids))
        pages = [wanted[i:i + RUN_IDS_PAGE] for i in range(0, len(wanted), RUN_IDS_PAGE)]

        def work(conn: sa.Connection) -> set[str]:
            return {run for page in pages for run in conn.execute(
                sa.select(runs.c.id).where(runs.c.agent_id == agent_id, runs.c.id.in_(page))).scalars()}
        return await self._reading(work) if pages else set()

    async def egress_of_call(self, run_id: str, call_id: str) -> list[dict[str, Any]]:
        """A call's egress decisions, in the order they were made."""
        query = (sa.select(egress).where(egress.c.run_id == run_id, egress.c.call_id == call_id)
                 .order_by(egress.c.at, egress.c.id))
        return await self._reading(lambda conn: [dict(r) for r in conn.execute(query).mappings()])

    async def egress_counts(self, run_id: str) -> dict[str, int]:
        """A run's egress decisions counted: {"allowed": n, "refused": m}."""
        query = (sa.select(egress.c.allowed, sa.func.count()).where(egress.c.run_id == run_id)
                 .group_by(egress.c.allowed))
        rows = await self._reading(lambda conn: conn.execute(query).all())
        counts = {"allowed": 0, "refused": 0}
        for allowed, n in rows:
            counts["allowed" if allowed else "refused"] += n
        return counts

    # --- the agents made on demand (``record.agent_rows``)
    async def admit_agent(self, row: dict[str, Any], *, max_total: int, max_per_owner: int,
                          evictable: Sequence[str] = ()) -> str | None:
        """Record a new agent as ``making`` within the caps; ``agent_rows.AgentRefused`` past one.
        At the server's cap one of the pooled agents ``evictable`` names is retired: its id."""
        return await self._in_transaction(
            f"the new agent {row['id']}", lambda conn: agent_rows.admit(conn, row, max_total, max_per_owner, evictable))

    async def admit_agents(self, rows: Sequence[dict[str, Any]], *, max_total: int, max_per_owner: int,
                           evictable: Sequence[str] = ()) -> list[str]:
        """``admit_agent`` of every row in one transaction: all are recorded, or none (the refusal
        raised); the ids of the pooled agents retired to make room."""
        return await self._in_transaction(
            f"{len(rows)} new agents",
            lambda conn: agent_rows.admit_all(conn, rows, max_total, max_per_owner, evictable))

    async def mark_agents(self, agent_ids: Sequence[str], status: str) -> int:
        """Set the status of every agent of agent_ids in one transaction; the rows changed."""
        return await self._in_transaction(f"the status of {len(agent_ids)} agents",
                                          lambda conn: agent_rows.mark_all(conn, agent_ids, status))

    async def adopt_agent(self, candidates: Sequence[str], change: dict[str, Any], *, max_per_owner: int) -> str | None:
        """One of the pooled candidates made live with ``change`` (``agent_rows.adopt``); its id or None."""
        return await self._in_transaction(
            f"an agent for {change['owner']}", lambda conn: agent_rows.adopt(conn, candidates, change, max_per_owner))

    async def adopt_agents(self, candidates: Sequence[str], change: dict[str, Any], *, max_per_owner: int,
                           n: int) -> tuple[list[str], int]:
        """Up to n of the pooled candidates made live with ``change`` in one transaction
        (``agent_rows.adopt_each``): the ids taken, and how many candidates were looked at."""
        return await self._in_transaction(
            f"agents for {change['owner']}",
            lambda conn: agent_rows.adopt_each(conn, candidates, change, max_per_owner, n))

    async def hand_over_agent(self, agent_id: str, holder: str, new_holder: str) -> bool:
        """A pooled agent of a gone process taken by this one (``agent_rows.hand_over``)."""
        return await self._in_transaction(f"the pooled agent {agent_id}",
                                          lambda conn: agent_rows.hand_over(conn, agent_id, holder, new_holder))

    async def mark_agent(self, agent_id: str, status: str, at: datetime | None = None, *,
                         only_from: Sequence[str] = ()) -> bool:
        """Set an agent's status (``agent_rows.LIVE``, ``REMOVED`` at ``at``), when it has one of
        ``only_from`` if given; False when unknown (or not so)."""
        changed = await self._in_transaction(f"the status of agent {agent_id}",
                                             lambda conn: agent_rows.mark(conn, agent_id, status, at, only_from))
        return bool(changed)

    async def expire_agent(self, agent_id: str, expires_at: datetime | None) -> bool:
        """Give a live agent a new expiry (None: never); False when no live agent has that id."""
        changed = await self._in_transaction(f"the expiry of agent {agent_id}",
                                             lambda conn: agent_rows.expire(conn, agent_id, expires_at))
        return bool(changed)

    async def forget_agent(self, agent_id: str) -> None:
        """Drop the row of an agent whose make failed."""
        await self._in_transaction(f"the failed agent {agent_id}", lambda conn: agent_rows.forget(conn, agent_id))

    async def owner_ids(self) -> set[str]:
        """The ids of the processes the record holds as running (the gone are swept at each open)."""
        return set(await self._reading(lambda conn: conn.execute(sa.select(owners.c.id)).scalars().all()))

    async def agents(self, *, owner: str | None = None, agent_id: str | None = None,
                     statuses: tuple[str, ...] = agent_rows.HELD) -> list[agent_rows.AgentRecord]:
        """The agents made on demand with one of these statuses (default: live or being made),
        of one owner or with one id when given, oldest first."""
        where: list[Any] = [agents.c.status.in_(statuses)]
        if owner is not None:
            where.append(agents.c.owner == owner)
        if agent_id is not None:
            where.append(agents.c.id == agent_id)
        return await self._reading(lambda conn: agent_rows.read(conn, *where))

    # --- the app's list of agents (``record.agent_listing``)
    async def agents_listed(self, *, owner: str | None = None, statuses: tuple[str, ...] = (),
                            besides: str | None = None, limit: int = DEFAULT_PAGE,
                            offset: int = 0) -> list[agent_listing.AgentListing]:
        """The record's agents, newest first, with their runs counted: those made on demand (of
        owner, with one of statuses, when given) and, without a filter, those only runs name,
        but ``besides``."""
        query = agent_listing.query(owner=owner, statuses=statuses, besides=besides, limit=limit, offset=offset)
        rows = await self._reading(lambda conn: conn.execute(query).mappings().all())
        return [agent_listing.AgentListing.from_row(r) for r in rows]

    async def agent_run_totals(self, agent_id: str) -> tuple[int, datetime | None]:
        """An agent's runs: how many, and its latest call's start (None: no run)."""
        row = await self._reading(lambda conn: conn.execute(agent_listing.run_totals(agent_id)).one())
        return int(row.runs), agent_listing.utc(row.last_call_at)

    async def agent_statuses(self) -> list[str]:
        """The statuses the record's agents made on demand have, in order."""
        return await self._reading(lambda conn: list(conn.execute(agent_listing.statuses()).scalars()))

    # --- the MCP front's run principals and tasks
    async def claim_run(self, run_id: str, principal: str, agent_id: str | None = None) -> str:
        """The principal of run_id: ``principal`` when this is the run's first claim, else the one
        recorded (two first claims at once: one insert wins, both read it).

        With ``agent_id``, a run the record holds for another agent is refused (``BadInput``,
        as ``begin_call`` refuses it) in the same transaction, before anything is claimed."""
        claim = (dialect_module(self.sqlite).insert(run_principals)
                 .values(run_id=run_id, principal=principal).on_conflict_do_nothing(index_elements=["run_id"]))
        recorded = sa.select(run_principals.c.principal).where(run_principals.c.run_id == run_id)
        agent_of_run = sa.select(runs.c.agent_id).where(runs.c.id == run_id)

        def claimed(conn: sa.Connection) -> str:
            owner = conn.execute(agent_of_run).scalar_one_or_none() if agent_id is not None else None
            if owner is not None and owner != agent_id:
                raise another_agents_run(run_id, owner, agent_id)
            conn.execute(claim)
            return str(conn.execute(recorded).scalar_one())
        return await self._in_transaction(f"the principal of run {run_id}", claimed)

    async def sessionless_run(self, agent_id: str, principal: str, fresh: str, idle_seconds: float,
                              named: str | None = None) -> str:
        """The principal's current sessionless run of agent_id, its use moved to now: named when
        given (it becomes the current one), else the current one when it was used less than
        idle_seconds ago, else fresh. One statement: servers asking at once get one run."""
        now = datetime.now(UTC)
        table = sessionless_runs
        insert = dialect_module(self.sqlite).insert(table).values(agent_id=agent_id, principal=principal,
                                                                  run_id=named or fresh, at=now)
        kept = sa.case((table.c.at < now - timedelta(seconds=idle_seconds), fresh), else_=table.c.run_id)
        upsert = insert.on_conflict_do_update(index_elements=["agent_id", "principal"],
                                              set_={"run_id": named or kept, "at": now}).returning(table.c.run_id)
        return await self._in_transaction("the current sessionless run",
                                          lambda conn: str(conn.execute(upsert).scalar_one()))

    async def sessionless_used(self, agent_id: str, principal: str, run_id: str) -> None:
        """A call of run_id ended: when it is the principal's current sessionless run, its idle
        time counts from now."""
        touch = (sa.update(sessionless_runs).values(at=datetime.now(UTC))
                 .where(sessionless_runs.c.agent_id == agent_id, sessionless_runs.c.principal == principal,
                        sessionless_runs.c.run_id == run_id))
        await self._in_transaction("the current sessionless run", lambda conn: conn.execute(touch))

    async def session_start(self, kind: str, digest: str, principal: str, terms: shared_sessions.Terms) -> None:
        """A session of kind made (``record.session_rows``)."""
        now = utc_now()
        await self._in_transaction(f"an {kind} session",
                                   lambda conn: shared_sessions.start(conn, kind, digest, principal, now, terms))

    async def session_holds(self, kind: str, digest: str, principal: str, terms: shared_sessions.Terms) -> bool:
        """Whether digest is a live session of kind and principal; its use written when due."""
        now = utc_now()
        held = await self._reading(lambda conn: shared_sessions.state(conn, kind, digest, principal, now, terms))
        if held is shared_sessions.Held.STALE_USE:
            await self._in_transaction(f"an {kind} session's use",
                                       lambda conn: shared_sessions.touch(conn, digest, now))
        return held is not shared_sessions.Held.NO

    async def session_end(self, kind: str, digest: str) -> bool:
        """The session ends: False when digest was none of kind."""
        return await self._in_transaction(f"an {kind} session's end",
                                          lambda conn: shared_sessions.end(conn, kind, digest))

    async def create_task(self, **values: Any) -> None:
        """Record a new task (the ``tasks`` columns), owned by this process."""
        row = {**values, "owner": self.owner.id}
        await self._in_transaction("a new task", lambda conn: conn.execute(sa.insert(tasks), row))

    async def update_task(self, task_id: str, **values: Any) -> None:
        """Change a task's columns (an ended task: ``owner=None``)."""
        change = sa.update(tasks).where(tasks.c.id == task_id).values(**values)
        await self._in_transaction(f"task {task_id[:12]}", lambda conn: conn.execute(change))

    async def ask_cancel(self, task_id: str) -> None:
        """Note that a client asked to cancel a working task another process runs: that
        process reads it (``cancel_asked``) and cancels the call."""
        change = (sa.update(tasks).where(tasks.c.id == task_id, tasks.c.status == "working")
                  .values(cancel_asked=datetime.now(UTC)))
        await self._in_transaction(f"task {task_id[:12]}", lambda conn: conn.execute(change))

    async def cancel_asked(self, task_id: str) -> bool:
        """Whether a cancel of the task was asked through another process (``ask_cancel``)."""
        query = sa.select(tasks.c.cancel_asked).where(tasks.c.id == task_id)
        return await self._reading(lambda conn: conn.execute(query).scalar_one_or_none()) is not None

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

