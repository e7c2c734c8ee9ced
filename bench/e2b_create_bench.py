"""Sandboxes made on demand through the E2B API: `Sandbox.create(template=T)` then
`commands.run("true")`, in ComputeSDK's three modes, against a real `guilds serve --e2b`.

Run: .venv/bin/python bench/e2b_create_bench.py [--sandbox bwrap|docker|local] [--count N]
         [--modes sequential,staggered,burst] [--pool SPARE] [--profile] [--home-mb N]

One run, one machine: a real `guilds serve --e2b` (its own data folder, its caps
raised so that N sandboxes may live at once: ``agents.max``, ``agents.max_per_owner``) whose settings serve one template
of the sandbox kind asked (a starting home of a few files, or ``--home-mb`` more);
the unmodified E2B Python SDK (``AsyncSandbox``, one event loop) pointed at it by
the variables it prints.

Each iteration: ``AsyncSandbox.create(template=T)``, then ``commands.run("true")``,
timed from create's call to the command's end (TTI, as ComputeSDK times it), then
the sandbox killed, timed apart (not in TTI). The modes:

    sequential   N iterations one after another
    staggered    N iterations, one started every 200 ms (--stagger-ms)
    burst        N iterations started at once

Beside each, in the same run, the floors:

    in-process   guilds.open on the same settings and data folder (this process),
                 make_agent(T) then a shell call `true` as that agent: the same
                 registry and sandbox without HTTP, the E2B front or its process
                 service; the agent removed after, timed apart
    bare         a bare spawn of the sandbox alone, running `true`: `bwrap` with new
                 namespaces (bwrap), `docker run --rm` of the sandbox image (docker);
                 none on local

In sequential mode the paths take turns iteration by iteration, in a rotating
order; in staggered and burst mode each path runs the mode whole, the E2B path
first. Percentiles are nearest-rank over the iterations that succeeded (p99 of
100 is the second slowest); wall time is from the first create's call to the
last command's end. Errors are counted by kind.

``--pool SPARE``: the template keeps a warm pool of SPARE sandboxes
(``[templates.T.pool]``); ``--profile``: the server times the steps of each
create and kill inside itself (bench/create_profile/sitecustomize.py) and the
bench prints each step's median, per mode.

At the end, after the server stopped, it checks that nothing is left: no agent
live or being made in the record, no home, no process of the run's folder, no
container of the template; anything found is named, removed, and the exit
status is 1.

Prints Markdown tables (pasted into docs/benchmarks.md under "Sandboxes made on demand").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from template_server import Run, error_kind, nearest_rank, pool_settled, run_folder, served

import guilds
from e2b import AsyncSandbox

SANDBOX_TIMEOUT = 600
REQUEST_TIMEOUT = 300
SEQUENTIAL, STAGGERED, BURST = "sequential", "staggered", "burst"
E2B, IN_PROCESS, BARE = "E2B SDK against guilds serve --e2b", "in-process: guilds.open make_agent + call", "bare"


@dataclass
class Outcome:
    """One iteration: its times (ms) from its create's call, or its error's kind."""

    tti: float | None = None
    made: float | None = None
    """The create (or make) alone."""
    kill: float | None = None
    error: str | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Path_:
    name: str
    run: Callable[[], Awaitable[Outcome]]


@dataclass
class Result:
    outcomes: list[Outcome] = field(default_factory=list)

    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None]


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


async def e2b_iteration(template: str) -> Outcome:
    out = Outcome(started=time.perf_counter())
    sbx = None
    try:
        sbx = await AsyncSandbox.create(template=template, timeout=SANDBOX_TIMEOUT, request_timeout=REQUEST_TIMEOUT)
        out.made = _ms(out.started)
        result = await sbx.commands.run("true", request_timeout=REQUEST_TIMEOUT)
        out.ended = time.perf_counter()
        out.tti = (out.ended - out.started) * 1000
        if result.exit_code != 0:
            out.error = f"exit {result.exit_code}"
    except Exception as exc:  # every failure is counted by kind, none stops the mode
        out.error, out.ended = error_kind(exc), time.perf_counter()
    finally:
        if sbx is not None:
            killing = time.perf_counter()
            try:
                await sbx.kill(request_timeout=REQUEST_TIMEOUT)
                out.kill = _ms(killing)
            except Exception as exc:
                out.error = out.error or f"kill: {error_kind(exc)}"
    return out


def in_process_iteration(agent: guilds.Agent, template: str) -> Callable[[], Awaitable[Outcome]]:
    async def run() -> Outcome:
        out = Outcome(started=time.perf_counter())
        made = None
        try:
            made = await agent.make_agent(template, owner="floor")
            out.made = _ms(out.started)
            result = await made.call(f"floor-{made.id}", "shell", {"command": "true"})
            out.ended = time.perf_counter()
            out.tti = (out.ended - out.started) * 1000
            if result.is_error:
                out.error = f"shell: {result.text[:80]}"
        except Exception as exc:
            out.error, out.ended = error_kind(exc), time.perf_counter()
        finally:
            if made is not None:
                removing = time.perf_counter()
                try:
                    await agent.remove_agent(made.id)
                    out.kill = _ms(removing)
                except Exception as exc:
                    out.error = out.error or f"remove: {error_kind(exc)}"
        return out

    return run


BWRAP_BARE = ("bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
              "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
              "--unshare-all", "--die-with-parent", "--new-session", "--", "/bin/true")


def bare_iteration(sandbox: str, image: str) -> Callable[[], Awaitable[Outcome]] | None:
    """A spawn of the sandbox alone running `true` (none for local)."""
    if sandbox == "bwrap":
        argv: tuple[str, ...] = BWRAP_BARE
    elif sandbox == "docker":
        argv = ("docker", "run", "--rm", "--network", "none", image, "true")
    else:
        return None

    async def run() -> Outcome:
        out = Outcome(started=time.perf_counter())
        proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE)
        _, err = await proc.communicate()
        out.ended = time.perf_counter()
        out.tti = out.made = (out.ended - out.started) * 1000
        if proc.returncode != 0:
            out.error = f"exit {proc.returncode}: {err.decode(errors='replace').strip()[:80]}"
        return out

    return run


async def run_sequential(paths: list[Path_], count: int) -> dict[str, Result]:
    results = {p.name: Result() for p in paths}
    for i in range(count):
        for path in paths[i % len(paths):] + paths[:i % len(paths)]:
            results[path.name].outcomes.append(await path.run())
    return results


async def run_spread(run: Callable[[], Awaitable[Outcome]], count: int, every_s: float) -> Result:
    """count iterations, the i-th started i * every_s after the first (0: all at once)."""
    first = time.perf_counter()

    async def at(i: int) -> Outcome:
        await asyncio.sleep(max(0.0, first + i * every_s - time.perf_counter()))
        return await run()

    return Result(list(await asyncio.gather(*(at(i) for i in range(count)))))


@dataclass
class Row:
    mode: str
    path: str
    count: int
    result: Result
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's load average (1 minute) when the mode's path began and ended."""
    pool: str = ""
    """The warm pool's hits and misses in the mode, and what it held ready at the mode's start."""

    def figures(self) -> dict[str, float | str]:
        ok = self.result.ok()
        tti = [o.tti for o in ok if o.tti is not None]
        made = [o.made for o in ok if o.made is not None]
        kills = [o.kill for o in self.result.outcomes if o.kill is not None]
        outcomes = self.result.outcomes
        wall = (max(o.ended for o in outcomes) - min(o.started for o in outcomes)) * 1000 if outcomes else 0.0
        return {"ok": f"{len(ok)}/{len(outcomes)}", "rate": 100 * len(ok) / max(1, len(outcomes)),
                "p50": statistics.median(tti) if tti else math.nan,
                "p99": nearest_rank(tti, 99) if tti else math.nan,
                "made": statistics.median(made) if made else math.nan,
                "kill": statistics.median(kills) if kills else math.nan, "wall": wall}


def print_rows(rows: list[Row], title: str) -> None:
    print(f"\n{title}\n")
    print("| mode | path | success | p50 (ms) | p99 (ms) | wall (s) | create p50 (ms) | kill p50 (ms) | "
          "p50 vs in-process | load |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    floors = {r.mode: r.figures()["p50"] for r in rows if r.path == IN_PROCESS}
    for row in rows:
        f = row.figures()
        ratio = f["p50"] / floors[row.mode] if floors.get(row.mode) else math.nan  # type: ignore[operator]
        print(f"| {row.mode} | {row.path} | {f['ok']} ({f['rate']:.0f} %) | {f['p50']:.1f} | {f['p99']:.1f} | "
              f"{f['wall'] / 1000:.2f} | {f['made']:.1f} | {f['kill']:.1f} | {ratio:.2f}x | "
              f"{row.load[0]:.1f}–{row.load[1]:.1f} |")
    errors = [(row, collections.Counter(o.error for o in row.result.outcomes if o.error)) for row in rows]
    for row, counted in errors:
        for kind, n in counted.most_common():
            print(f"- {row.mode}, {row.path}: {n} x {kind}")
    for row in rows:
        if row.pool:
            print(f"- {row.mode}, the warm pool: {row.pool}")


def profile_steps(path: Path) -> list[tuple[str, int, float, float]]:
    """(step, count, median ms, total ms) of a profile file, slowest median first."""
    steps: dict[str, list[float]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            step, ms = line.rsplit(" ", 1)
            steps[step].append(float(ms))
    return sorted(((s, len(v), statistics.median(v), sum(v)) for s, v in steps.items()), key=lambda r: -r[2])


def print_profile(by_mode: dict[str, Path]) -> None:
    for mode, path in by_mode.items():
        print(f"\nserver steps, {mode} (the server's; median ms of each run of the step)\n")
        print("| step | runs | median (ms) | total (s) |\n| --- | ---: | ---: | ---: |")
        for step, n, median, total in profile_steps(path):
            print(f"| {step} | {n} | {median:.2f} | {total / 1000:.2f} |")


async def bench(opts: argparse.Namespace, run: Run) -> list[Row]:
    profile_file = run.folder / "profile.log"
    profiles: dict[str, Path] = {}
    rows: list[Row] = []
    with served(run, opts.sandbox, cap=opts.count + 8, pool=opts.pool, home_mb=opts.home_mb,
                profile=profile_file if opts.profile else None) as server:
        async with guilds.open(run.config, data_dir=server.data) as agent:
            paths = [Path_(E2B, lambda: e2b_iteration(run.template)),
                     Path_(IN_PROCESS, in_process_iteration(agent, run.template))]
            bare = bare_iteration(opts.sandbox, opts.image)
            if bare is not None:
                paths.append(Path_(BARE, bare))
            for _ in range(opts.warmup):  # each path's first runs: imports, caches, the helpers' cache
                for path in paths:
                    await path.run()
            profile_file.unlink(missing_ok=True)
            for mode in opts.modes.split(","):
                before = await pool_settled(server, run.template) if opts.pool is not None else None
                if mode == SEQUENTIAL:
                    began = os.getloadavg()[0]
                    results = await run_sequential(paths, opts.count)
                    rows += [Row(mode, p.name, opts.count, results[p.name], (began, os.getloadavg()[0]))
                             for p in paths]
                else:
                    every = opts.stagger_ms / 1000 if mode == STAGGERED else 0.0
                    for path in paths:
                        began = os.getloadavg()[0]
                        result = await run_spread(path.run, opts.count, every)
                        rows.append(Row(mode, path.name, opts.count, result, (began, os.getloadavg()[0])))
                        await asyncio.sleep(opts.settle)
                if before is not None:
                    after = await pool_settled(server, run.template, most_seconds=0)
                    for row in rows:
                        if row.mode == mode and row.path == E2B:
                            row.pool = (f"{after.hits - before.hits} hits, {after.misses - before.misses} misses "
                                        f"({before.ready} ready at the start)")
                if profile_file.exists():
                    profiles[mode] = profile_file.rename(run.folder / f"profile-{mode}.log")
                print_rows([r for r in rows if r.mode == mode], f"{mode} (so far)")
    print_profile(profiles)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="bwrap", choices=("local", "bwrap", "docker"))
    parser.add_argument("--count", type=int, default=100, help="iterations per mode and path")
    parser.add_argument("--modes", default=f"{SEQUENTIAL},{STAGGERED},{BURST}")
    parser.add_argument("--stagger-ms", type=float, default=200)
    parser.add_argument("--pool", type=int, default=None, metavar="SPARE", help="a warm pool of SPARE sandboxes")
    parser.add_argument("--home-mb", type=int, default=0, help="MB of data in the template's home besides its files")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between the spread modes' paths")
    parser.add_argument("--profile", action="store_true", help="time the server's steps of each create")
    parser.add_argument("--image", default="guilds-sandbox:latest", help="docker: the bare floor's image")
    opts = parser.parse_args()
    with run_folder() as run:
        rows = asyncio.run(bench(opts, run))
        pool = f", a warm pool of {opts.pool}" if opts.pool is not None else ", no pool"
        print_rows(rows, f"sandbox {opts.sandbox}{pool}, {opts.count} iterations per mode and path, "
                         f"template home {opts.home_mb} MB extra")
    sys.exit(1 if run.left else 0)


if __name__ == "__main__":
    main()
