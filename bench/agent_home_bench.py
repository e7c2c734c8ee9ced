"""An agent's home made by overlay against by copy, from a template whose home is a real git
repository of about 100 MB; the disk ten agents' homes use each way; the first `git status`
inside the bwrap sandbox each way.

Run (as root: the overlay needs it): .venv/bin/python bench/agent_home_bench.py [--rounds N] [--mb 100] [--agents 10]

The template's home: packages of this venv's site-packages copied until they hold
--mb megabytes (checkpoint_bench's tree), made a git repository (one commit,
packed by ``git gc``), untimed. Homes are made with ``guilds.agents.homes.make_home``
under a data folder on the same filesystem, for the agent's uid (a bwrap
sandbox's under a root orchestrator). Each round times, in a new shuffled order:

- overlay, walk reused: a make within HOME_VERSION_SECONDS of the last walk of
  the template (makes in a burst): the user namespace, the idmapped layer, the mount;
- overlay, template walked: the same with the template's version walked again
  (every entry stat'ed, no content read): a make after a pause;
- copy: ``cp -a`` of the template, then the sandbox's start giving every file to
  the agent's uid (``own_tree``): what a copied home costs before the agent can use it;
- the removal of each (unmount and the agent's own folders; ``rm -rf`` of the copy).

The first overlay make of the template (its layer frozen: a copy and a chown)
is timed once, and so is what the idmapped layer saves: an overlay of the layer
as root's with every file then given to the agent's uid through it, which
copies every file up. Then --agents homes each way, and the disk they use
(``du -x``: the layer and the agents' own folders; the copies). Then, on bwrap,
rounds of: a home made each way, its sandbox started, and ``git status``
inside it twice (the first reads every file: the index's stat data, uid
included, matches neither way's files).

Prints Markdown tables: median ms of each step with its ratio to the copy's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from checkpoint_bench import git, make_tree  # noqa: E402

from guilds.agents import home_layers, mounts  # noqa: E402
from guilds.agents.homes import make_home, overlay_unavailable, remove_home  # noqa: E402
from guilds.sandbox._host_folder import own_tree  # noqa: E402
from guilds.sandbox.bwrap.bwrap_argv import agent_uid  # noqa: E402

OVERLAY_REUSED, OVERLAY_WALKED, COPY = "overlay, walk reused", "overlay, template walked", "copy: cp -a + chown"


def timed(work: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    work()
    return (time.perf_counter() - t0) * 1000


def du(*folders: Path) -> int:
    """Bytes the folders use on their filesystem (mounts under them not entered)."""
    out = subprocess.run(["du", "-s", "-x", "-B1", "-c", *map(str, folders)], check=True, capture_output=True,
                         text=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def template(root: Path, mb: int) -> tuple[Path, int, int]:
    tpl = root / "template"
    tpl.mkdir()
    files, size = make_tree(tpl, mb)
    git(tpl, "init", "-q")
    git(tpl, "config", "gc.auto", "0")
    git(tpl, "add", "-A")
    git(tpl, "commit", "-q", "-m", "tree")
    git(tpl, "gc", "-q")
    return tpl, files, size


def make_rounds(tpl: Path, data: Path, rounds: int) -> dict[str, list[float]]:
    homes, times = data / "agent-homes", {}
    owner = (agent_uid("bench"), agent_uid("bench"))
    times["first overlay make (the layer frozen)"] = [timed(lambda: make_home(tpl, homes / "first", data, owner))]
    remove_home(homes / "first", data)
    times["walk of the template (its version)"] = []
    for n in range(rounds):
        times["walk of the template (its version)"].append(timed(lambda: home_layers.version_of(tpl)))
        for way in random.sample([OVERLAY_REUSED, OVERLAY_WALKED, COPY], 3):
            home = homes / f"r{n}"
            home_layers.HOME_VERSION_SECONDS = 0.0 if way == OVERLAY_WALKED else 3600.0
            if way == COPY:
                made = timed(lambda h=home: make_home(tpl, h, data, None))
                times.setdefault("copy: cp -a", []).append(made)
                chown = timed(lambda h=home: own_tree(str(h), owner))
                times.setdefault("copy: the sandbox's chown", []).append(chown)
                times.setdefault(COPY, []).append(made + chown)
            else:
                times.setdefault(way, []).append(timed(lambda h=home: make_home(tpl, h, data, owner)))
            removal = "remove: unmount + own folders" if way != COPY else "remove: rm -rf of the copy"
            times.setdefault(removal, []).append(timed(lambda h=home: remove_home(h, data)))
    return times


def chown_through(data: Path) -> tuple[float, int]:
    """What the idmapped layer saves: an overlay of the layer as root's, then every file given
    to the agent's uid through it (ms), and what that copies up (bytes in the upper folder)."""
    layer = data / home_layers.LAYERS_FOLDER / sorted(
        p.name for p in (data / home_layers.LAYERS_FOLDER).iterdir() if p.is_dir() and p.name[0] != ".")[-1]
    own = data / "chown-through"
    for name in ("home", "upper", "work"):
        (own / name).mkdir(parents=True)
    fd = mounts.layer_mount(str(layer), (0, 0))
    try:
        mounts.mount_overlay(str(own / "home"), fd, str(own / "upper"), str(own / "work"))
    finally:
        os.close(fd)
    try:
        ms = timed(lambda: own_tree(str(own / "home"), (agent_uid("bench"), agent_uid("bench"))))
    finally:
        mounts.unmount(own / "home")
    used = du(own / "upper")
    shutil.rmtree(own)
    return ms, used


def disk(tpl: Path, data: Path, agents: int) -> list[tuple[str, int]]:
    homes, owner = data / "agent-homes", (agent_uid("bench"), agent_uid("bench"))
    made = [homes / f"o{n}" for n in range(agents)], [homes / f"c{n}" for n in range(agents)]
    try:
        for home in made[0]:
            make_home(tpl, home, data, owner)
        for home in made[1]:
            make_home(tpl, home, data, None)
        assert all(mounts.mounted(h) for h in made[0]) and not any(mounts.mounted(h) for h in made[1])
        return [("the template's home", du(tpl)),
                (f"{agents} overlay homes: the layer + their own folders",
                 du(data / home_layers.LAYERS_FOLDER, data / home_layers.OVERLAYS_FOLDER)),
                (f"{agents} copies", du(*made[1]))]
    finally:
        for home in (*made[0], *made[1]):
            remove_home(home, data)


async def git_rounds(tpl: Path, data: Path, rounds: int) -> dict[str, list[float]]:
    from guilds.config.settings import AgentSettings
    from guilds.sandbox import get_sandbox

    times: dict[str, list[float]] = {}
    for n in range(rounds):
        for way in random.sample(["overlay", "copy"], 2):
            settings = AgentSettings(id=f"ahb-{way}-{n}", home=data / "agent-homes" / f"g-{way}-{n}",
                                     sandbox="bwrap")
            sandbox = get_sandbox(settings, data)
            make_home(tpl, settings.home, data, sandbox.home_owner if way == "overlay" else None)
            try:
                t0 = time.perf_counter()
                await sandbox.start()
                times.setdefault(f"{way}: sandbox start", []).append((time.perf_counter() - t0) * 1000)
                for which in ("first", "second"):
                    t0 = time.perf_counter()
                    done = await sandbox.exec(["git", "status", "--porcelain"], timeout=300)
                    times.setdefault(f"{way}: {which} git status", []).append((time.perf_counter() - t0) * 1000)
                    assert done.exit_code == 0 and not done.stdout.strip(), done.stderr[-300:]
            finally:
                await sandbox.remove()
                remove_home(settings.home, data)
    return times


def table(times: dict[str, list[float]], peer: str) -> None:
    med = {name: statistics.median(v) for name, v in times.items()}
    print("| step | median ms | runs | / " + peer + " |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms in med.items():
        print(f"| {name} | {ms:.1f} | {len(times[name])} | {ms / med[peer]:.3f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--no-bwrap", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="homebench-") as tmp:
        root = Path(tmp)
        data = root / "data"
        (data / "agent-homes").mkdir(parents=True)
        why = overlay_unavailable(data, (1, 1))
        if why is not None:
            sys.exit(f"agent_home_bench: no overlay here: {why}")
        tpl, files, size = template(root, opts.mb)
        entries = sum(1 for _ in tpl.rglob("*"))
        print(f"template: a git repository, {files} paths and {size / 1e6:.0f} MB in its work tree, "
              f"{entries} entries and {du(tpl) / 1e6:.0f} MB on disk with .git\n")
        times = make_rounds(tpl, data, opts.rounds)
        chown_ms, chown_bytes = chown_through(data)
        times["overlay of a root-owned layer, then chown through it (no idmap)"] = [chown_ms]
        table(times, COPY)
        print("| what | MB on disk |")
        print("| --- | ---: |")
        for what, used in [*disk(tpl, data, opts.agents), ("one home chowned through an overlay: its upper folder",
                                                          chown_bytes)]:
            print(f"| {what} | {used / 1e6:.1f} |")
        print()
        if not opts.no_bwrap:
            table(asyncio.run(git_rounds(tpl, data, opts.rounds)), "copy: first git status")
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
