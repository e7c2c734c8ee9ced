"""The record's schema made once, whichever process comes first: real processes, started
together on a fresh record (SQLite in a fresh folder, a fresh PostgreSQL schema), many rounds."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from guilds.record.engine import normalize_url
from guilds.record.schema import metadata
from guilds.record.store import Store

PROCESSES = 4
ROUNDS = int(os.environ.get("RACE_ROUNDS", "30"))
RACER = r"""
import asyncio, os, sys
from datetime import datetime, timezone
from guilds.record.store import Store

async def once(url, name):
    async with Store(url) as store:
        now = datetime.now(timezone.utc)
        slot = await store.begin_call(run_id="race", agent_id="a", tool="shell", args={}, call_id=name,
                                      started_at=now, budget=1000)
        await store.finish_call(run_id="race", seq=slot.seq, text="ok", is_error=False, meta={}, cut=False,
                                finished_at=now, duration_ms=1, row="Run")

print("ready", flush=True)
for start in sys.argv[2:]:
    fd, url = start.split("=", 1)
    os.read(int(fd), 1)  # every racer waits here; the test closes the pipe's other end to start the round at once
    try:
        asyncio.run(once(url, sys.argv[1]))
        print("ok", flush=True)
    except Exception as error:
        print(" ".join(f"{type(error).__name__}: {error}".split()), flush=True)
"""


def race(urls: list[str], n: int, before_each: Callable[[str], None] = lambda url: None) -> list[list[str]]:
    """n processes, started once, open a Store on each url in turn, all at the same moment
    (before_each(url) first); per round, what each said ("ok" or its error). The processes'
    imports are paid once, so rounds are cheap and the race is between warm processes."""
    pipes = [os.pipe() for _ in urls]
    starts = [f"{r}={url}" for (r, _), url in zip(pipes, urls, strict=True)]
    procs: list[subprocess.Popen[str]] = []
    said = []
    try:
        for i in range(n):
            procs.append(subprocess.Popen(  # noqa: PERF401 - each one started is stopped below, even if a later one fails
                [sys.executable, "-c", RACER, f"p{i}", *starts], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, pass_fds=tuple(r for r, _ in pipes)))
        for proc in procs:
            assert proc.stdout.readline() == "ready\n"
        for (_, start_w), url in zip(pipes, urls, strict=True):
            before_each(url)
            os.close(start_w)
            said.append([proc.stdout.readline().strip() for proc in procs])
    finally:
        for r, w in pipes:
            os.close(r)
            with contextlib.suppress(OSError):
                os.close(w)
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert (proc.returncode, err) == (0, ""), said
    return said


async def _count(url: str) -> int:
    async with Store(url) as store:
        return len(await store.calls("race"))


def test_sqlite_processes_starting_together_on_a_fresh_folder(tmp_path):
    urls = [f"sqlite:///{tmp_path / f'round{round_}' / 'guilds.db'}" for round_ in range(ROUNDS)]
    said = race(urls, PROCESSES, lambda url: Path(url.removeprefix("sqlite:///")).parent.mkdir())
    assert said == [["ok"] * PROCESSES] * ROUNDS
    assert [asyncio.run(_count(url)) for url in urls] == [PROCESSES] * ROUNDS


async def _drop_all(url: str) -> None:
    engine = create_async_engine(normalize_url(url))
    async with engine.begin() as conn:
        await conn.run_sync(metadata.drop_all)
    await engine.dispose()


@pytest.mark.skipif(not os.environ.get("GUILDS_TEST_POSTGRES_URL"), reason="GUILDS_TEST_POSTGRES_URL is not set")
def test_postgresql_processes_starting_together_on_a_fresh_schema():
    url = os.environ["GUILDS_TEST_POSTGRES_URL"]
    began: list[str] = []
    counts: list[int] = []

    def fresh_schema(url: str) -> None:
        if began:  # the round before's calls, counted before its tables are dropped
            counts.append(asyncio.run(_count(url)))
        began.append(url)
        asyncio.run(_drop_all(url))

    said = race([url] * ROUNDS, PROCESSES, fresh_schema)
    counts.append(asyncio.run(_count(url)))
    asyncio.run(_drop_all(url))
    assert said == [["ok"] * PROCESSES] * ROUNDS
    assert counts == [PROCESSES] * ROUNDS


async def _old_record(url: str) -> None:
    """A record as made before calls had owners, with a call its (older) process left running."""
    async with Store(url) as store:
        await store.begin_call(run_id="old", agent_id="a", tool="shell", args={"command": "make"}, call_id="c1",
                               started_at=datetime.now(UTC), budget=10)
    engine = create_async_engine(normalize_url(url))
    async with engine.begin() as conn:
        await conn.execute(sa.text("DROP INDEX IF EXISTS ix_calls_owner"))
        await conn.execute(sa.text("ALTER TABLE calls DROP COLUMN owner"))
    await engine.dispose()


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not os.environ.get("GUILDS_TEST_POSTGRES_URL"), reason="GUILDS_TEST_POSTGRES_URL is not set"))])
def test_a_record_from_before_owners_gets_the_column_and_its_running_calls_are_lost(tmp_path, db):
    url = os.environ["GUILDS_TEST_POSTGRES_URL"] if db == "postgresql" else f"sqlite:///{tmp_path / 'guilds.db'}"
    if db == "postgresql":
        asyncio.run(_drop_all(url))
    asyncio.run(_old_record(url))
    said = race([url], PROCESSES)  # they all find the old record: one adds the column
    assert said == [["ok"] * PROCESSES]

    async def check() -> None:
        async with Store(url) as store:
            calls = await store.calls("old")
        assert (calls[0].status, calls[0].row) == ("lost", "Run make · lost")

    asyncio.run(check())
    if db == "postgresql":
        asyncio.run(_drop_all(url))


# --- a busy record: many `guilds call` processes at once, under load -------------------
CALLERS = 64
CALLER = r"""
import os, sys
from guilds.fronts.cli import main
import guilds.record.store, guilds.toolbox  # imported before the start: the calls meet the record together

print("ready", flush=True)
os.read(int(sys.argv[4]), 1)  # every caller waits here; the test closes the pipe's other end to start them at once
sys.exit(main(["call", "shell", '{"command": "true"}', "--config", sys.argv[1], "--run", sys.argv[2]],
              env={**os.environ, "GUILDS_DATA": sys.argv[3]}))
"""
BUSY = "while True: pass"


def callers_at_once(cfg: Path, data: Path, runs: list[str]) -> list[tuple[int, str]]:
    """One real `guilds call` per run, all started at the same moment; their (exit code, stderr)."""
    start_r, start_w = os.pipe()
    procs = []
    try:
        for run in runs:
            procs.append(subprocess.Popen(  # noqa: PERF401 - each one started is waited for below
                [sys.executable, "-c", CALLER, str(cfg), run, str(data), str(start_r)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=(start_r,)))
        for proc in procs:
            assert proc.stdout.readline() == "ready\n"
    finally:
        os.close(start_w)
        os.close(start_r)
    return [(proc.wait(timeout=300), proc.communicate()[1]) for proc in procs]


@contextlib.contextmanager
def cpu_load(processes: int):
    """A load of at least processes runnable processes (more than the machine's CPUs want):
    as many busy loops as the load average (1 min) lacks, stopped after. A machine already
    that busy (the whole suite running beside) gets none: it is the load."""
    lacking = max(0, math.ceil(processes - os.getloadavg()[0]))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(lacking)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


async def _finished_calls(url: str, runs: list[str]) -> dict[str, int]:
    """run -> how many of its calls the record holds finished."""
    async with Store(url) as store:
        return {run: sum(call.status != "running" for call in await store.calls(run)) for run in runs}


@pytest.mark.slow
def test_sqlite_64_calls_at_once_under_load_all_recorded_on_a_fresh_and_an_existing_record(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[agent]\nhome = "home"\nsandbox = "local"\n')
    cfg.chmod(0o600)
    (tmp_path / "home").mkdir()
    data = tmp_path / "data"
    with cpu_load(2 * (os.cpu_count() or 1)):
        for round_ in ("fresh", "existing"):
            runs = [f"{round_}-{i}" for i in range(CALLERS)]
            results = callers_at_once(cfg, data, runs)
            assert [err for code, err in results if code] == [], round_
            recorded = asyncio.run(_finished_calls(f"sqlite:///{data / 'guilds.db'}", runs))
            assert recorded == dict.fromkeys(runs, 1), round_
