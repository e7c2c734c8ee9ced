"""Calls per second across many busy agents of one server: `shell` `true`, 32 at once,
through the E2B SDK's `commands.run` against `guilds serve --e2b`, and the same calls
through guilds.open in this process, on the same agents.

Run: .venv/bin/python bench/busy_agents_bench.py [--sandbox bwrap|docker|local] [--agents 100]
         [--concurrency 32] [--calls 1000] [--rounds 4]

One run, one machine: a real `guilds serve --e2b` (its own data folder, its caps
raised to hold the agents: bench/template_server.py) serving one template; the
unmodified E2B Python SDK (``AsyncSandbox``, one event loop).

1. ``--agents`` sandboxes are made through the SDK (``AsyncSandbox.create(template=T)``,
   ``--concurrency`` at a time): each an agent made on demand, with its own sandbox.
2. guilds.open on the same settings and data folder finds the same agents
   (``made_agent``): the in-process path calls them, in their own sandboxes.
3. Each path makes a round of ``--calls`` calls, at most ``--concurrency`` at
   once, the i-th call on agent i mod N (every agent busy); the paths take
   turns round by round, in a rotating order, after a warm-up call on every agent.

    e2b          sandbox.commands.run("true"): the SDK's Start stream (bash -l -c true)
                 to its end event, through the server's E2B front, recorded as a
                 shell call, run by the sandbox's guilds-code envd
    guilds.open  MadeAgent.call(run, "shell", {"command": "true"}): the toolbox in this
                 process, its resident helper in the same sandbox, recorded

Reports calls per second (all calls over all their rounds' time), the median of
the rounds, each call's p50 and p99, the CPU the server and this process spent per
call, and the ratio. Every sandbox is killed at the end; the run checks it left
nothing (exit status 1 if it did).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from template_server import Run, error_kind, nearest_rank, run_folder, served

import guilds
from e2b import AsyncSandbox

SANDBOX_TIMEOUT = 3600
CALL_TIMEOUT = 60
"""A call not answered by then is counted as an error (TimeoutError), not waited for."""
E2B_PATH, GUILDS_PATH = "e2b", "guilds.open"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Rounds:
    seconds: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: collections.Counter = field(default_factory=collections.Counter)
    server_cpu: float = 0.0
    own_cpu: float = 0.0

    def per_second(self) -> float:
        return sum(self.calls) / sum(self.seconds)


async def one_round(call: Callable[[int], Awaitable[None]], calls: int, concurrency: int, into: Rounds,
                    server_pid: int) -> None:
    """calls calls, at most concurrency at once, call(i) the i-th."""
    next_call = iter(range(calls))
    ok = 0

    async def worker() -> None:
        nonlocal ok
        for i in next_call:
            started = time.perf_counter()
            try:
                await asyncio.wait_for(call(i), CALL_TIMEOUT)
            except Exception as exc:  # counted by kind; the round goes on
                into.errors[error_kind(exc)] += 1
                continue
            into.latencies.append((time.perf_counter() - started) * 1000)
            ok += 1

    server_cpu, own_cpu, started = cpu_seconds(server_pid), cpu_seconds(os.getpid()), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    into.seconds.append(time.perf_counter() - started)
    into.server_cpu += cpu_seconds(server_pid) - server_cpu
    into.own_cpu += cpu_seconds(os.getpid()) - own_cpu
    into.calls.append(ok)


async def make_sandboxes(template: str, count: int, concurrency: int) -> list[AsyncSandbox]:
    gate = asyncio.Semaphore(concurrency)

    async def make() -> AsyncSandbox:
        async with gate:
            return await AsyncSandbox.create(template=template, timeout=SANDBOX_TIMEOUT, request_timeout=300)

    made = await asyncio.gather(*(make() for _ in range(count)), return_exceptions=True)
    boxes = [box for box in made if isinstance(box, AsyncSandbox)]
    failed = [box for box in made if not isinstance(box, AsyncSandbox)]
    if failed:
        await kill_all(boxes)
        raise RuntimeError(f"{len(failed)} of {count} creates failed: {error_kind(failed[0])}")
    return boxes


async def kill_all(boxes: list[AsyncSandbox]) -> None:
    await asyncio.gather(*(box.kill(request_timeout=300) for box in boxes), return_exceptions=True)


async def bench(opts: argparse.Namespace, run: Run) -> dict[str, Rounds]:
    rounds = {E2B_PATH: Rounds(), GUILDS_PATH: Rounds()}
    with served(run, opts.sandbox, cap=opts.agents + 8) as server:
        made_at = time.perf_counter()
        boxes = await make_sandboxes(run.template, opts.agents, opts.concurrency)
        print(f"{len(boxes)} sandboxes made in {time.perf_counter() - made_at:.1f} s", file=sys.stderr)
        try:
            async with guilds.open(run.config, data_dir=server.data) as agent:
                records = await agent.list_agents(owner="e2b:default")
                assert len(records) == len(boxes), (len(records), len(boxes))
                made = [await agent.made_agent(r.id) for r in records]
                run_ids = [f"busy-{m.id}" for m in made]

                async def e2b_call(i: int) -> None:
                    result = await boxes[i % len(boxes)].commands.run("true", request_timeout=300)
                    if result.exit_code != 0:
                        raise RuntimeError(f"exit {result.exit_code}")

                async def guilds_call(i: int) -> None:
                    k = i % len(made)
                    result = await made[k].call(run_ids[k], "shell", {"command": "true"})
                    if result.is_error:
                        raise RuntimeError(result.text[:80])

                paths = {E2B_PATH: e2b_call, GUILDS_PATH: guilds_call}
                warm = Rounds()
                for call in paths.values():  # every agent's first call of each path: helpers started
                    await one_round(call, len(boxes), opts.concurrency, warm, server.pid)
                if warm.errors:
                    raise RuntimeError(f"warm-up failed: {dict(warm.errors)}")
                names = list(paths)
                for r in range(opts.rounds):
                    for name in names[r % 2:] + names[:r % 2]:
                        await one_round(paths[name], opts.calls, opts.concurrency, rounds[name], server.pid)
                        print(f"round {r + 1} {name}: {rounds[name].calls[-1] / rounds[name].seconds[-1]:.0f} calls/s",
                              file=sys.stderr)
        finally:
            await kill_all(boxes)
    return rounds


def report(opts: argparse.Namespace, rounds: dict[str, Rounds]) -> None:
    print(f"\nsandbox {opts.sandbox}, {opts.agents} agents, {opts.concurrency} calls at once, "
          f"{opts.rounds} rounds of {opts.calls} calls per path; load average (1 min) {os.getloadavg()[0]:.1f} "
          "at the end\n")
    print("| path | calls/s | calls/s, median round | p50 (ms) | p99 (ms) | server CPU ms/call | "
          "client CPU ms/call | vs guilds.open |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    floor = rounds[GUILDS_PATH].per_second()
    for name, label in ((E2B_PATH, "E2B SDK `commands.run(\"true\")` against `guilds serve --e2b`"),
                        (GUILDS_PATH, "`guilds.open`: `shell` `true`")):
        r = rounds[name]
        calls = sum(r.calls)
        median_round = statistics.median(c / s for c, s in zip(r.calls, r.seconds, strict=True))
        print(f"| {label} | {r.per_second():.0f} | {median_round:.0f} | {statistics.median(r.latencies):.1f} | "
              f"{nearest_rank(r.latencies, 99):.1f} | {r.server_cpu * 1000 / calls:.2f} | "
              f"{r.own_cpu * 1000 / calls:.2f} | {r.per_second() / floor:.2f}x |")
    for name, r in rounds.items():
        for kind, n in r.errors.most_common():
            print(f"- {name}: {n} x {kind}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="bwrap", choices=("local", "bwrap", "docker"))
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--calls", type=int, default=1000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per path")
    opts = parser.parse_args()
    with run_folder() as run:
        report(opts, asyncio.run(bench(opts, run)))
    sys.exit(1 if run.left else 0)


if __name__ == "__main__":
    main()
