"""A checkpoint and a rewind of a ~100 MB home, against `cp -a` and `git stash` of the same tree.

Run: .venv/bin/python bench/checkpoint_bench.py [--rounds N] [--mb 100] [--no-bwrap] [--overlay]

The tree: whole packages of this venv's site-packages, copied until they hold
--mb megabytes (thousands of files and folders, links where the packages have
them), made a git repository once (untimed). Each round changes the tree as a
call does (three files edited, one added, one removed) and times, in a new
shuffled order each round so the machine's load falls on all alike:

- checkpoint: ``CheckpointStore.take`` (the mechanism a call's checkpoint runs);
- rewind: ``CheckpointStore.rewind`` to the checkpoint before the change;
- cp -a: a whole copy of the tree (what a naive checkpoint costs);
- cp -al: a hard-link farm of it (a content store's links, without hashing);
- overlay: mounting and unmounting an overlayfs layer over the tree (a new layer, root only);
- git stash: ``git stash push -u`` then ``git stash pop`` of the same change;

then, on bwrap (root and bubblewrap), a shell call of `true` through the toolbox
on that home with ``agent.checkpoints`` on against off, and a rewind through
``AgentCheckpoints.rewind`` (the gate, the stop of background commands through
the helper, the restore, the record). The first, whole checkpoint is timed once.
A reflink (FICLONE) is tried once and said to work or not here.

With --overlay (root, bwrap, overlayfs) it times instead an overlay home: an agent
made on demand from a template whose home is the tree, on bwrap. Each round its
own checkpoint (the upper walked) and the walk of a plain folder holding the same
tree (a twin copy, changed alike: a plain home's checkpoint) take turns in a
shuffled order after the same change, and so do their rewinds; then a shell call
of `true` and a rewind through the agent.

Prints Markdown tables: median ms of each, and ratios against cp -a and git stash
(--overlay: against the walk of the same tree in a plain folder), with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.checkpoints import CheckpointStore  # noqa: E402
from guilds.checkpoints.home_tree import FICLONE  # noqa: E402

BIG = 1 << 40


def make_tree(home: Path, mb: int) -> tuple[int, int]:
    """Packages of site-packages copied into home until mb megabytes; (files, bytes)."""
    source = Path(next(p for p in site.getsitepackages() if p.endswith("site-packages")))
    total, budget = 0, mb << 20
    for package in sorted(source.iterdir()):
        if total >= budget or not package.is_dir() or package.name.startswith(("_", ".")):
            continue
        size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file() and not f.is_symlink())
        if total + size > budget * 1.1:  # a package that would pass the size by far is left out
            continue
        shutil.copytree(package, home / package.name, symlinks=True)
        total += size
    files = sum(1 for _ in home.rglob("*"))
    return files, total


def make_repo(home: Path, mb: int, *, packed: bool = False) -> tuple[int, int]:
    """home made a git repository of make_tree's mb megabytes, committed; (files, bytes).
    packed: its objects in one pack, as a clone holds them (else loose, as a first commit)."""
    home.mkdir()
    files, size = make_tree(home, mb)
    git(home, "init", "-q")
    git(home, "config", "gc.auto", "0")  # no gc detached into the background mid-round
    git(home, "config", "maintenance.auto", "false")
    git(home, "add", "-A")
    git(home, "commit", "-q", "-m", "tree")
    if packed:
        git(home, "repack", "-a", "-d", "-q")
    return files, size


def git(home: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(home), *argv], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b",
                        "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"})


def change(home: Path, n: int) -> None:
    """A call's edits: three files edited, one added, one removed (and put back next round)."""
    py = sorted(home.rglob("*.py"))
    for f in py[n % 50: n % 50 + 3]:
        f.write_text(f.read_text() + f"\n# round {n}\n")
    (home / f"new-{n}.txt").write_text("x" * 1000)
    doomed = py[-1 - n % 20]
    doomed.rename(home / f".gone-{n}")


def timed(work: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    work()
    return (time.perf_counter() - t0) * 1000


def reflink_works(folder: Path) -> bool:
    import fcntl

    (folder / "a").write_bytes(b"x" * 4096)
    src, dst = os.open(folder / "a", os.O_RDONLY), os.open(folder / "b", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return True
    except OSError:
        return False
    finally:
        os.close(src)
        os.close(dst)


def overlay(home: Path, work: Path) -> Callable[[], None]:
    def mount_and_unmount() -> None:
        for name in ("upper", "work", "merged"):
            shutil.rmtree(work / name, ignore_errors=True)
            (work / name).mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={home},upperdir={work}/upper,workdir={work}/work", str(work / "merged")],
                       check=True, capture_output=True)
        subprocess.run(["umount", str(work / "merged")], check=True)
    return mount_and_unmount


def host_rounds(root: Path, home: Path, rounds: int) -> dict[str, list[float]]:
    """The peers work on a twin of the tree, changed alike: a hard link or git's rewrite
    moves a file's ctime, which would make every file look changed to the checkpoints."""
    twin = root / "twin"
    subprocess.run(["cp", "-a", str(home), str(twin)], check=True)
    store = CheckpointStore(root / "store", home)
    first = timed(lambda: store.take(max_count=BIG, max_bytes=BIG))
    times: dict[str, list[float]] = {"first checkpoint (whole tree)": [first]}
    steps: dict[str, Callable[[], object]] = {
        "cp -a": lambda: subprocess.run(["cp", "-a", str(twin), str(root / "copy")], check=True),
        "cp -al": lambda: subprocess.run(["cp", "-al", str(twin), str(root / "links")], check=True),
        "git stash push -u + pop": lambda: (git(twin, "stash", "push", "-u", "-q"), git(twin, "stash", "pop", "-q")),
    }
    if os.geteuid() == 0:
        (root / "ovl").mkdir()
        steps["overlay layer (mount + umount)"] = overlay(twin, root / "ovl")
    for n in range(rounds):
        point = store.take(max_count=BIG, max_bytes=BIG)
        change(home, n)
        change(twin, n)
        order = [*steps, "checkpoint", "rewind"]
        random.shuffle(order)
        for name in order:
            if name == "checkpoint":
                ms = timed(lambda: store.take(max_count=BIG, max_bytes=BIG))
            elif name == "rewind":
                continue
            else:
                ms = timed(steps[name])
            times.setdefault(name, []).append(ms)
            shutil.rmtree(root / "copy", ignore_errors=True)
            shutil.rmtree(root / "links", ignore_errors=True)
        times.setdefault("rewind", []).append(timed(lambda p=point: store.rewind(p.id)))
    return times


async def bwrap_rounds(root: Path, home: Path, rounds: int) -> dict[str, list[float]]:
    """A shell call with checkpoints on and off, and a rewind, through the toolbox on bwrap."""
    import guilds
    from guilds.config.settings import AgentSettings

    times: dict[str, list[float]] = {}
    agents = {}
    for on in (True, False):
        settings = AgentSettings(id=f"ckb-{os.getpid()}", home=home, sandbox="bwrap", checkpoints=on,
                                 max_tool_calls=10_000_000, transport="resident")
        agents[on] = await guilds.open(settings, data_dir=root / f"data{int(on)}").__aenter__()
        await agents[on].call("w", "shell", {"command": "true"})
    for n in range(rounds):
        for on in random.sample([True, False], 2):
            t0 = time.perf_counter()
            await agents[on].call("r", "shell", {"command": "true"})
            times.setdefault(f"bwrap shell `true`, checkpoints {'on' if on else 'off'}", []).append(
                (time.perf_counter() - t0) * 1000)
        seq = n + 1  # the call just made on run r with checkpoints on
        change(home, 1000 + n)
        t0 = time.perf_counter()
        await agents[True].rewind("r", seq)
        times.setdefault("bwrap rewind (Agent.rewind, call gate, background stop, record)", []).append(
            (time.perf_counter() - t0) * 1000)
    for agent in agents.values():
        await agent.toolbox.close()
        await agent.toolbox.sandbox.stop()
        await agent.__aexit__(None, None, None)
    return times


def report(times: dict[str, list[float]], files: int, size: int) -> None:
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"tree: {files} paths, {size / 1e6:.0f} MB; median of {len(next(iter(times.values())))} or more\n")
    print("| step | median ms | / cp -a | / git stash push -u + pop |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms in med.items():
        cp, stash = med.get("cp -a"), med.get("git stash push -u + pop")
        ratios = f"{ms / cp:.3f} | {ms / stash:.3f}" if cp and stash else " | "
        print(f"| {name} | {ms:.1f} | {ratios} |")


SERVER = """
[agent]
id = "ckb-server"
home = "{own}"
sandbox = "local"

[templates.repo.agent]
home = "{repo}"
sandbox = "bwrap"
checkpoints = true
max_tool_calls = 10000000
"""


async def overlay_rounds(root: Path, repo: Path, rounds: int) -> dict[str, list[float]]:
    """An overlay home's checkpoint and rewind against the whole walk of the same tree in a plain folder."""
    import guilds

    (root / "own").mkdir()
    settings = root / "server.toml"
    settings.write_text(SERVER.format(own=root / "own", repo=repo))
    settings.chmod(0o600)
    data = root / "data"
    times: dict[str, list[float]] = {}
    async with guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)}) as server:
        agent = await server.make_agent("repo")
        home = Path(agent.record.home)
        upper = agent.toolbox.checkpoints.files
        if upper.layers() is None:
            raise SystemExit("the agent's home is not an overlay here (root, overlayfs and a uid of its own)")
        twin = root / "twin"
        subprocess.run(["cp", "-a", str(home), str(twin)], check=True)
        walk = CheckpointStore(root / "walk-store", twin)
        await agent.call("w", "shell", {"command": "true"})
        times["walk: first checkpoint (the whole home copied, once)"] = [
            timed(lambda: walk.take(max_count=BIG, max_bytes=BIG))]
        stores = {"overlay home: checkpoint (its upper)": upper, "walk of the same tree (a plain folder): checkpoint": walk}
        for n in range(rounds):
            points = {name: store.take(max_count=BIG, max_bytes=BIG) for name, store in stores.items()}
            change(home, n)
            change(twin, n)
            for name in random.sample(list(stores), 2):
                times.setdefault(name, []).append(timed(lambda s=stores[name]: s.take(max_count=BIG, max_bytes=BIG)))
            change(home, 100 + n)
            change(twin, 100 + n)
            for name in random.sample(list(stores), 2):
                label = name.replace("checkpoint", "rewind")
                times.setdefault(label, []).append(timed(lambda s=stores[name], p=points[name]: s.rewind(p.id)))
            t0 = time.perf_counter()
            await agent.call("r", "shell", {"command": "true"})
            times.setdefault("overlay home on bwrap: shell `true`, checkpoints on", []).append(
                (time.perf_counter() - t0) * 1000)
            change(home, 1000 + n)
            t0 = time.perf_counter()
            await agent.rewind("r", n + 1)
            times.setdefault("overlay home on bwrap: a rewind through `Agent.rewind`", []).append(
                (time.perf_counter() - t0) * 1000)
        times["upper: paths in the last checkpoint"] = [float(upper.points()[-1].files)]
        await server.remove_agent(agent.id)
    return times


def overlay_report(times: dict[str, list[float]], files: int, size: int) -> None:
    med = {name: statistics.median(v) for name, v in times.items()}
    floor = {"checkpoint": med["walk of the same tree (a plain folder): checkpoint"], "rewind": med["walk of the same tree (a plain folder): rewind"]}
    print(f"tree: {files} paths, {size / 1e6:.0f} MB; median of {len(times['overlay home: checkpoint (its upper)'])}; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| step | median ms | / the walk's checkpoint | / the walk's rewind |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms in med.items():
        print(f"| {name} | {ms:.1f} | {ms / floor['checkpoint']:.3f} | {ms / floor['rewind']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--no-bwrap", action="store_true")
    parser.add_argument("--overlay", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckbench-") as tmp:
        root = Path(tmp)
        home = root / "home"
        files, size = make_repo(home, opts.mb)
        if opts.overlay:
            overlay_report(asyncio.run(overlay_rounds(root, home, opts.rounds)), files, size)
            return
        print(f"reflink (FICLONE) on this filesystem: {'yes' if reflink_works(root) else 'no'}")
        times = host_rounds(root, home, opts.rounds)
        if not opts.no_bwrap:
            times.update(asyncio.run(bwrap_rounds(root, home, opts.rounds)))
        report(times, files, size)


if __name__ == "__main__":
    main()
