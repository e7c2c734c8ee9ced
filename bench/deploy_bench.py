"""Calls a second through the Service with 1, 2 and 3 replicas of ``guilds serve`` on
the test cluster (tests/deploy_kit.py): --clients MCP SDK clients at once (64), each on
connections of its own (the Service hands each to the next replica), its calls in one
of 16 runs (a run takes 200 calls, ``max_tool_calls``), calling ``shell`` ``true`` one
after another for --seconds, after one call each to warm up. All the calls go to the
servers' one agent and its one sandbox pod (--sandbox-cpu, 1 CPU by default).

    python bench/deploy_bench.py [--clients 64] [--seconds 20] [--replicas 1 2 3]

Needs the test cluster and its record (``eval "$(bash scripts/kube-test-env.sh)"``,
``GUILDS_TEST_POSTGRES_URL``). Prints a table, with the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from failover_bench import load  # noqa: E402

import deploy_kit  # noqa: E402 - the tests' kit, beside this bench
from failover_kit import RUN_KEY, connected  # noqa: E402

RUNS = 16
"""The clients' runs, each client's calls in one of them: a run takes max_tool_calls (200),
and the sandbox keeps the folders of its last RUNS_KEPT (20) runs only."""
READ_TIMEOUT_SECONDS = 600
"""64 first calls at once on a loaded machine may take minutes: the warm-up is not timed."""


class Round:
    """The clients' shared clock: warmed up, then started, until stop_at."""

    def __init__(self, clients: int) -> None:
        self.clients, self.warm = clients, 0
        self.warmed = asyncio.Event()
        self.start = asyncio.Event()
        self.stop_at = float("inf")
        self.latencies: list[float] = []


async def client_loop(deployment: deploy_kit.Deployment, round_: Round, run: str) -> int:
    """One client: a warm-up call, then `shell true` until the round's end; the calls answered in it."""
    async with connected(deployment.route.url, deployment.token, read_timeout=READ_TIMEOUT_SECONDS) as client:
        await client.call_tool("shell", {"command": "true"}, meta={RUN_KEY: run})
        round_.warm += 1
        if round_.warm == round_.clients:
            round_.warmed.set()
        await round_.start.wait()
        done = 0
        while (t0 := time.monotonic()) < round_.stop_at:
            result = await client.call_tool("shell", {"command": "true"}, meta={RUN_KEY: run})
            if result.is_error:
                raise RuntimeError(f"shell true: {result.content}")
            if time.monotonic() <= round_.stop_at:
                done += 1
                round_.latencies.append(time.monotonic() - t0)
        return done


async def rate(deployment: deploy_kit.Deployment, clients: int, seconds: float) -> tuple[float, float, float]:
    """(calls a second, median latency, p95 latency) of clients at once for seconds."""
    round_ = Round(clients)
    runs = [f"mcp-rate-{uuid.uuid4().hex[:10]}" for _ in range(RUNS)]
    loops = [asyncio.ensure_future(client_loop(deployment, round_, runs[n % RUNS])) for n in range(clients)]
    warmed = asyncio.ensure_future(round_.warmed.wait())
    await asyncio.wait([warmed, *loops], return_when=asyncio.FIRST_COMPLETED)  # a client that failed: at once
    warmed.cancel()
    round_.stop_at = time.monotonic() + seconds
    round_.start.set()
    done = sum(await asyncio.gather(*loops))
    ordered = sorted(round_.latencies)
    return done / seconds, statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sandbox-cpu", default="1", help="the sandbox's CPU (requests and limits; default 1)")
    args = parser.parse_args()
    rows = ["| replicas | calls/s | median | p95 |", "| ---: | ---: | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as tmp, \
            deploy_kit.deployed(Path(tmp), replicas=max(args.replicas), sandbox_cpu=args.sandbox_cpu) as d:
        before = load()
        for replicas in args.replicas:
            d.scale(replicas)
            per_second, median, p95 = asyncio.run(rate(d, args.clients, args.seconds))
            rows.append(f"| {replicas} | {per_second:.0f} | {median * 1000:.0f} ms | {p95 * 1000:.0f} ms |")
            sys.stdout.write(rows[-1] + "\n")
        after = load()
    sys.stdout.write("\n".join([f"shell `true`, {args.clients} clients at once, {args.seconds:g} s a size", *rows,
                                f"before: {before}; after: {after}"]) + "\n")


if __name__ == "__main__":
    main()
