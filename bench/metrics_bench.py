"""What the metrics cost a call: ``Toolbox.call`` with the server's metrics on against off.

Run: .venv/bin/python bench/metrics_bench.py [--calls N] [--instant-calls N]

One run, one machine, one Store on SQLite, the local sandbox and the built helper:

1. shell `true` through ``Toolbox.call`` (the Python API a front calls), three
   toolboxes of three agents: ``off`` (no observer: ``NO_OBSERVER``), ``metrics``
   (``guilds.observe.metrics.Metrics``, as ``guilds serve`` has, its log lines off)
   and ``metrics+log`` (the same, and the log line of every call written as JSON
   to /dev/null, as ``guilds serve --log-json`` does). The paths take turns call by
   call, in a rotating order, so the machine's load falls on all alike; median
   wall ms per call;
2. the same three over a sandbox that answers at once (no process: the record, the
   pipeline and the hooks alone), where the hooks' cost is not lost in a process
   start; median wall ms and CPU ms per call;
3. the hooks alone: one call's ``timed`` of its three stages and its ``call_ended``,
   on ``Metrics`` against the no-op observer, in µs (mean of 20 000).

Prints Markdown tables (pasted into docs/benchmarks.md under "Metrics").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.config.settings import parse_settings
from guilds.observe.log_lines import CALLS_LOGGER, JsonLines
from guilds.observe.metrics import Metrics
from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.sandbox.base import ExecResult
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox import Toolbox
from guilds.toolbox.observer import HELPER, NO_OBSERVER, RECORD, SANDBOX_START, CallEnded, Observer
from guilds_code.protocol import Reply, ok_envelope

WARMUP = 3
PATHS = ("off", "metrics", "metrics+log")
ANSWER = ok_envelope(Reply("ok\n", {"exit_code": 0, "cwd": "/h", "timed_out": False}))
calls_log = logging.getLogger(CALLS_LOGGER)


class InstantSandbox(LocalSandbox):
    """The local sandbox, except that the helper answers at once."""

    async def exec(self, argv, *, env=None, timeout):
        return ExecResult(0, ANSWER, b"")


def toolbox(root: Path, store: Store, name: str, observer: Observer, instant: bool,
            transport: str = "exec") -> Toolbox:
    home = root / "homes" / name
    home.mkdir(parents=True)
    settings = parse_settings({"agent": {"id": name, "home": str(home), "sandbox": "local",
                                         "max_tool_calls": 1_000_000, "transport": transport}}, root, env={})
    sandbox = InstantSandbox(settings, root / "data") if instant else get_sandbox(settings, root / "data")
    return Toolbox(settings, sandbox, store, observer=observer)


async def per_call(boxes: dict[str, Toolbox], calls: int) -> dict[str, tuple[float, float]]:
    """{path: (median wall ms, median CPU ms)}, the paths taking turns call by call."""
    samples: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in boxes}
    names = list(boxes)
    for i in range(WARMUP + calls):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            calls_log.setLevel(logging.INFO if name == "metrics+log" else logging.WARNING)
            wall, cpu = time.perf_counter(), time.process_time()
            result = await boxes[name].call(f"bench-{boxes[name].settings.id}", "shell", {"command": "true"})
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if result.is_error:
                raise RuntimeError(result.text)
            if i >= WARMUP:
                samples[name][0].append(wall * 1000)
                samples[name][1].append(cpu * 1000)
    return {p: (statistics.median(w), statistics.median(c)) for p, (w, c) in samples.items()}


def hooks_alone(observer: Observer, n: int = 20_000) -> float:
    """µs per call of the hooks one call makes (three stages timed, its end told)."""
    ended = CallEnded("c0123456789ab", "run", "agent", "shell", "ok", 0.01, True)
    t0 = time.perf_counter()
    for _ in range(n):
        for stage in (SANDBOX_START, HELPER, RECORD):
            with observer.timed(stage):
                pass
        observer.call_ended(ended)
    return (time.perf_counter() - t0) / n * 1e6


def table(rows: dict[str, tuple[float, float]], cpu: bool, base: str = "off") -> list[str]:
    off = rows[base][0]
    head = f"| path | ms / call | vs {base} |" + (" CPU ms / call |" if cpu else "")
    lines = [head, "| --- | ---: | ---: |" + (" ---: |" if cpu else "")]
    for name, (wall, cpu_ms) in rows.items():
        lines.append(f"| {name} | {wall:.3f} | {wall / off:.3f}x |" + (f" {cpu_ms:.3f} |" if cpu else ""))
    return lines


async def main(calls: int, instant_calls: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="guilds-metrics-bench-"))
    null = open(os.devnull, "w")  # noqa: SIM115 - closed at the end
    handler = logging.StreamHandler(null)
    handler.setFormatter(JsonLines())
    calls_log.addHandler(handler)
    calls_log.propagate = False
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            observers = {"off": NO_OBSERVER, "metrics": Metrics(), "metrics+log": Metrics()}
            real = {p: toolbox(root, store, f"real-{i}", observers[p], False) for i, p in enumerate(PATHS)}
            instant = {p: toolbox(root, store, f"instant-{i}", observers[p], True) for i, p in enumerate(PATHS)}
            print(f"shell `true`, local sandbox, {calls} calls a path (medians):\n")
            print("\n".join(table(await per_call(real, calls), cpu=False)))
            print(f"\nshell `true`, a sandbox that answers at once, {instant_calls} calls a path (medians):\n")
            print("\n".join(table(await per_call(instant, instant_calls), cpu=True)))
            calls_log.setLevel(logging.WARNING)
            bare, counted = hooks_alone(NO_OBSERVER), hooks_alone(Metrics())
            print(f"\nthe hooks alone: no-op {bare:.2f} µs, Metrics {counted:.2f} µs a call")
            for box in [*real.values(), *instant.values()]:
                await box.close()
    finally:
        calls_log.removeHandler(handler)
        null.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--instant-calls", type=int, default=600)
    opts = parser.parse_args()
    asyncio.run(main(opts.calls, opts.instant_calls))
