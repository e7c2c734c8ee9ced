"""Where a shell call of `true` spends its time, stage by stage, against the spawn floors.

Run: .venv/bin/python bench/shell_call_stages_bench.py [--calls N] [--backends local,bwrap,docker]

The same calls as bench/shell_call_bench.py (shell `true` through ``Toolbox.call`` on
the resident transport, the run record on SQLite), taking turns with two floors:
`bash -c true` spawned from the orchestrator's event loop (asyncio, the floor of
shell_call_bench) and a bare ``os.posix_spawn`` of it with its ``waitpid`` (bash
alone). Each stage of a call is timed with ``time.perf_counter_ns`` marks put
around the toolbox's own methods for this run only (the code is not changed):

    before the record      the call's id, its redacted arguments, the trace
    the record's start     the run's seq and budget slot, the call's row (one transaction)
    the request sent       the request built, framed and written to the channel
    the helper             from the request written to the answer readable:
                           the worker woken, the shell op, bash, the answer frame
    the answer taken       the frame read, decoded, and the call's await resumed
    the pipeline           redaction, caps and trailers, the row's text
    the record's end       the result and the run's totals (one transaction)
    after the record       the egress rows, the observer

Medians per stage over the calls (their sum is not the call's median). The marks
cost about a microsecond each.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.record.store import Store
from guilds.toolbox import resident_channel, toolbox
from resident_bench import interleaved, median_ms, spawn
from shell_call_bench import close, shell_call, toolboxes

STAGES = (
    ("before the record", "call", "begin"),
    ("the record's start", "begin", "begun"),
    ("the request sent", "begun", "sent"),
    ("the helper", "sent", "readable"),
    ("the answer taken", "readable", "answered"),
    ("the pipeline", "answered", "finish"),
    ("the record's end", "finish", "finished"),
    ("after the record", "finished", "returned"),
)

marks: dict[str, int] = {}


def mark(name: str) -> None:
    marks[name] = time.perf_counter_ns()


def around(owner: Any, method: str, before: str | None, after: str | None) -> None:
    """owner.method with marks before and after each run of it (a coroutine function awaited)."""
    inner: Callable[..., Any] = getattr(owner, method)
    if asyncio.iscoroutinefunction(inner):
        @functools.wraps(inner)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            if before:
                mark(before)
            try:
                return await inner(*args, **kwargs)
            finally:
                if after:
                    mark(after)
        setattr(owner, method, timed_async)
        return

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if before:
            mark(before)
        try:
            return inner(*args, **kwargs)
        finally:
            if after:
                mark(after)
    setattr(owner, method, timed)


def put_marks() -> None:
    around(Store, "begin_call_at_once", "begin", "begun")
    around(resident_channel.ResidentChannel, "_send", None, "sent")
    around(resident_channel.ResidentChannel, "call", None, "answered")
    around(Store, "finish_call", "finish", "finished")
    reading = resident_channel.ResidentChannel._readable

    def readable(channel: Any) -> None:
        if marks.get("readable", 0) < marks.get("sent", 0):  # the first read after the request
            mark("readable")
        reading(channel)
    resident_channel.ResidentChannel._readable = readable  # type: ignore[method-assign]


BASH = shutil.which("bash") or "/bin/bash"
"""Found once: the floor of bash alone times no PATH search."""


def bare_spawn() -> None:
    os.waitpid(os.posix_spawn(BASH, ["bash", "-c", "true"], os.environ), 0)


async def bare_spawn_call() -> None:
    bare_spawn()


def staged(tb: toolbox.Toolbox, rows: list[dict[str, int]]) -> Callable[[], Any]:
    call = shell_call(tb)

    async def run() -> None:
        marks.clear()
        mark("call")
        await call()
        mark("returned")
        rows.append(dict(marks))
    return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--backends", default="local")
    opts = parser.parse_args()
    print(f"tree: {ROOT}; load average {os.getloadavg()[0]:.1f}")
    put_marks()
    root = Path(tempfile.mkdtemp(prefix="guilds-shell-stages-bench-"))
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            made = await toolboxes(root, store, [b for b in opts.backends.split(",") if b])
            rows: dict[str, list[dict[str, int]]] = {backend: [] for backend in made}
            try:
                paths = {backend: staged(tb, rows[backend]) for backend, tb in made.items()}
                paths["spawn"] = lambda: spawn(["bash", "-c", "true"])
                paths["bash alone"] = bare_spawn_call
                times = await interleaved(paths, opts.calls)
            finally:
                for tb in made.values():
                    await close(tb)
        print(table(times, rows))
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def table(times: dict[str, list[float]], rows: dict[str, list[dict[str, int]]]) -> str:
    backends = list(rows)
    lines = ["| stage, µs (median) | " + " | ".join(backends) + " |", "| --- |" + " ---: |" * len(backends)]
    for name, start, end in STAGES:
        cells = []
        for backend in backends:
            spans = [row[end] - row[start] for row in rows[backend] if start in row and end in row]
            cells.append(f"{statistics.median(spans) / 1000:.0f}" if spans else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **the call** (ms) | " + " | ".join(f"**{median_ms(times[b]):.2f}**" for b in backends) + " |")
    spawn_ms, alone_ms = median_ms(times["spawn"]), median_ms(times["bash alone"])
    lines.append("| × the spawn | " + " | ".join(f"{median_ms(times[b]) / spawn_ms:.2f}×" for b in backends) + " |")
    lines.append(f"\nFloors: `bash -c true` spawned from the event loop {spawn_ms:.2f} ms, "
                 f"bash alone (posix_spawn and waitpid) {alone_ms:.2f} ms.")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("GUILDS_DATA", "/nonexistent")
    asyncio.run(main())
