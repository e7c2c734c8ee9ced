"""How fast the app serves a big run: 5,000 calls recorded through the store's API.

Run: .venv/bin/python bench/app_bench.py [--calls N] [--repeat N]

Records a run of N calls (default 5000) on SQLite through ``Store.begin_call``
and ``Store.finish_call`` (each a shell call with a 4 KiB result, the shape the
toolbox records), and beside it, in the same store, a run of 10 calls and one
of 200 (one page of the flow, ``queries.FLOW_PAGE``); serves the whole app
(``guilds.fronts.serve.build_app``) with uvicorn on 127.0.0.1, and times over real
HTTP, median and 95th percentile of ``--repeat`` requests each:

  1. the run's page (its Chat tab: the newest 200 rows);
  2. a call opened (the fragment htmx swaps in), Result view;
  3. a call's whole page (the flow and the call);
  4. "Load earlier" (the 200 rows before);
  5. a new call's live row: from finish_call to its server-sent event.

Each of 1-4 is set against floors served by the same server in the same run:
the app's stylesheet (``/static/app.css``: HTTP, the middleware, no database,
no template) and the same request on the 10-call run (the same route, query
and template with almost nothing to show); the run's page also against the
200-call run (the same 200 rows shown, a run 25 times smaller: what the run's
size alone costs). All the requests take turns one by one, in a rotating
order, so a change in the machine's load falls on all alike.

Prints Markdown tables (pasted into docs/app.md and docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import httpx2
import uvicorn

from guilds.web.endpoint_lock import Lock, host_names
from guilds.record.rows import row_text
from guilds.sandbox.local import LocalSandbox
from guilds.fronts.serve import build_app
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.toolbox import Toolbox

RUN, SMALL, PAGE = "bench", "small", "page"
SMALL_CALLS, PAGE_CALLS = 10, 200
RESULT = "".join(f"line {i:04d} of a test run: ok\n" for i in range(140))[:4096]
STATIC = "/static/app.css"
HX = {"HX-Request": "true"}
TOKEN = "bench-token-0123456789abcdefghijklmnopqrstu"
"""The served app's token: every request carries it, as a client of `guilds serve` does."""


async def record(store: Store, seq_hint: int, agent: str = "agent1", run: str = RUN) -> int:
    """One shell call, begun and finished, as the toolbox records it."""
    now = datetime.now(UTC)
    args = {"command": f"pytest -q tests/test_{seq_hint}.py"}
    slot = await store.begin_call(run_id=run, agent_id=agent, tool="shell", args=args, call_id=f"c{seq_hint}",
                                  started_at=now, budget=None)
    meta = {"exit_code": 0, "cwd": "/home/agent", "timed_out": False, "call": f"c{seq_hint}", "tool": "shell"}
    await store.finish_call(run_id=run, seq=slot.seq, text=RESULT, is_error=False, meta=meta, cut=False,
                            finished_at=now, duration_ms=42, row=row_text("shell", args, meta, False),
                            remaining=199)
    return slot.seq


def requests(n: int) -> dict[str, tuple[str, dict]]:
    """name -> (url, headers): the measured requests and their floors."""
    mid, small_mid = n // 2, SMALL_CALLS // 2
    return {
        "static": (STATIC, {}),
        "run": (f"/runs/{RUN}", {}),
        "run small": (f"/runs/{SMALL}", {}),
        "run page": (f"/runs/{PAGE}", {}),
        "opened": (f"/runs/{RUN}/calls/{mid}", HX),
        "opened small": (f"/runs/{SMALL}/calls/{small_mid}", HX),
        "call": (f"/runs/{RUN}/calls/{mid}", {}),
        "call small": (f"/runs/{SMALL}/calls/{small_mid}", {}),
        "earlier": (f"/runs/{RUN}/flow?before={n - 199}", HX),
        "earlier small": (f"/runs/{SMALL}/flow?before={SMALL_CALLS + 1}", HX),
    }


async def interleaved(client: httpx2.AsyncClient, reqs: dict[str, tuple[str, dict]],
                      repeat: int) -> dict[str, list[float]]:
    """Seconds per request, every request once per turn, the order rotating turn by turn."""
    names = list(reqs)
    out: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up
        await client.get(reqs[name][0], headers=reqs[name][1])
    for i in range(repeat):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            url, headers = reqs[name]
            t0 = time.perf_counter()
            r = await client.get(url, headers=headers)
            out[name].append(time.perf_counter() - t0)
            assert r.status_code == 200, (url, r.status_code)
    return out


async def live_latency(client: httpx2.AsyncClient, store: Store, after: int, repeat: int) -> list[float]:
    out = []
    async with client.stream("GET", f"/runs/{RUN}/events?after={after}") as r:
        lines = r.aiter_lines()
        for i in range(repeat):
            t0 = time.perf_counter()
            seq = await record(store, after + i + 1)
            while True:
                line = await anext(lines)
                if line == f"id: {seq}":
                    break
            out.append(time.perf_counter() - t0)
    return out


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def row(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"| {name} | {statistics.median(ms):.1f} ms | {p95:.1f} ms |"


def ratio_table(n: int, t: dict[str, list[float]]) -> str:
    static = median_ms(t["static"])
    lines = ["| request | median | vs the stylesheet | vs the same, 10-call run |",
             "| --- | ---: | ---: | ---: |",
             f"| floor: `{STATIC}` | {static:.1f} ms | 1.00x | |"]
    for key, name in (("run", "the run's page (newest 200 rows)"), ("opened", "a call opened (Result)"),
                      ("call", "a call's whole page"), ("earlier", "Load earlier (200 rows)")):
        ms, small = median_ms(t[key]), median_ms(t[f"{key} small"])
        lines.append(f"| {name} | {ms:.1f} ms | {ms / static:.1f}x | {ms / small:.2f}x |")
    page = median_ms(t["run page"])
    lines.append(f"\nthe run's page, {n} calls / {PAGE_CALLS} calls (the same 200 rows shown): "
                 f"**{median_ms(t['run']) / page:.2f}x** ({median_ms(t['run']):.1f} against {page:.1f} ms)")
    return "\n".join(lines)


async def main(n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = parse_settings({"agent": {"home": f"{tmp}/home", "sandbox": "local"}}, Path(tmp), env={})
        async with Store(f"sqlite:///{tmp}/guilds.db") as store:
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                await record(store, i)
            fill = time.perf_counter() - t0
            for run, count in ((SMALL, SMALL_CALLS), (PAGE, PAGE_CALLS)):
                for i in range(1, count + 1):
                    await record(store, i, run=run)
            lock = Lock(TOKEN, host_names("127.0.0.1"))
            app = build_app(settings, store, Toolbox(settings, LocalSandbox(settings, f"{tmp}/data"), store), lock=lock)
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.02)
            port = server.servers[0].sockets[0].getsockname()[1]
            try:
                async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                              headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                    t = await interleaved(client, requests(n), repeat)
                    live = await live_latency(client, store, n, min(repeat, 20))
            finally:
                server.should_exit = True
                await task
    mid = n // 2
    load = os.getloadavg()
    print(f"{n} calls recorded through the store's API in {fill:.1f} s; {repeat} requests each over HTTP, "
          f"all taking turns; load average {load[0]:.1f} (1 min) / {load[1]:.1f} (5 min) "
          f"on {os.cpu_count()} CPUs\n")
    print("| request | median | p95 |\n| --- | --- | --- |")
    print("\n".join([
        row("the run's page (newest 200 rows)", t["run"]),
        row(f"a call opened (step {mid}, Result)", t["opened"]),
        row("a call's whole page (flow and call)", t["call"]),
        row("Load earlier (200 rows)", t["earlier"]),
        row("a new call's live row (finish to event)", live),
    ]))
    print()
    print(ratio_table(n, t))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.repeat))
