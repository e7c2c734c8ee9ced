"""How fast the app serves a big run: 5,000 calls recorded through the store's API.

Run: .venv/bin/python bench/app_bench.py [--calls N] [--repeat N]

Records a run of N calls (default 5000) on SQLite through ``Store.begin_call``
and ``Store.finish_call`` (each a shell call with a 4 KiB result, the shape the
toolbox records), serves the whole app (``guilds.serve.build_app``) with
uvicorn on 127.0.0.1, and times over real HTTP, median and 95th percentile of
``--repeat`` requests each:

  1. the run's page (its Chat tab: the newest 200 rows);
  2. a call opened (the fragment htmx swaps in), Result view;
  3. a call's whole page (the flow and the call);
  4. "Load earlier" (the 200 rows before);
  5. a new call's live row: from finish_call to its server-sent event.

Prints a Markdown table (pasted into docs/app.md).
"""

from __future__ import annotations

import argparse
import asyncio
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

from guilds.rows import row_text
from guilds.sandbox.local import LocalSandbox
from guilds.serve import build_app
from guilds.settings import parse_settings
from guilds.store import Store
from guilds.toolbox import Toolbox

RUN = "bench"
RESULT = "".join(f"line {i:04d} of a test run: ok\n" for i in range(140))[:4096]


async def record(store: Store, seq_hint: int, agent: str = "agent1") -> int:
    """One shell call, begun and finished, as the toolbox records it."""
    now = datetime.now(UTC)
    args = {"command": f"pytest -q tests/test_{seq_hint}.py"}
    slot = await store.begin_call(run_id=RUN, agent_id=agent, tool="shell", args=args, call_id=f"c{seq_hint}",
                                  started_at=now, budget=None)
    meta = {"exit_code": 0, "cwd": "/home/agent", "timed_out": False, "call": f"c{seq_hint}", "tool": "shell"}
    await store.finish_call(run_id=RUN, seq=slot.seq, text=RESULT, is_error=False, meta=meta, cut=False,
                            finished_at=now, duration_ms=42, row=row_text("shell", args, meta, False))
    return slot.seq


async def timed(client: httpx2.AsyncClient, url: str, repeat: int, headers: dict | None = None) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = await client.get(url, headers=headers or {})
        out.append(time.perf_counter() - t0)
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


def row(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"| {name} | {statistics.median(ms):.1f} ms | {p95:.1f} ms |"


async def main(n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = parse_settings({"agent": {"home": f"{tmp}/home", "sandbox": "local"}}, Path(tmp), env={})
        async with Store(f"sqlite:///{tmp}/guilds.db") as store:
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                await record(store, i)
            fill = time.perf_counter() - t0
            app = build_app(settings, store, Toolbox(settings, LocalSandbox(settings, f"{tmp}/data"), store))
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.02)
            port = server.servers[0].sockets[0].getsockname()[1]
            try:
                async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                    mid = n // 2
                    rows = [
                        row("the run's page (newest 200 rows)", await timed(client, f"/runs/{RUN}", repeat)),
                        row(f"a call opened (step {mid}, Result)", await timed(
                            client, f"/runs/{RUN}/calls/{mid}", repeat, {"HX-Request": "true"})),
                        row("a call's whole page (flow and call)", await timed(client, f"/runs/{RUN}/calls/{mid}",
                                                                               repeat)),
                        row("Load earlier (200 rows)", await timed(client, f"/runs/{RUN}/flow?before={n - 199}",
                                                                   repeat, {"HX-Request": "true"})),
                        row("a new call's live row (finish to event)", await live_latency(client, store, n,
                                                                                          min(repeat, 20))),
                    ]
            finally:
                server.should_exit = True
                await task
    print(f"{n} calls recorded through the store's API in {fill:.1f} s; {repeat} requests each over HTTP\n")
    print("| request | median | p95 |\n| --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.repeat))
