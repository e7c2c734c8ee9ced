"""The toolbox's own cost per call, bwrap against local, and 8 agents at once.

Run: .venv/bin/python bench/toolbox_bench.py [--calls N] [--rounds N] [--quick] [--no-bwrap]

One run, one machine, the real sandboxes (local, and bwrap where it works),
one shared Store on SQLite (as one ``guilds serve`` process has):

1. per call, median wall time, for `local` and `bwrap`:
     shell   shell `true`
     read    file_read of a small file (20 lines), each call in a run of its
             own, so the helper reads it in full (no repeated-read pointer)
             and the toolbox still asks the store for the run's earlier reads;
   each through ``Toolbox.call`` (request, record, ledger, pipeline) and the
   same request sent straight to the helper (``transport.call_helper``). The
   four paths (2 sandboxes x toolbox/direct) take turns call by call, in a
   rotating order, so a change in the machine's load falls on all alike.
   Gives toolbox / direct (the toolbox's own cost as a ratio; aim <= 1.15x)
   and bwrap / local;
2. the toolbox alone: ``Toolbox.call`` over a sandbox that answers at once
   (the record, the ledger and the pipeline, no process): ms and CPU per call;
3. 8 agents at once: 8 Toolboxes (each its own agent id and home, the one
   Store) making 25 shell `true` calls each, all launched together with
   asyncio.gather, against the same 200 calls one after another; and the same
   two for the helper called directly (the floor: what the machine gives
   without the toolbox). The four take turns round by round (rotating order);
   calls per second, median of the rounds.

Prints Markdown tables (pasted into docs/benchmarks.md under "Toolbox").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox import get_sandbox
from guilds.sandbox.base import ExecResult
from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable
from guilds.sandbox.local import LocalSandbox
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.toolbox import Toolbox, transport
from guilds.toolbox.tools import wait_for
from guilds_code.protocol import Reply, ok_envelope

WARMUP = 3
OPS = {"shell": ("shell", {"command": "true"}), "read": ("file_read", {"path": "small.txt"})}
SMALL = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(20))
ANSWER = ok_envelope(Reply("ok\n", {"exit_code": 0, "cwd": "/h", "timed_out": False}))
SECRET = {"API_KEY": "bench-secret-0123456789"}


class InstantSandbox(LocalSandbox):
    """The local sandbox, except that the helper answers at once."""

    async def exec(self, argv, *, env=None, timeout):
        return ExecResult(0, ANSWER, b"")


class Agent:
    """One agent: its settings, sandbox and toolbox over the shared store; calls both ways."""

    def __init__(self, root: Path, store: Store, agent_id: str, backend: str, sandbox: Any = None):
        home = root / "homes" / agent_id
        home.mkdir(parents=True)
        (home / "small.txt").write_text(SMALL)
        # exec: Toolbox.call and the direct call run the same one-process-per-call transport
        self.settings = parse_settings({"agent": {"id": agent_id, "home": str(home), "sandbox": backend,
                                                  "max_tool_calls": 1_000_000, "transport": "exec"},
                                        "secrets": SECRET},
                                       root, env={})
        self.sandbox = sandbox or get_sandbox(self.settings, root / "data")
        self.toolbox = Toolbox(self.settings, self.sandbox, store)
        self.n = 0

    def run_id(self, op: str) -> str:
        """shell calls share one run; each read is a run of its own (see the docstring)."""
        return f"{self.settings.id}-{op}" + (f"-{self.n}" if op == "read" else "")

    async def through(self, op: str) -> None:
        self.n += 1
        tool, args = OPS[op]
        result = await self.toolbox.call(self.run_id(op), tool, args)
        if result.is_error:
            raise RuntimeError(f"toolbox call failed: {result.text}")

    async def direct(self, op: str) -> None:
        """The request Toolbox.call would send for this call, straight to the helper."""
        self.n += 1
        tool, args = OPS[op]
        request = {"op": tool, "args": args, "run_id": self.run_id(op), "agent_id": self.settings.id,
                   "call_id": f"d{self.n}", "cwd": self.toolbox.default_cwd(), "home": self.sandbox.home,
                   "max_bytes": self.settings.result_max_bytes, "seq": 1,
                   "redact_env": sorted(self.settings.secrets)}
        if tool == "file_read":
            request["reads"] = []
        envelope = await transport.call_helper(self.sandbox, request, wait=wait_for(tool, args))
        if not envelope["ok"]:
            raise RuntimeError(f"helper call failed: {envelope['error']}")


def rotations(names: list[str], i: int) -> list[str]:
    k = i % len(names)
    return names[k:] + names[:k]


async def per_call(paths: dict[str, Callable[[str], Awaitable[None]]], calls: int) -> dict:
    """{path: {op: (median wall ms, median CPU ms)}}, the paths taking turns call by call."""
    samples = {p: {op: ([], []) for op in OPS} for p in paths}
    for i in range(WARMUP + calls):
        for op in OPS:
            for name in rotations(list(paths), i):
                wall, cpu = time.perf_counter(), time.process_time()
                await paths[name](op)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if i >= WARMUP:
                    samples[name][op][0].append(wall * 1000)
                    samples[name][op][1].append(cpu * 1000)
    return {p: {op: (statistics.median(w), statistics.median(c)) for op, (w, c) in ops.items()}
            for p, ops in samples.items()}


async def toolbox_alone(root: Path, store: Store, calls: int) -> dict[str, tuple[float, float]]:
    """Toolbox.call over the instant sandbox: (median wall ms, median CPU ms) per op."""
    agent = Agent(root, store, "instant", "local")
    agent.toolbox = Toolbox(agent.settings, InstantSandbox(agent.settings, root / "data"), store)
    out = {}
    for op in OPS:
        walls, cpus = [], []
        for i in range(WARMUP + calls * 4):
            wall, cpu = time.perf_counter(), time.process_time()
            await agent.through(op)
            if i >= WARMUP:
                walls.append((time.perf_counter() - wall) * 1000)
                cpus.append((time.process_time() - cpu) * 1000)
        out[op] = (statistics.median(walls), statistics.median(cpus))
    return out


async def fleet(agents: list[Agent], each: int, rounds: int) -> dict[str, tuple[float, float]]:
    """{mode: (median calls/s, median of the rounds' p50 call ms)} for the four modes, rounds rotating."""

    async def calls_of(agent: Agent, how: str) -> list[float]:
        out = []
        for _ in range(each):
            t0 = time.perf_counter()
            await (agent.through("shell") if how == "toolbox" else agent.direct("shell"))
            out.append(time.perf_counter() - t0)
        return out

    async def one_after_another(how: str) -> list[float]:
        out = []
        for _ in range(each):
            for agent in agents:
                t0 = time.perf_counter()
                await (agent.through("shell") if how == "toolbox" else agent.direct("shell"))
                out.append(time.perf_counter() - t0)
        return out

    async def at_once(how: str) -> list[float]:
        return [t for ts in await asyncio.gather(*(calls_of(a, how) for a in agents)) for t in ts]

    modes = {"toolbox, one after another": lambda: one_after_another("toolbox"),
             f"toolbox, {len(agents)} at once": lambda: at_once("toolbox"),
             "helper directly, one after another": lambda: one_after_another("direct"),
             f"helper directly, {len(agents)} at once": lambda: at_once("direct")}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    p50s: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for mode in rotations(list(modes), r):
            t0 = time.perf_counter()
            latencies = await modes[mode]()
            rates[mode].append(len(latencies) / (time.perf_counter() - t0))
            p50s[mode].append(statistics.median(latencies) * 1000)
    return {m: (statistics.median(rates[m]), statistics.median(p50s[m])) for m in modes}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} CPUs"


def per_call_tables(backends: list[str], rows: dict, alone: dict, calls: int) -> str:
    out = [(f"Per call, median of {calls} (after {WARMUP} warm-up), the paths taking turns call by call; "
            f"{load()}\n"),
           "| sandbox | call | helper directly | through Toolbox.call | toolbox / direct | toolbox's own cost |",
           "| --- | --- | ---: | ---: | ---: | ---: |"]
    for b in backends:
        for op in OPS:
            (dw, dc), (tw, tc) = rows[f"{b} direct"][op], rows[f"{b} toolbox"][op]
            out.append(f"| {b} | {op} | {dw:.1f} ms | {tw:.1f} ms | **{tw / dw:.2f}x** | "
                       f"{tw - dw:+.1f} ms wall, {tc - dc:+.1f} ms CPU |")
    out.append("")
    out.append("| the toolbox alone (a sandbox that answers at once) | wall | CPU |")
    out.append("| --- | ---: | ---: |")
    for op, (w, c) in alone.items():
        out.append(f"| {op} | {w:.2f} ms | {c:.2f} ms |")
    if "bwrap" in backends:
        out.append("")
        out.append("| bwrap / local | helper directly | through Toolbox.call |")
        out.append("| --- | ---: | ---: |")
        for op in OPS:
            ratio = [rows[f"bwrap {how}"][op][0] / rows[f"local {how}"][op][0] for how in ("direct", "toolbox")]
            out.append(f"| {op} | {ratio[0]:.2f}x | {ratio[1]:.2f}x |")
    return "\n".join(out)


def fleet_table(backend: str, agents: int, each: int, rounds: int, res: dict) -> str:
    out = [(f"{backend}: {agents} agents x {each} shell `true` calls ({agents * each} calls), "
            f"median of {rounds} rounds; {load()}\n"),
           "| mode | calls/s | a call, p50 | vs one after another |", "| --- | ---: | ---: | ---: |"]
    for mode, (rate, p50) in res.items():
        base = res[("toolbox" if mode.startswith("toolbox") else "helper directly") + ", one after another"][0]
        out.append(f"| {mode} | {rate:.1f} | {p50:.0f} ms | {rate / base:.2f}x |")
    tb, hd = res[f"toolbox, {agents} at once"][0], res[f"helper directly, {agents} at once"][0]
    out.append(f"\ntoolbox / helper directly, {agents} at once: {hd / tb:.2f}x the time per call "
               f"({tb:.1f} against {hd:.1f} calls/s)")
    return "\n".join(out)


async def main(opts: argparse.Namespace) -> None:
    calls, rounds, each = (10, 1, 5) if opts.quick else (opts.calls, opts.rounds, 25)
    agents_n = 8
    backends = ["local"]
    why = bwrap_unavailable() if not opts.no_bwrap else "--no-bwrap"
    if why is None:
        backends.append("bwrap")
    else:
        print(f"(bwrap left out: {why})", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="toolbox-bench-"))
    started: list[Any] = []
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            single = {b: Agent(root, store, f"one-{b}", b) for b in backends}
            paths: dict[str, Callable[[str], Awaitable[None]]] = {}
            for b, agent in single.items():
                await agent.sandbox.start()
                started.append(agent.sandbox)
                paths[f"{b} toolbox"], paths[f"{b} direct"] = agent.through, agent.direct
            rows = await per_call(paths, calls)
            alone = await toolbox_alone(root, store, calls)
            print(per_call_tables(backends, rows, alone, calls))
            for b in backends:
                fleet_agents = [Agent(root, store, f"fleet-{b}-{i}", b) for i in range(agents_n)]
                for a in fleet_agents:
                    await a.sandbox.start()
                    started.append(a.sandbox)
                    await a.through("shell")
                print()
                print(fleet_table(b, agents_n, each, rounds, await fleet(fleet_agents, each, rounds)))
    finally:
        for box in started:
            await box.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40, help="calls per path and op for the per-call table")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the 8-agent comparison")
    parser.add_argument("--quick", action="store_true", help="a few calls and one round (a smoke test)")
    parser.add_argument("--no-bwrap", action="store_true", help="local only")
    asyncio.run(main(parser.parse_args()))
