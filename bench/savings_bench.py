"""The tokens and calls an agent saves with wait/until and the error lines of an elided output.

Run: .venv/bin/python bench/savings_bench.py [--rounds N]

A scripted session through ``Toolbox.call`` (the local sandbox, the built
helper, real bash, SQLite), each task done two ways in the same run, the two
taking turns round by round in a rotating order:

1. dev server: start a server (background) that compiles for about 3 s, then
   prints its URL and "ready".
     polled   ``shell_status id=b1`` every 0.3 s, 10 times, as an agent polls
              (today's behaviour: the page's only way);
     until    one ``shell_status id=b1 until='ready in' wait=60``.
2. failing build: a build printing 3000 lines with one compiler error at line
   1501, exit 2.
     log read ``shell`` (output elided), then ``code_search`` of the log for
              'error' and ``file_read`` of the 40 lines around it (today: the
              elided middle held the error, so the agent goes to the log);
     listed   ``shell`` alone: the error line is listed under the elision
              marker with its line number.

Counted for each: calls (model turns), the bytes the model reads (result texts)
and writes (tool arguments as JSON), and tokens estimated as bytes / 4; the
wall time of the task. Then what a wait costs: the CPU time of the helper
processes (RUSAGE_CHILDREN) for a check without wait, a 10 s wait, and a 10 s
wait with an until that never matches, on a command that sleeps. Prints
Markdown tables (docs/benchmarks.md, "Savings").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox import get_sandbox
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.toolbox import Toolbox

TOKEN_BYTES = 4
SERVER = ("for i in $(seq 1 10); do echo \"compiling module $i of 10...\"; sleep 0.3; done; "
          "echo '  Local: http://localhost:$PORT/'; echo 'ready in 3012 ms'; sleep 120")
BUILD = ("for i in $(seq 1 1500); do echo \"[$i/3000] cc -c src/unit_$i.c -o build/unit_$i.o\"; done; "
         "echo 'src/parser.c:212:17: error: expected ';' before '}' token'; "
         "for i in $(seq 1502 3000); do echo \"[$i/3000] cc -c src/unit_$i.c -o build/unit_$i.o\"; done; "
         "echo 'make: *** [Makefile:40: all] Error 2'; exit 2")
POLLS = 10
POLL_EVERY = 0.3


class Tally:
    """One way of doing a task: its calls, bytes read and written, wall time."""

    def __init__(self) -> None:
        self.calls = self.read = self.written = 0
        self.began = time.monotonic()
        self.seconds = 0.0

    async def call(self, tb: Toolbox, run: str, tool: str, args: dict):
        result = await tb.call(run, tool, args)
        self.calls += 1
        self.read += len(result.text.encode())
        self.written += len(json.dumps({"name": tool, "input": args}).encode())
        return result

    def done(self) -> "Tally":
        self.seconds = time.monotonic() - self.began
        return self

    @property
    def tokens(self) -> float:
        return (self.read + self.written) / TOKEN_BYTES


async def server_polled(tb: Toolbox, run: str) -> Tally:
    t = Tally()
    bid = (await t.call(tb, run, "shell", {"command": SERVER, "background": True})).meta["background_id"]
    for _ in range(POLLS):
        await asyncio.sleep(POLL_EVERY)
        await t.call(tb, run, "shell_status", {"id": bid})
    await tb.call(run, "shell_status", {"id": bid, "stop": True})
    return t.done()


async def server_until(tb: Toolbox, run: str) -> Tally:
    t = Tally()
    bid = (await t.call(tb, run, "shell", {"command": SERVER, "background": True})).meta["background_id"]
    result = await t.call(tb, run, "shell_status", {"id": bid, "until": "ready in", "wait": 60})
    assert result.text.startswith("matched: ready in"), result.text[:200]
    await tb.call(run, "shell_status", {"id": bid, "stop": True})
    return t.done()


async def build_log_read(tb: Toolbox, run: str) -> Tally:
    t = Tally()
    log = (await t.call(tb, run, "shell", {"command": BUILD})).meta["log_path"]
    found = await t.call(tb, run, "code_search", {"pattern": "error:", "path": log, "mode": "content"})
    line = int(found.text.split("\n")[0].split(":")[1])
    await t.call(tb, run, "file_read", {"path": log, "offset": max(1, line - 20), "limit": 40})
    return t.done()


async def build_listed(tb: Toolbox, run: str) -> Tally:
    t = Tally()
    result = await t.call(tb, run, "shell", {"command": BUILD})
    assert "1501: src/parser.c:212:17: error:" in result.text, result.text[:3000]
    return t.done()


WAYS = {"dev server": (server_polled, server_until), "failing build": (build_log_read, build_listed)}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def wait_cpu(tb: Toolbox) -> list[tuple[str, float, float]]:
    """(way, CPU seconds of the helper, wall seconds) for a check and two 10 s waits."""
    bid = (await tb.call("cpu", "shell", {"command": "sleep 60", "background": True})).meta["background_id"]
    rows = []
    for name, extra in (("check, no wait", {}), ("wait=10", {"wait": 10}),
                        ("wait=10, until (no match)", {"wait": 10, "until": "never matches"})):
        cpu, began = _children_cpu(), time.monotonic()
        await tb.call("cpu", "shell_status", {"id": bid, **extra})
        rows.append((name, _children_cpu() - cpu, time.monotonic() - began))
    await tb.call("cpu", "shell_status", {"id": bid, "stop": True})
    return rows


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "home").mkdir()
        settings = parse_settings({"agent": {"home": str(root / "home"), "sandbox": "local"}}, root, env={})
        async with Store(f"sqlite:///{root}/bench.db") as store:
            tb = Toolbox(settings, get_sandbox(settings, root / "data"), store)
            results: dict[tuple[str, int], list[Tally]] = {}
            for r in range(rounds):
                for task, ways in WAYS.items():
                    order = [0, 1] if r % 2 == 0 else [1, 0]
                    for i in order:
                        results.setdefault((task, i), []).append(await ways[i](tb, f"bench-{r}-{task[:3]}-{i}"))
            cpu_rows = await wait_cpu(tb)
    print(f"Medians of {rounds} rounds; tokens = bytes / {TOKEN_BYTES}, an estimate.\n")
    print("| task | way | calls | bytes read | bytes written | tokens | wall | tokens vs today |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for task, ways in WAYS.items():
        base = statistics.median(t.tokens for t in results[(task, 0)])
        for i, way in enumerate(ways):
            runs = results[(task, i)]
            med = lambda f: statistics.median(f(t) for t in runs)  # noqa: E731
            print(f"| {task} | {way.__name__.split('_', 1)[1]} | {med(lambda t: t.calls):.0f} | "
                  f"{med(lambda t: t.read):,.0f} | {med(lambda t: t.written):,.0f} | "
                  f"{med(lambda t: t.tokens):,.0f} | {med(lambda t: t.seconds):.1f} s | "
                  f"{med(lambda t: t.tokens) / base:.2f}x |")
    print("\n| shell_status | helper CPU | wall |")
    print("| --- | ---: | ---: |")
    for name, cpu, wall in cpu_rows:
        print(f"| {name} | {cpu * 1000:.0f} ms | {wall:.1f} s |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
