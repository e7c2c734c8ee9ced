"""The E2B front's cost: `commands.run("true")` through the E2B SDK against `guilds serve --e2b`,
beside the same command through ``guilds.open`` and a bare process spawn; a 100 MB file
written and read through the SDK.

Run: .venv/bin/python bench/e2b_bench.py [--sandbox local|bwrap|docker] [--network-list] [--calls N] [--mb N]

``--network-list``: the agent's ``agent.network`` is a list (one name, never reached), so
each command and each tool call first keeps the sandbox's egress proxy (bwrap, docker).

One run, one machine: a real `guilds serve --e2b` (its own data folder) and the
unmodified E2B Python SDK (sync) pointed at it by the variables it prints. The
three paths take turns call by call, in a rotating order, so the machine's load
falls on all alike; medians after 3 warm-up calls each.

    e2b       Sandbox.commands.run("true"): the SDK's Start stream (bash -l -c true) to the
              end event, through the server and the sandbox's guilds-code envd
    guilds    Run.call("shell", {"command": "true"}) through guilds.open (same settings)
    spawn     subprocess.run(["bash", "-l", "-c", "true"]) on this machine, HOME the agent's: the floor

Then files.write of N MB of random bytes and files.read of them back
(format="bytes"), checked equal, taking turns with `cp` of the same bytes into the
sandbox's home on this machine and back out (the floor): seconds, MB/s and the ratio
to cp, median of 3.

Prints a Markdown table (pasted into docs/benchmarks.md under "E2B front").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from e2b import Sandbox  # noqa: E402

import guilds  # noqa: E402
from e2b_kit import e2b_server, home_of  # noqa: E402

WARMUP = 3


def _timed(work: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    work()
    return (time.perf_counter() - t0) * 1000


def commands(sbx: Sandbox, run, loop: asyncio.AbstractEventLoop, calls: int, home: Path) -> dict[str, float]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}  # the agent's home: no profile of this machine's user
    paths: dict[str, Callable[[], object]] = {
        "e2b": lambda: sbx.commands.run("true"),
        "guilds": lambda: loop.run_until_complete(run.call("shell", {"command": "true"})),
        "spawn": lambda: subprocess.run(["bash", "-l", "-c", "true"], check=True, env=env, cwd=home),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(WARMUP + calls):
        order = names[i % 3:] + names[:i % 3]
        for name in order:
            took = _timed(paths[name])
            if i >= WARMUP:
                times[name].append(took)
    return {name: statistics.median(t) for name, t in times.items()}


def files(sbx: Sandbox, mb: int, home: Path, scratch: Path) -> dict[str, float]:
    """Median seconds of files.write and files.read of mb MB, and of `cp` of the same bytes into
    the sandbox's home on this machine and back out (the floor), taking turns, 3 rounds."""
    data = os.urandom(mb * 1024 * 1024)
    source = scratch / "bench-source.bin"
    source.write_bytes(data)
    times: dict[str, list[float]] = {"files.write": [], "cp in": [], "files.read": [], "cp out": []}
    for _ in range(3):
        times["files.write"].append(_timed(lambda: sbx.files.write("bench.bin", data)) / 1000)
        times["cp in"].append(_timed(lambda: subprocess.run(["cp", str(source), str(home / "bench-cp.bin")],
                                                            check=True)) / 1000)
        got: list[bytes] = []
        times["files.read"].append(_timed(lambda: got.append(bytes(sbx.files.read("bench.bin",
                                                                                    format="bytes")))) / 1000)
        assert got[0] == data, "the file read back differs"
        times["cp out"].append(_timed(lambda: subprocess.run(["cp", str(home / "bench-cp.bin"),
                                                             str(scratch / "bench-out.bin")], check=True)) / 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="local")
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--network-list", action="store_true", help="agent.network a list (bwrap, docker)")
    opts = parser.parse_args()
    settings = 'network = ["bench.example.org"]' if opts.network_list else ""
    with tempfile.TemporaryDirectory() as tmp, e2b_server(Path(tmp), opts.sandbox, settings) as server:
        os.environ.update(server.env())
        sbx = Sandbox.create(timeout=3600)
        loop = asyncio.new_event_loop()
        agent = guilds.open(Path(tmp) / "agent.toml", data_dir=server.data)
        loop.run_until_complete(agent.__aenter__())
        try:
            home = home_of(sbx, server.data)
            medians = commands(sbx, agent.run(), loop, opts.calls, home)
            moved = files(sbx, opts.mb, home, Path(tmp))
        finally:
            loop.run_until_complete(agent.__aexit__(None, None, None))
            sbx.kill()
    network = ", agent.network a list" if opts.network_list else ""
    print(f"sandbox {opts.sandbox}{network}, {opts.calls} calls a path\n")
    print("| path | `true` (ms) | vs guilds.open |\n| --- | ---: | ---: |")
    for name, label in (("e2b", "E2B SDK `commands.run(\"true\")` against `guilds serve --e2b`"),
                        ("guilds", "`guilds.open`: `shell` `true`"), ("spawn", "bare spawn: `bash -l -c true`")):
        print(f"| {label} | {medians[name]:.1f} | {medians[name] / medians['guilds']:.2f}x |")
    print(f"\n| {opts.mb} MB file | s | MB/s | / cp |\n| --- | ---: | ---: | ---: |")
    for name, floor in (("files.write", "cp in"), ("cp in", "cp in"), ("files.read", "cp out"), ("cp out", "cp out")):
        print(f"| {name} | {moved[name]:.2f} | {opts.mb / moved[name]:.0f} | {moved[name] / moved[floor]:.1f}x |")


if __name__ == "__main__":
    main()
