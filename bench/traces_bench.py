"""What traces cost a call: ``Toolbox.call`` with traces off and on, against the same call with nothing.

Run: eval "$(bash scripts/otel-collector-test-env.sh)"
     .venv/bin/python bench/traces_bench.py [--calls N] [--instant-calls N] [--endpoint URL]

One run, one machine, one Store on SQLite, the local sandbox and the built helper:

1. shell `true` through ``Toolbox.call`` (the resident transport), three toolboxes of three agents taking
   turns call by call in a rotating order: ``nothing`` (an observer whose hooks
   return a no-op context without asking anything: the hooks as they were before
   traces), ``off`` (``Observer(None)``: what every front makes when no
   ``OTEL_TRACES_EXPORTER`` asks for traces) and ``on`` (``Observer`` with the
   traces of ``OTEL_TRACES_EXPORTER=otlp``, sending to the collector at
   ``--endpoint``, default $GUILDS_TEST_OTLP_ENDPOINT); median wall ms per call;
2. the same three over a sandbox that answers at once (no process: the record, the
   pipeline and the hooks alone); median wall ms and CPU ms per call (CPU of the
   whole process: the exporter's thread included);
3. the hooks alone: one call's ``traced``, its three stages' ``timed`` and its
   ``call_ended``, in µs: the mean of 20 000 (``on``: 400, whose 1 600 spans fit the
   batch queue), the median of 7 rounds taking turns.

Prints Markdown tables (pasted into docs/benchmarks.md under "Traces").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from metrics_bench import per_call, table, toolbox

from guilds.observe.log_lines import CALLS_LOGGER
from guilds.observe.traces import traces_from_env
from guilds.record.store import Store
from guilds.toolbox.observer import HELPER, RECORD, SANDBOX_START, CallEnded, Observer

PATHS = ("nothing", "off", "on")
_NOTHING = contextlib.nullcontext()


class Nothing(Observer):
    """The hooks without the traces' check: a no-op context each, the log line (off) at the end."""

    def traced(self, call_id: str, tool: str) -> contextlib.AbstractContextManager[Any]:
        return _NOTHING

    def timed(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return _NOTHING


def hooks_alone(observer: Observer, n: int) -> float:
    """µs per call of the hooks one call makes (its span, three stages, its end told)."""
    t0 = time.perf_counter()
    for i in range(n):
        call_id = f"c{i:012x}"
        with observer.traced(call_id, "shell"):
            for stage in (SANDBOX_START, HELPER, RECORD):
                with observer.timed(stage):
                    pass
            observer.call_ended(CallEnded(call_id, "run", "agent", "shell", "ok", 0.01, True))
    return (time.perf_counter() - t0) / n * 1e6


def hooks_rounds(observers: dict[str, Observer], traces: Any, rounds: int = 7) -> dict[str, float]:
    """{path: median µs of ``rounds`` rounds of ``hooks_alone``}, the paths taking turns; the spans
    of a round sent before the next (outside the time)."""
    samples: dict[str, list[float]] = {p: [] for p in observers}
    for _ in range(rounds):
        for path, observer in observers.items():
            samples[path].append(hooks_alone(observer, 400 if path == "on" else 20_000))
            traces.flush()
    return {p: statistics.median(us) for p, us in samples.items()}


async def main(calls: int, instant_calls: int, endpoint: str) -> None:
    logging.getLogger(CALLS_LOGGER).setLevel(logging.WARNING)
    traces = traces_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                              "OTEL_SERVICE_NAME": "guilds-traces-bench"})
    assert traces is not None
    observers = {"nothing": Nothing(), "off": Observer(None), "on": Observer(traces)}
    root = Path(tempfile.mkdtemp(prefix="guilds-traces-bench-"))
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            real = {p: toolbox(root, store, f"real-{i}", observers[p], False, "resident")
                    for i, p in enumerate(PATHS)}
            instant = {p: toolbox(root, store, f"instant-{i}", observers[p], True) for i, p in enumerate(PATHS)}
            print(f"shell `true`, local sandbox, {calls} calls a path (medians):\n")
            print("\n".join(table(await per_call(real, calls), cpu=False, base="nothing")))
            print(f"\nshell `true`, a sandbox that answers at once, {instant_calls} calls a path (medians):\n")
            print("\n".join(table(await per_call(instant, instant_calls), cpu=True, base="nothing")))
            alone = hooks_rounds(observers, traces)
            print("\nthe hooks alone: " + ", ".join(f"{p} {us:.2f} µs" for p, us in alone.items()) + " a call")
            for box in [*real.values(), *instant.values()]:
                await box.close()
        sent = traces.flush()
        print(f"\nevery span sent to {endpoint}: {'yes' if sent else 'no'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--instant-calls", type=int, default=600)
    parser.add_argument("--endpoint", default=os.environ.get("GUILDS_TEST_OTLP_ENDPOINT"))
    opts = parser.parse_args()
    if not opts.endpoint:
        parser.error("--endpoint: the collector's URL (or GUILDS_TEST_OTLP_ENDPOINT, from "
                     "scripts/otel-collector-test-env.sh)")
    asyncio.run(main(opts.calls, opts.instant_calls, opts.endpoint))
