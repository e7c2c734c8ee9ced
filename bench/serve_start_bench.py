"""How long `guilds serve` takes to print its URL: a first start and a warm one, against floors.

Run: .venv/bin/python bench/serve_start_bench.py [--rounds N] [--src DIR]

``--src DIR``: start guilds from the sources in DIR (on PYTHONPATH, ahead of the
installed ones), e.g. an earlier tree from ``git archive``, to set it beside this one.

Each start is the console script ``guilds serve --port 0`` (the embedded default
agent, ``sandbox = "auto"``), timed from the spawn to its first line on stderr
(``guilds serve: starting: ...``) and to the ``MCP at`` line (it listens then);
then SIGTERM, and the next one. The kinds, one of each per round, the order
turning so a shared machine's load falls on all alike:

    first start, fresh clone   a new data folder, and guilds' sources copied afresh with
                               no bytecode (what a new clone's `pip install -e .` has:
                               its dependencies compiled by pip, its own sources not)
    first start                a new data folder (settings, token, record written)
    warm start                 a data folder that served before
    no bytecode at all         a new data folder and an empty bytecode cache for every
                               module (PYTHONPYCACHEPREFIX): an install that never compiled
    floor: python -c pass      the bare interpreter
    floor: the web stack       python -c "import uvicorn, starlette.applications,
                               sqlalchemy.ext.asyncio, mcp.server.streamable_http_manager"

Reported: each kind's median wall time to each line, and the median per-round
ratio of each start to the web stack's import (what any server of this app
must load), with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
GUILDS = str(Path(PYTHON).with_name("guilds"))
SRC = Path(__file__).resolve().parent.parent / "src"
WEB_STACK = "import uvicorn, starlette.applications, sqlalchemy.ext.asyncio, mcp.server.streamable_http_manager"
URL_MARK = b"MCP at"
FIRST_MARK = b"guilds serve:"
START_SECONDS = 120
"""The longest one start may take before the bench gives up on it."""
AIM_WARM_SECONDS = 2.0


def _lines_until(proc: subprocess.Popen, t0: float) -> tuple[float, float]:
    """(seconds to the first 'guilds serve:' line, seconds to the 'MCP at' line)."""
    stderr = proc.stderr
    if stderr is None:
        raise RuntimeError("guilds serve started without its stderr piped")
    buf, first = b"", None
    deadline = t0 + START_SECONDS
    while time.perf_counter() < deadline:
        ready, _, _ = select.select([stderr], [], [], max(0.0, deadline - time.perf_counter()))
        if not ready:
            break
        chunk = os.read(stderr.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        now = time.perf_counter() - t0
        for line in buf.split(b"\n")[:-1] if b"\n" in buf else []:
            if first is None and line.startswith(FIRST_MARK):
                first = now
            if URL_MARK in line:
                return (first if first is not None else now), now
    raise RuntimeError(f"guilds serve printed no URL: {buf.decode(errors='replace')[-800:]}")


def timed_serve(env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([GUILDS, "serve", "--port", "0"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        return _lines_until(proc, t0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]


def timed_run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return wall, wall


def _base_env() -> dict[str, str]:
    """This environment, without what would change what a start loads or where from."""
    dropped = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "GUILDS_DATABASE_URL", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k not in dropped}


class Kinds:
    """Each kind of start, made ready afresh for every round in tmp."""

    def __init__(self, tmp: Path, src: Path | None):
        self.tmp, self.n, self.src = tmp, 0, src or SRC
        self.env = _base_env()
        if src is not None:
            self.env["PYTHONPATH"] = str(src)
        self.warm = {**self.env, "GUILDS_DATA": str(tmp / "warm")}
        timed_serve(self.warm)  # the warm one's first start: not measured

    def _fresh(self, name: str) -> Path:
        self.n += 1
        return self.tmp / f"{name}-{self.n}"

    def first_clone(self) -> tuple[float, float]:
        src = self._fresh("src")
        shutil.copytree(self.src, src, ignore=shutil.ignore_patterns("__pycache__"))
        return timed_serve({**self.env, "GUILDS_DATA": str(self._fresh("data")), "PYTHONPATH": str(src)})

    def first(self) -> tuple[float, float]:
        return timed_serve({**self.env, "GUILDS_DATA": str(self._fresh("data"))})

    def warm_start(self) -> tuple[float, float]:
        return timed_serve(self.warm)

    def no_bytecode(self) -> tuple[float, float]:
        cache = self._fresh("pycache")
        cache.mkdir()
        return timed_serve({**self.env, "GUILDS_DATA": str(self._fresh("data")), "PYTHONPYCACHEPREFIX": str(cache)})

    def bare(self) -> tuple[float, float]:
        return timed_run([PYTHON, "-c", "pass"], self.env)

    def web_stack(self) -> tuple[float, float]:
        return timed_run([PYTHON, "-c", WEB_STACK], self.env)


def measure(rounds: int, src: Path | None) -> dict[str, list[tuple[float, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        kinds = Kinds(Path(tmp), src)
        runs = {"first start, fresh clone": kinds.first_clone, "first start": kinds.first,
                "warm start": kinds.warm_start, "no bytecode at all": kinds.no_bytecode,
                "floor: python -c pass": kinds.bare, "floor: the web stack": kinds.web_stack}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for i in range(rounds):
            names = list(runs)
            for name in names[i % len(names):] + names[:i % len(names)]:
                times[name].append(runs[name]())
        return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--src", type=Path, help="the guilds sources to start (default: this tree's)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    times = measure(args.rounds, args.src.resolve() if args.src else None)
    load_after = os.getloadavg()[0]
    floor = [url for _, url in times["floor: the web stack"]]
    print(f"{'kind':26} {'first line':>11} {'URL':>9} {'URL / web stack':>16}")
    for name, pairs in times.items():
        first = statistics.median(f for f, _ in pairs)
        url = statistics.median(u for _, u in pairs)
        ratio = statistics.median(u / f for (_, u), f in zip(pairs, floor, strict=True))
        print(f"{name:26} {first * 1000:9.0f} ms {url * 1000:6.0f} ms {ratio:15.2f}")
    warm = statistics.median(u for _, u in times["warm start"])
    print(f"warm start to the URL: {warm:.2f} s (aim < {AIM_WARM_SECONDS:.0f} s); rounds {args.rounds}; "
          f"load average {load_before:.1f} before, {load_after:.1f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
