"""Where the start of a guilds-code call goes: import time per op, CPU against the floors.

Run: .venv/bin/python bench/helper_start.py [--rounds N] [--helper FILE]

1. ``-X importtime`` of one call per op (median of 11): the ms of all imports,
   and of those after runpy, that is the helper's own (runpy and what it
   imports are the zipapp's, before any line of the helper runs; a helper
   that is a plain script has no runpy: all of its imports are its own).
2. Interleaved runs, one of each in turn, of ``python3 -I -S -c pass``,
   ``bash -c true``, a bare zipapp (an empty __main__) and the helper's shell
   ``true``: median wall and CPU (user + sys, from wait4) of each, and the
   median of each one's difference to the bare zipapp run of the same round.
   Taking turns puts a shared machine's load on all of them alike.

--helper measures a helper file built elsewhere (an older version, say) in
place of one built from src/.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import zipfile
from pathlib import Path

from helper_bench import PYTHON, ROOT, Helper, timed

OPS = {
    "shell `true`": ("shell", {"command": "true"}),
    "shell_status": ("shell_status", {}),
    "file_read, 200 lines": ("file_read", {"path": "lines.txt"}),
    "code_search, files": ("code_search", {"pattern": "hi", "path": "lines.txt"}),
    "code_search, content": ("code_search", {"pattern": "hi", "path": "lines.txt", "mode": "content"}),
}


def import_ms(h: Helper, op: str, args: dict) -> tuple[float, float]:
    """(all imports, imports after runpy) in ms, from python's -X importtime."""
    argv = h.argv(op, args)
    err = subprocess.run(argv[:1] + ["-X", "importtime"] + argv[1:], env=h.env,
                         capture_output=True, check=True).stderr.decode()
    rows = [line.split("|") for line in err.splitlines() if line.startswith("import time:") and "self" not in line]
    selfs = [(int(row[0].split(":")[1]), row[2].strip()) for row in rows]
    names = [name for _, name in selfs]
    after = names.index("runpy") + 1 if "runpy" in names else 0  # a script: no runpy
    return sum(us for us, _ in selfs) / 1000, sum(us for us, _ in selfs[after:]) / 1000


def bare_zipapp(work: Path) -> Path:
    path = work / "bare.pyz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("__main__.py", "")
    return path


def interleaved(argvs: dict[str, list[str]], rounds: int, env: dict) -> dict[str, tuple[list, list]]:
    """name -> (walls, cpus) in ms, one run of each argv per round, the order turning."""
    out = {name: ([], []) for name in argvs}
    names = list(argvs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            secs = timed(argvs[name], env=env)[0]
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # timed() reaped it
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            out[name][0].append(secs * 1000)
            out[name][1].append(cpu * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--helper", help="a built helper file to measure instead of src/")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".out" / "start"), help="scratch folder")
    opts = parser.parse_args()
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    h = Helper(work)
    if opts.helper:
        h.path = Path(opts.helper)
    (h.home / "lines.txt").write_text("hi\n" * 200)
    print("| call | all imports (ms) | after runpy: the helper's own (ms) |")
    print("| --- | ---: | ---: |")
    for what, (op, args) in OPS.items():
        samples = [import_ms(h, op, args) for _ in range(11)]
        print(f"| {what} | {statistics.median(s[0] for s in samples):.1f} "
              f"| {statistics.median(s[1] for s in samples):.1f} |")
    argvs = {
        "`python3 -I -S -c pass`": [PYTHON, "-I", "-S", "-c", "pass"],
        "`bash -c true`": ["bash", "-c", "true"],
        "bare zipapp": [PYTHON, "-I", "-S", str(bare_zipapp(work))],
        "guilds-code shell `true`": h.argv("shell", {"command": "true"}),
    }
    runs = interleaved(argvs, opts.rounds, h.env)
    base_walls, base_cpus = runs["bare zipapp"]
    print()
    print("| run | wall (ms) | CPU (ms) | CPU − bare zipapp, paired (ms) |")
    print("| --- | ---: | ---: | ---: |")
    for name, (walls, cpus) in runs.items():
        paired = statistics.median(c - b for c, b in zip(cpus, base_cpus, strict=True))
        print(f"| {name} | {statistics.median(walls):.1f} | {statistics.median(cpus):.1f} | {paired:+.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
