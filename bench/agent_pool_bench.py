"""A make from a warm pool against a make without one: ``Agents.make`` and the first call.

Run: DOCKER_HOST=... .venv/bin/python bench/agent_pool_bench.py [--rounds N] [--backends bwrap,docker]
(eval "$(bash scripts/docker-test-env.sh)" gives DOCKER_HOST and the image.)

One ``guilds.open(..., pool=True)`` serves two templates alike but for the pool:
``pooled`` (``[templates.pooled.pool]``, spare 1) and ``cold`` (none). Each round
makes one agent of each, in turns (the order swapped every round, so a change
in the machine's load falls on both alike), and times ``make_agent`` and then
the first call, a ``shell`` of ``true``; each agent is removed before the next
is made, and each make waits until the pool is full and idle (no refill runs
beside a measured make). Prints a Markdown table: the p50 and p90 of the make,
of the first call, and of both, and the cold path's p50 over the pooled one's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import guilds  # noqa: E402
from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable  # noqa: E402
from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable  # noqa: E402

IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
FILL_WAIT_SECONDS = 120.0


def settings_text(backend: str) -> str:
    docker = f"[templates.{{name}}.docker]\nimage = '{IMAGE}'\nmemory = '512m'\n" if backend == "docker" else ""
    template = ("[templates.{name}.agent]\nhome = 'template-home'\nsandbox = '" + backend + "'\n" + docker)
    return ("[agent]\nid = 'bench'\nhome = 'home'\nsandbox = 'local'\n"
            + template.format(name="pooled")
            + "[templates.pooled.pool]\nspare = 1\nmax = 4\ncool_down_seconds = 0\nwindow_seconds = 1\n"
            + template.format(name="cold")
            + "[agents]\nmax = 20\nmax_per_owner = 20\n")


async def settled(agents) -> None:
    """Until the pool is at its target with nothing being made."""
    deadline = time.monotonic() + FILL_WAIT_SECONDS
    while True:
        counts = agents.pools.counts()["pooled"]
        if counts.making == 0 and counts.ready >= counts.target >= 1:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the pool did not fill within {FILL_WAIT_SECONDS:g} s: {counts}")
        await asyncio.sleep(0.02)


async def one(server, agents, template: str, n: int) -> tuple[float, float]:
    await settled(agents)
    began = time.perf_counter()
    made = await server.make_agent(template, owner="bench")
    made_at = time.perf_counter()
    result = await made.call(f"run-{template}-{n}", "shell", {"command": "true"})
    answered = time.perf_counter()
    if result.is_error:
        raise SystemExit(f"{template}: the first call failed: {result.text}")
    await server.remove_agent(made.id)
    return made_at - began, answered - made_at


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(backend: str, rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as work:
        folder = Path(work)
        (folder / "template-home" / "src").mkdir(parents=True)
        (folder / "template-home" / "src" / "app.py").write_text("print('hello')\n")
        path = folder / "server.toml"
        path.write_text(settings_text(backend))
        path.chmod(0o600)
        times: dict[str, list[tuple[float, float]]] = {"pooled": [], "cold": []}
        async with guilds.open(path, data_dir=folder / "data", pool=True) as server:
            agents = await server.agents()
            await one(server, agents, "pooled", -1)  # the helpers cached, the image warm: not counted
            await one(server, agents, "cold", -1)
            for n in range(rounds):
                order = ("pooled", "cold") if n % 2 == 0 else ("cold", "pooled")
                for template in order:
                    times[template].append(await one(server, agents, template, n))
            counts = agents.pools.counts()["pooled"]
        return rows(backend, times, counts.hits, counts.misses)


def rows(backend: str, times: dict[str, list[tuple[float, float]]], hits: int, misses: int) -> list[str]:
    out = []
    p50 = {}
    for template, label in (("pooled", f"warm pool ({hits} hits, {misses} misses)"), ("cold", "no pool")):
        makes = [m * 1000 for m, _ in times[template]]
        firsts = [c * 1000 for _, c in times[template]]
        totals = [(m + c) * 1000 for m, c in times[template]]
        p50[template] = statistics.median(totals)
        out.append(f"| {backend} | {label} | {statistics.median(makes):.1f} | {statistics.median(firsts):.1f} | "
                   f"{p50[template]:.1f} | {quantile(totals, 0.9):.1f} |")
    out.append(f"| {backend} | no pool / warm pool, p50 of both | | | {p50['cold'] / p50['pooled']:.1f}x | |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backends", default="bwrap,docker")
    args = parser.parse_args()
    why_not = {"bwrap": bwrap_unavailable, "docker": docker_unavailable}
    lines = ["| backend | make | `make_agent` p50 ms | first `shell true` p50 ms | both p50 ms | both p90 ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    for backend in args.backends.split(","):
        reason = why_not[backend]()
        if reason is not None:
            print(f"{backend}: skipped ({reason})", file=sys.stderr)
            continue
        lines += asyncio.run(bench(backend, args.rounds))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
