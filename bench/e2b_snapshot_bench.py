"""E2B snapshots and fork through the E2B SDK: a snapshot of a sandbox whose home is a ~100 MB git
repository, a sandbox made from it to its first command, and `fork(n)` to the last child's first
command, against `cp -a` of the same home in the same run.

Run (as root, bubblewrap and overlayfs here):
    .venv/bin/python bench/e2b_snapshot_bench.py [--rounds 3] [--mb 100] [--count 10]

The tree: whole packages of this venv's site-packages until --mb megabytes, made a git
repository (untimed), the starting home of the server's agent (the default template) on
bwrap. A real `guilds serve --e2b` and the unmodified E2B Python SDK (sync); one sandbox is
created and changes its home as a command does (files edited, added, removed, a commit).
Each round, in a new shuffled order so the machine's load falls on all alike, times:

- snapshot: ``create_snapshot()`` (what the home changed frozen as a layer above those it stands on);
- from the snapshot: ``Sandbox.create(snapshot_id)`` and its first ``commands.run("true")``;
- fork(n): ``sandbox.fork(count=n)`` and every child's first ``commands.run("true")``, all
  at once, until the last one answers;
- cp -a: one copy of the sandbox's home on this machine (the peer: a copied home per sandbox).

What a round made is removed after it (untimed). Prints a Markdown table: medians, and each
as a multiple of cp -a's median.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from checkpoint_bench import make_repo  # noqa: E402
from e2b import Sandbox  # noqa: E402

from e2b_kit import e2b_server, home_of  # noqa: E402

CHANGE = ("set -e; for f in $(git ls-files '*.py' | head -3); do echo '# edited' >> $f; done; "
          "echo new > added.txt; git rm -q $(git ls-files '*.py' | tail -1); "
          "git -c user.name=b -c user.email=b@b commit -qam change")


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) * 1000


def snapshot_round(source: Sandbox, made: list[str]) -> float:
    return timed(lambda: made.append(source.create_snapshot().snapshot_id))


def from_snapshot_round(snapshot_id: str, boxes: list[Sandbox]) -> float:
    def create() -> None:
        box = Sandbox.create(snapshot_id, timeout=600)
        boxes.append(box)
        assert box.commands.run("true").exit_code == 0

    return timed(create)


def fork_round(source: Sandbox, count: int, boxes: list[Sandbox]) -> float:
    def forked() -> None:
        children = source.fork(count=count, timeout=600)
        assert all(isinstance(c, Sandbox) for c in children), children
        boxes.extend(children)  # type: ignore[arg-type]
        with ThreadPoolExecutor(count) as pool:
            assert all(r.exit_code == 0 for r in pool.map(lambda c: c.commands.run("true"), children))

    return timed(forked)


def cp_round(home: Path, scratch: Path) -> float:
    target = scratch / f"cp-{time.monotonic_ns()}"
    spent = timed(lambda: subprocess.run(["cp", "-a", str(home), str(target)], check=True))
    shutil.rmtree(target)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--count", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="e2b-snap-bench-") as tmp:
        folder = Path(tmp)
        files, size = make_repo(folder / "home", args.mb)
        caps = f"[agents]\nmax_per_owner = {args.count + 4}\nmax = {args.count + 8}\n"
        with e2b_server(folder, "bwrap", caps) as server:
            os.environ.update(server.env())
            source = Sandbox.create(timeout=3600)
            source.commands.run(CHANGE, timeout=120)
            home = home_of(source, server.data)
            snapshot_id = source.create_snapshot().snapshot_id  # the one sandboxes are made from
            times: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                made: list[str] = []
                boxes: list[Sandbox] = []
                steps = {
                    "snapshot": lambda made=made: snapshot_round(source, made),
                    "a sandbox from the snapshot, to its first command":
                        lambda boxes=boxes: from_snapshot_round(snapshot_id, boxes),
                    f"fork({args.count}), to the last child's first command":
                        lambda boxes=boxes: fork_round(source, args.count, boxes),
                    "cp -a of the home": lambda: cp_round(home, folder),
                }
                for name in random.sample(list(steps), len(steps)):
                    times.setdefault(name, []).append(steps[name]())
                for box in boxes:
                    box.kill()
                for taken in made:
                    Sandbox.delete_snapshot(taken)
            source.kill()
    floor = statistics.median(times["cp -a of the home"])
    print(f"home: {files} files, {size / 1e6:.0f} MB; {args.rounds} rounds, medians\n")
    print("| step | ms | × cp -a |\n| --- | ---: | ---: |")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(f"| {name} | {median:.0f} | {median / floor:.2f} |")


if __name__ == "__main__":
    main()
