"""The toolbox's own cost per call, against calling the helper directly.

Run: .venv/bin/python bench/toolbox_bench.py [--calls N]

Same machine, same run, the real local sandbox and real SQLite:
  1. a shell call of `true` through Toolbox.call (request, record, pipeline)
     against the same request sent straight to the helper (transport.call_helper);
  2. the toolbox alone: Toolbox.call over a sandbox that answers at once, so
     what is measured is the record, the ledger and the pipeline.
Prints wall and CPU (this process, threads included) per call, as a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from guilds.sandbox.base import ExecResult
from guilds.sandbox.local import LocalSandbox
from guilds.settings import parse_settings
from guilds.store import Store
from guilds.toolbox import Toolbox, transport
from guilds_code.protocol import Reply, ok_envelope

ANSWER = ok_envelope(Reply("ok\n", {"exit_code": 0, "cwd": "/h", "timed_out": False}))


class InstantSandbox(LocalSandbox):
    """The local sandbox, except that the helper answers at once."""

    async def exec(self, argv, *, env=None, timeout):
        return ExecResult(0, ANSWER, b"")


async def timed(coro) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    await coro
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(toolbox: Toolbox, calls: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall, CPU) ms per call through the toolbox and straight to the helper, interleaved."""
    sums = [[0.0, 0.0], [0.0, 0.0]]
    for i in range(calls):
        request = {"op": "shell", "args": {"command": "true"}, "run_id": "direct", "agent_id": "agent1",
                   "call_id": f"d{i}", "cwd": toolbox.default_cwd(), "home": toolbox.sandbox.home,
                   "max_bytes": 8192, "seq": i + 1, "redact_env": ["API_KEY"]}
        for k, coro in enumerate((toolbox.call("bench", "shell", {"command": "true"}),
                                  transport.call_helper(toolbox.sandbox, request, wait=150))):
            wall, cpu = await timed(coro)
            sums[k][0] += wall
            sums[k][1] += cpu
    through, straight = ((w / calls * 1000, c / calls * 1000) for w, c in sums)
    return through, straight


async def main(calls: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="toolbox-bench-"))
    settings = parse_settings({"agent": {"home": str(root / "home"), "max_tool_calls": 10 * calls},
                               "secrets": {"API_KEY": "bench-secret-0123456789"}}, root, env={})
    print("| sandbox | through Toolbox.call | helper directly | toolbox's own cost |")
    print("| --- | --- | --- | --- |")
    for label, kind in (("real helper", LocalSandbox), ("instant sandbox", InstantSandbox)):
        async with Store(f"sqlite:///{root}/{kind.__name__}.db") as store:
            toolbox = Toolbox(settings, kind(settings, root), store)
            await toolbox.call("warm-up", "shell", {"command": "true"})
            (tw, tc), (dw, dc) = await measure(toolbox, calls)
        print(f"| {label} | {tw:.1f} ms wall, {tc:.1f} ms CPU | {dw:.1f} ms wall, {dc:.1f} ms CPU "
              f"| {tw - dw:+.1f} ms wall, {tc - dc:+.1f} ms CPU |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    asyncio.run(main(parser.parse_args().calls))
