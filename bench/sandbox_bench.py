"""Benchmarks of the sandbox backends: what a call costs in each, and docker at scale.

Run: DOCKER_HOST=... .venv/bin/python bench/sandbox_bench.py [--quick]
(eval "$(bash scripts/docker-test-env.sh)" gives DOCKER_HOST and the image.)

Every figure goes through the whole transport (``call_helper``: the request,
the helper in the sandbox, its envelope), measured in one run on one machine:
  1. per call, median: shell `true`, file_read of a 200-line file, code_search
     of a small tree, and a bare exec of `true` (no helper), for local, bwrap
     (where it works) and docker, the backends taking turns call by call in a
     rotating order (so a change in the machine's load falls on all alike),
     with each backend's ratio to local and docker's to bwrap;
  2. docker, time to the first call's answer: a new agent (the container is
     created and started, the helpers put in) and a warm container found
     again by a new orchestrator;
  3. docker, 20 agents at once: their containers started together, then each
     agent making calls one after another, all agents at the same time:
     wall time, calls per second, and the p50/p95 of a call.
Prints a Markdown table (pasted into docs/sandboxes.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox import get_sandbox  # noqa: E402
from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable  # noqa: E402
from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable  # noqa: E402
from guilds.config.settings import AgentSettings  # noqa: E402
from guilds.toolbox.transport import call_helper  # noqa: E402

CALLS = {
    "shell `true`": ("shell", {"command": "true"}),
    "file_read, 200 lines": ("file_read", {"path": "notes.txt"}),
    "code_search, 50 files": ("code_search", {"pattern": "needle", "path": "src"}),
}


class Agent:
    """One agent's sandbox and its requests."""

    def __init__(self, backend: str, work: Path, agent_id: str):
        self.settings = AgentSettings(id=agent_id, home=work / agent_id, sandbox=backend)
        self.box = get_sandbox(self.settings, work / "data")
        self.calls = 0

    def seed(self) -> None:
        home = self.settings.home
        (home / "src").mkdir(parents=True, exist_ok=True)
        (home / "notes.txt").write_text("".join(f"line {i} of the notes\n" for i in range(200)))
        for i in range(50):
            (home / "src" / f"m{i}.py").write_text("def f():\n    return 1\n" * 20 + "# needle\n")

    async def call(self, op: str, args: dict) -> float:
        self.calls += 1
        request = {"op": op, "args": args, "run_id": "bench", "agent_id": self.settings.id,
                   "call_id": f"c{self.calls}", "home": self.box.home, "cwd": self.box.home}
        began = time.perf_counter()
        envelope = await call_helper(self.box, request, wait=120)
        assert envelope["ok"], envelope
        return time.perf_counter() - began

    async def bare(self) -> float:
        began = time.perf_counter()
        result = await self.box.exec(["true"], timeout=30)
        assert result.exit_code == 0, result
        return time.perf_counter() - began


async def per_call(backends: list[str], work: Path, runs: int) -> dict[str, dict[str, float]]:
    """{backend: {call: median seconds}}, the backends taking turns call by call."""
    agents = {b: Agent(b, work, f"pc-{b}-{secrets.token_hex(3)}") for b in backends}
    samples: dict[str, dict[str, list[float]]] = {b: {} for b in backends}
    for agent in agents.values():
        agent.seed()
        await agent.box.start()
    try:
        kinds = {name: (lambda a, op=op, args=args: a.call(op, args)) for name, (op, args) in CALLS.items()}
        kinds["bare exec `true`"] = lambda a: a.bare()
        for name, measure in kinds.items():
            for b in backends:
                await measure(agents[b])  # warm
                samples[b][name] = []
            for i in range(runs):
                k = i % len(backends)
                for b in backends[k:] + backends[:k]:
                    samples[b][name].append(await measure(agents[b]))
        return {b: {name: statistics.median(v) for name, v in kinds_.items()} for b, kinds_ in samples.items()}
    finally:
        for agent in agents.values():
            await agent.box.stop()


async def first_call(work: Path) -> dict[str, float]:
    agent = Agent("docker", work, f"fc-{secrets.token_hex(3)}")
    agent.seed()
    began = time.perf_counter()
    await agent.box.start()
    await agent.call("shell", {"command": "true"})
    cold = time.perf_counter() - began
    again = Agent("docker", work, agent.settings.id)  # a new orchestrator, the container running
    began = time.perf_counter()
    await again.box.start()
    await again.call("shell", {"command": "true"})
    warm = time.perf_counter() - began
    await agent.box.stop()
    return {"new agent (container created)": cold, "warm container, new orchestrator": warm}


async def many_agents(work: Path, agents: int, calls: int) -> dict[str, float]:
    fleet = [Agent("docker", work, f"ma{i}-{secrets.token_hex(3)}") for i in range(agents)]
    began = time.perf_counter()
    await asyncio.gather(*(a.box.start() for a in fleet))
    started = time.perf_counter() - began

    async def work_of(agent: Agent) -> list[float]:
        return [await agent.call("shell", {"command": "echo hi"}) for _ in range(calls)]

    began = time.perf_counter()
    latencies = sorted(t for ts in await asyncio.gather(*(work_of(a) for a in fleet)) for t in ts)
    wall = time.perf_counter() - began
    await asyncio.gather(*(a.box.stop() for a in fleet))
    return {"containers started at once": started, "wall": wall,
            "calls/s": len(latencies) / wall, "p50": latencies[len(latencies) // 2],
            "p95": latencies[int(len(latencies) * 0.95)]}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


async def main_async(args: argparse.Namespace) -> None:
    runs = 5 if args.quick else 20
    backends = ["local"] + (["bwrap"] if bwrap_unavailable() is None else [])
    why = docker_unavailable()
    if why is None:
        backends.append("docker")
    else:
        print(f"(docker left out: {why})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="guilds-sbench-") as tmp:
        work = Path(tmp)
        table = await per_call(backends, work, runs)
        ratios = [(b, "local") for b in backends[1:]] + ([("docker", "bwrap")] if {"docker", "bwrap"} <= set(backends)
                                                         else [])
        one, five, _ = os.getloadavg()
        print(f"per call, median of {runs}, the backends taking turns call by call; load average {one:.1f} "
              f"(1 min) / {five:.1f} (5 min) on {os.cpu_count()} CPUs\n")
        print(f"| per call, median of {runs} | " + " | ".join(backends) + " | "
              + " | ".join(f"{a} / {b}" for a, b in ratios) + " |")
        print("|---|" + "---:|" * (len(backends) + len(ratios)))
        for name in [*CALLS, "bare exec `true`"]:
            print(f"| {name} | " + " | ".join(ms(table[b][name]) for b in backends) + " | "
                  + " | ".join(f"{table[a][name] / table[b][name]:.2f}x" for a, b in ratios) + " |")
        if why is not None:
            return
        print()
        warm = table["docker"]["shell `true`"]
        print(f"| docker, to the first call's answer | time | vs a warm call ({ms(warm)}) |\n|---|---:|---:|")
        for name, secs in (await first_call(work)).items():
            print(f"| {name} | {ms(secs)} | {secs / warm:.1f}x |")
        agents, calls = (20, 3) if args.quick else (20, 10)
        fleet = await many_agents(work, agents, calls)
        print(f"\n| docker, {agents} agents × {calls} shell calls at once | |\n|---|---|")
        print(f"| {agents} containers started at once | {fleet['containers started at once']:.1f} s |")
        print(f"| all calls, wall | {fleet['wall']:.1f} s ({fleet['calls/s']:.1f} calls/s, "
              f"{fleet['calls/s'] * warm:.2f}x one agent's warm calls one after another) |")
        print(f"| a call, p50 / p95 | {ms(fleet['p50'])} / {ms(fleet['p95'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test of the bench)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
