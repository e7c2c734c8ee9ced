"""Docker's resident channel through FIFOs against the engine's attached stream, in one run.

Run: DOCKER_HOST=... .venv/bin/python bench/docker_channel_bench.py [--calls N] [--blocks N]

Two docker agents, each with its resident helper open through ``Toolbox.call`` (the run
record on SQLite, the pipeline): one on the direct channel (``docker_fifos``: where the
engine runs here, as it does for this bench), one made to take the attached stream as an
engine elsewhere would (its ``_runs_here`` answering no), and `bash -c true` spawned from
this process as the floor (bench/shell_call_bench.py's). The per-call times take turns call
by call in shuffled rounds (resident_bench's ``interleaved``). Then the engine's own CPU:
blocks of --calls calls on one channel, then on the other, in turns, each block's CPU time
of the engine's processes (dockerd, containerd and the shims: utime + stime from /proc)
divided by its calls.

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.sandbox.docker.docker_fifos import FifoProcess
from guilds.toolbox import Toolbox
from resident_bench import interleaved, median_ms, spawn
from shell_call_bench import close, shell_call

ENGINE_NAMES = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2")
TICK = os.sysconf("SC_CLK_TCK")


def engine_cpu_seconds() -> float:
    """CPU seconds used so far by the engine's processes on this machine."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1: stat.rindex(")")]
        if name in ENGINE_NAMES or name.startswith("containerd-shim"):
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


async def toolbox(root: Path, store: Store, name: str, *, stream: bool) -> Toolbox:
    home = root / "homes" / name
    home.mkdir(parents=True)
    settings = parse_settings({"agent": {"id": f"dc-{name}-{os.getpid()}", "home": str(home), "sandbox": "docker",
                                         "transport": "resident", "max_tool_calls": 10_000_000}}, root, env={})
    sandbox = get_sandbox(settings, root / "data")
    if stream:
        sandbox._runs_here = lambda cid: False  # type: ignore[method-assign]  # as an engine elsewhere
    made = Toolbox(settings, sandbox, store)
    await shell_call(made)()
    return made


async def engine_cpu_per_call(calls: dict, count: int, blocks: int) -> dict[str, float]:
    """path -> the engine's CPU ms per call, over blocks of count calls taking turns."""
    spent = {name: 0.0 for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            before = engine_cpu_seconds()
            for _ in range(count):
                await call()
            spent[name] += engine_cpu_seconds() - before
    return {name: spent[name] * 1000 / (count * blocks) for name in calls}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=3)
    opts = parser.parse_args()
    print(f"tree: {ROOT}; load average {os.getloadavg()[0]:.1f}")
    root = Path(tempfile.mkdtemp(prefix="guilds-docker-channel-bench-"))
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            fifo = await toolbox(root, store, "fifo", stream=False)
            stream = await toolbox(root, store, "stream", stream=True)
            try:
                assert isinstance(fifo._transport._channel._process, FifoProcess)  # noqa: SLF001
                assert not isinstance(stream._transport._channel._process, FifoProcess)  # noqa: SLF001
                calls = {"fifos": shell_call(fifo), "stream": shell_call(stream)}
                times = await interleaved({**calls, "spawn": lambda: spawn(["bash", "-c", "true"])}, opts.calls)
                engine = await engine_cpu_per_call(calls, opts.calls, opts.blocks)
            finally:
                for made in (fifo, stream):
                    await close(made)
        floor = median_ms(times["spawn"])
        print("| docker channel | shell `true` ms | × spawn | the engine's CPU per call, ms |")
        print("| --- | ---: | ---: | ---: |")
        for name, label in (("fifos", "FIFOs (direct)"), ("stream", "the engine's attached stream")):
            ms = median_ms(times[name])
            print(f"| {label} | {ms:.2f} | {ms / floor:.2f}× | {engine[name]:.3f} |")
        print(f"\nFloor: spawning `bash -c true` {floor:.2f} ms. load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GUILDS_DATA", "/nonexistent")
    asyncio.run(main())
