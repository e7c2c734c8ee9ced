"""Fork on bwrap: `fork(10)` and `fork(100)` of an agent whose home is a ~100 MB git
repository, to each child's first call, against `cp -a` of the same tree in the same run.

Run (as root, bubblewrap and overlayfs here):
    .venv/bin/python bench/fork_bench.py [--rounds 3] [--mb 100] [--sizes 10,100] [--steps 20] [--pool 100]

The tree: whole packages of this venv's site-packages until --mb megabytes, made a git
repository (untimed) whose objects are in one pack as a clone's are (--loose: loose, as
a first commit leaves them), the starting home of a template on bwrap. One agent is made of it
and changes its home as a call does (files edited, added, removed, a commit). Each round,
in a new shuffled order so the machine's load falls on all alike, times:

- fork(n): ``Agent.fork`` returning n live agents (rows admitted, the source's upper
  frozen as a layer under its call gate, n overlay homes mounted, n sandboxes started);
- to the last first call: the same fork, then every child's first ``shell`` call of
  `true` (all at once), until the last one answers;
- the source's pause: the freeze of its upper alone (what its call gate is held for);
- cp -a: one copy of the source's home (a copied home per child costs n of these),
  and, for n = 10, n copies one after another;
- with --pool N: fork(N) whose children all come from the template's warm pool of N agents
  (``Pools.take_swappable``: sandboxes and resident helpers running, homes swapped in place),
  to the last child's first call; the pool refilled before it and after it (untimed), and
  every other fork made to bypass the pool;
- the floor: n bare sandboxes of the source's shape (its bwrap argv read from /proc,
  the same mounts, the drop to the agent's uid, the init's interpreter started and
  ended), as many at once as a fork starts, no guilds code around them.

The children are removed after each round (untimed), and the disk is synced before each
step (untimed), so no step pays for the writeback of an earlier one's copies. Prints
Markdown tables.

--steps N: where a fork's time goes, per child. One fork(N) whose children are
started one at a time, then their first calls one at a time, so no step waits
for another's CPU: each step's wall time, summed over the fork, divided by N
(the freeze once). Steps that run at once in a real fork share the two cores
as these figures add up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from checkpoint_bench import make_repo  # noqa: E402

import guilds  # noqa: E402
from guilds.agents import fork, fork_layers, mounts  # noqa: E402
from guilds.agents.homes import overlay_dir  # noqa: E402
from guilds.record.store import Store  # noqa: E402
from guilds.sandbox.bwrap import bwrap_sandbox  # noqa: E402
from guilds.toolbox.resident_channel import ResidentChannel  # noqa: E402

SETTINGS = '''
[agent]
id = "fork-bench"
home = "own-home"
sandbox = "local"

[templates.repo.agent]
home = "{repo}"
sandbox = "bwrap"
transport = "resident"
max_tool_calls = 1000000

[agents]
max = {cap}
max_per_owner = {cap}
'''
POOL = """
[templates.repo.pool]
spare = {n}
max = {n}
"""
CHANGE = ("set -e; for f in $(git ls-files '*.py' | head -3); do echo '# edited' >> $f; done; "
          "echo new > added.txt; git rm -q $(git ls-files '*.py' | tail -1); "
          "git -c user.name=b -c user.email=b@b commit -qam change")


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def filled(pools, n: int) -> None:
    """Until the template's warm pool holds n ready agents (untimed)."""
    pool = pools.pools["repo"]
    deadline = time.monotonic() + 600
    while len(pool.ready) < n or pool.making:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool did not fill: {len(pool.ready)} of {n} ready")
        await asyncio.sleep(0.1)


@contextlib.contextmanager
def pool_bypassed(pools):
    """A fork that takes none of the warm pool's agents: every child made anew."""
    if pools is None:
        yield
        return
    taking = pools.take_swappable

    async def none(*_args, **_kwargs):
        return []

    pools.take_swappable = none
    try:
        yield
    finally:
        pools.take_swappable = taking


async def pooled_round(server, pools, source, n: int, times: dict[str, list[float]]) -> None:
    """fork(n) whose children all come from the template's warm pool of n, to the last child's
    first call (the pool's refill starts at once, as it does in a server)."""
    await filled(pools, n)
    start = time.perf_counter()
    done = await server.fork(source.id, n)
    answers = await asyncio.gather(*(c.call(f"first-{c.id}", "shell", {"command": "true"}) for c in done.agents))
    took = ms(start)
    assert all("exit_code" not in a.text for a in answers), answers[0].text
    times.setdefault(f"fork({n}) from a warm pool of {n}, to the last child's first call", []).append(took)
    for child in done.agents:
        await server.remove_agent(child.id)
    await filled(pools, n)


async def fork_round(server, source, n: int, times: dict[str, list[float]], first_calls: bool) -> None:
    start = time.perf_counter()
    done = await server.fork(source.id, n)
    made = ms(start)
    if first_calls:
        answers = await asyncio.gather(*(c.call(f"first-{c.id}", "shell", {"command": "true"}) for c in done.agents))
        assert all("exit_code" not in a.text for a in answers), answers[0].text
        times.setdefault(f"fork({n}) to the last child's first call", []).append(ms(start))
    else:
        times.setdefault(f"fork({n}) (n live agents, sandboxes started)", []).append(made)
    for child in done.agents:
        await server.remove_agent(child.id)


def copy_round(home: Path, target: Path, copies: int, times: dict[str, list[float]]) -> None:
    start = time.perf_counter()
    for i in range(copies):
        subprocess.run(["cp", "-a", str(home), str(target / f"c{i}")], check=True)
    times.setdefault(f"cp -a of the home x{copies}", []).append(ms(start))
    for i in range(copies):
        shutil.rmtree(target / f"c{i}")


def bare_argv(home: Path) -> list[str]:
    """The argv of the running sandbox whose home is home (its bwrap, read from /proc), made a
    floor: no --info-fd, and its init only started (its imports), not kept running."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
            if argv[:1] == ["bwrap"] and str(home) in argv:
                at = argv.index("--info-fd")
                del argv[at:at + 2]
                code = argv.index("-c", argv.index("--"))
                return [*argv[:code], "-c", "import _signal,posix,sys,time,_ctypes"]
    raise RuntimeError(f"no bwrap runs with {home}")


def bare_round(argv: list[str], n: int, times: dict[str, list[float]]) -> None:
    """n bare sandboxes of the source's shape (bwrap, its mounts, the drop to the agent's uid,
    the init's interpreter), FORK_STARTS_AT_ONCE at once, each run to its end."""
    def one(_: int) -> None:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)

    start = time.perf_counter()
    with ThreadPoolExecutor(fork.FORK_STARTS_AT_ONCE) as pool:
        list(pool.map(one, range(n)))
    times.setdefault(f"floor: {n} bare sandboxes of the same shape, {fork.FORK_STARTS_AT_ONCE} at once",
                     []).append(ms(start))


def freeze_round(data: Path, home: Path, times: dict[str, list[float]]) -> None:
    start = time.perf_counter()
    name = fork_layers.freeze_upper(data, overlay_dir(data, home) / "upper")
    times.setdefault("the source's pause: its upper frozen as a layer", []).append(ms(start))
    fork_layers.prune(data, [name])


ONCE = "the source's upper frozen as a layer (once, under its call gate; not per child)"
STEPS = (
    ("rows admitted", Store, ("admit_agents", "admit_agent")),
    (ONCE, fork, ("_freeze_live",)),
    ("the children's overlay folders made", fork, ("_plan",)),
    ("home mounted (its layers idmapped, the overlay)", fork, ("_home",)),
    ("  of which the user namespaces of the idmaps", mounts, ("_user_namespace",)),
    ("sandbox started", bwrap_sandbox.BwrapSandbox, ("_start",)),
    ("  of which bwrap launched to its init's ready", bwrap_sandbox.BwrapSandbox, ("_launch",)),
    ("rows made live", Store, ("mark_agents", "mark_agent")),
    ("first call: the resident helper opened", ResidentChannel, ("open",)),
)
"""Each step: its label, and the function timed (the first of the names the tree has: the bench
runs against an older tree too)."""


def timing(owner, name: str, spent: list[float]) -> None:
    """owner.name (a coroutine function or a function) made to add its wall time to spent."""
    inner = getattr(owner, name)
    if asyncio.iscoroutinefunction(inner):
        async def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                spent.append(ms(start))
    else:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent.append(ms(start))
    setattr(owner, name, functools.wraps(inner)(timed))


async def steps_round(server, source, n: int) -> list[tuple[str, float]]:
    """fork(n), its children started one at a time, then their first calls one at a time:
    each step's wall time summed over the fork, per child (ms)."""
    spent: dict[str, list[float]] = {label: [] for label, _, _ in STEPS}
    named = [(label, owner, next(n for n in names if hasattr(owner, n))) for label, owner, names in STEPS]
    kept = [(owner, name, getattr(owner, name)) for _, owner, name in named]
    for label, owner, name in named:
        timing(owner, name, spent[label])
    at_once, fork.FORK_STARTS_AT_ONCE = fork.FORK_STARTS_AT_ONCE, 1
    try:
        start = time.perf_counter()
        done = await server.fork(source.id, n)
        forked = ms(start)
        calls = []
        for child in done.agents:
            start = time.perf_counter()
            answer = await child.call(f"first-{child.id}", "shell", {"command": "true"})
            calls.append(ms(start))
            assert "exit_code" not in answer.text, answer.text
    finally:
        fork.FORK_STARTS_AT_ONCE = at_once
        for owner, name, inner in kept:
            setattr(owner, name, inner)
    for child in done.agents:
        await server.remove_agent(child.id)
    rows = [(label, sum(spent[label]) / (1 if label == ONCE else n)) for label, _, _ in STEPS]
    rows.append(("first call (`shell` `true`), the helper's opening included", statistics.mean(calls)))
    rows.append((f"the whole fork({n}), its children one at a time, per child", forked / n))
    return rows


async def run(root: Path, repo: Path, sizes: list[int], rounds: int,
              steps: int = 0, pool: int = 0) -> dict[str, list[float]] | list[tuple[str, float]]:
    (root / "own-home").mkdir()
    settings = root / "settings.toml"
    settings.write_text(SETTINGS.format(repo=repo, cap=max(sizes) + 2 * pool + 1) + (POOL.format(n=pool) if pool else ""))
    settings.chmod(0o600)
    data = root / "data"
    times: dict[str, list[float]] = {}
    async with guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)},
                           pool=bool(pool)) as server:
        pools = (await server.agents()).pools if pool else None
        if pools is not None:
            await filled(pools, pool)
        source = await server.make_agent("repo")
        changed = await source.call("r", "shell", {"command": CHANGE})
        assert "exit_code" not in changed.text, changed.text
        home = Path(source.record.home)
        upper = overlay_dir(data, home) / "upper"
        print(f"the source's upper: {sum(1 for _ in upper.rglob('*'))} paths; "
              f"`du -sh`: {(subprocess.run(['du', '-sh', str(upper)], capture_output=True, text=True).stdout.split() or ['?'])[0]}")
        if steps:
            per_child = await steps_round(server, source, steps)
            await server.remove_agent(source.id)
            return per_child
        scratch = root / "copies"
        scratch.mkdir()
        bare = bare_argv(home)
        steps = [("freeze", 0, False), ("cp", 1, False)] + ([("pooled", pool, True)] if pool else [])
        for n in sizes:
            steps += [("fork", n, False), ("fork", n, True), ("bare", n, False)]
            if n <= 10:
                steps.append(("cp", n, False))
        for _ in range(rounds):
            for kind, n, first in random.sample(steps, len(steps)):
                os.sync()  # untimed: no step pays for the writeback of the copies before it
                if kind == "pooled":
                    await pooled_round(server, pools, source, n, times)
                elif kind == "fork":
                    with pool_bypassed(pools):
                        await fork_round(server, source, n, times, first)
                elif kind == "cp":
                    copy_round(home, scratch, n, times)
                elif kind == "bare":
                    bare_round(bare, n, times)
                else:
                    freeze_round(data, home, times)
        await server.remove_agent(source.id)
    return times


def report(times: dict[str, list[float]], files: int, size: int, rounds: int) -> None:
    med = {name: statistics.median(v) for name, v in times.items()}
    cp = med["cp -a of the home x1"]
    print(f"tree: {files} paths, {size / 1e6:.0f} MB; median of {rounds} rounds; load average at the end "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| step | median ms | min ms | max ms | / one cp -a |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, value in sorted(med.items()):
        print(f"| {name} | {value:.0f} | {min(times[name]):.0f} | {max(times[name]):.0f} | {value / cp:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--sizes", default="10,100")
    parser.add_argument("--steps", type=int, default=0, help="where fork(STEPS)'s time goes, per child")
    parser.add_argument("--pool", type=int, default=0,
                        help="also fork(POOL) from the template's warm pool of POOL agents (the other forks bypass it)")
    parser.add_argument("--loose", action="store_true",
                        help="the repository's objects loose, as a first commit leaves them (default: packed, as a clone)")
    opts = parser.parse_args()
    sizes = [int(n) for n in opts.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="forkbench-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        files, size = make_repo(repo, opts.mb, packed=not opts.loose)
        if opts.steps:
            per_child = asyncio.run(run(root, repo, [opts.steps], 1, opts.steps))
            print(f"tree: {files} paths, {size / 1e6:.0f} MB; fork({opts.steps}), load average "
                  f"{os.getloadavg()[0]:.1f}\n\n| step | ms per child |\n| --- | ---: |")
            for label, value in per_child:
                print(f"| {label} | {value:.1f} |")
            return
        times = asyncio.run(run(root, repo, sizes, opts.rounds, pool=opts.pool))
        report(times, files, size, opts.rounds)


if __name__ == "__main__":
    main()
