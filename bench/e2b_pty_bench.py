"""A terminal's echo latency through `guilds serve --e2b`, against a pipe's in the same run.

Run: .venv/bin/python bench/e2b_pty_bench.py [--sandbox local|bwrap|docker] [--samples N]

One real `guilds serve --e2b` and the unmodified E2B Python SDK (sync), one sandbox:

    pty     sandbox.pty.create(...) running `cat`: one key sent (send_stdin), until the
            terminal's echo of it comes back on the pty stream
    pipe    commands.run("cat", background=True, stdin=True): one line sent, until cat's
            copy of it comes back on the stdout stream (the same way minus the terminal)

Samples taken in turns (pty, pipe, pty, ...), --samples of each (default 200); prints
a Markdown table of medians and 95th percentiles and the ratio pty / pipe (pasted into
docs/benchmarks.md under "E2B terminals: echo latency").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from e2b import Sandbox  # noqa: E402
from e2b.sandbox.commands.command_handle import PtySize  # noqa: E402

from e2b_kit import e2b_server  # noqa: E402


class Echo:
    """A stream's next output, timed: ``sample(send)`` sends, then waits for what comes back."""

    def __init__(self) -> None:
        self.came = threading.Event()
        self.at = 0.0

    def __call__(self, _data: object) -> None:
        self.at = time.perf_counter()
        self.came.set()

    def sample(self, send: Callable[[], None]) -> float:
        self.came.clear()
        start = time.perf_counter()
        send()
        if not self.came.wait(10):
            raise RuntimeError("no echo within 10 s")
        return (self.at - start) * 1000


def _follow(wait: Callable[[], object]) -> None:
    """A stream read in the background until its sandbox is killed (its end then raises)."""
    def read() -> None:
        with contextlib.suppress(Exception):  # the kill at the end resets the stream
            wait()
    threading.Thread(target=read, daemon=True).start()


def run(sandbox: str, samples: int) -> list[str]:
    with e2b_server(Path(tempfile.mkdtemp(prefix="e2b-pty-bench-")), sandbox) as server:
        os.environ.update(server.env())
        sbx = Sandbox.create(timeout=600)
        try:
            pty_echo, pipe_echo = Echo(), Echo()
            terminal = sbx.pty.create(PtySize(cols=80, rows=24))
            _follow(lambda: terminal.wait(on_pty=pty_echo))
            pty_echo.sample(lambda: sbx.pty.send_stdin(terminal.pid, b"exec cat\n"))
            time.sleep(0.5)
            piped = sbx.commands.run("cat", background=True, stdin=True, timeout=0)
            _follow(lambda: piped.wait(on_stdout=pipe_echo))
            timings: dict[str, list[float]] = {"pty": [], "pipe": []}
            for _ in range(samples):
                timings["pty"].append(pty_echo.sample(lambda: sbx.pty.send_stdin(terminal.pid, b"x")))
                timings["pipe"].append(pipe_echo.sample(lambda: sbx.commands.send_stdin(piped.pid, "x\n")))
        finally:
            sbx.kill()
    return _table(sandbox, samples, timings)


def _table(sandbox: str, samples: int, timings: dict[str, list[float]]) -> list[str]:
    lines = [f"{sandbox}, {samples} samples each, in turns", "",
             "| path | median | p95 | median / pipe's |", "| --- | ---: | ---: | ---: |"]
    pipe = statistics.median(timings["pipe"])
    for name, values in timings.items():
        p95 = statistics.quantiles(values, n=20)[-1]
        lines.append(f"| {name} | {statistics.median(values):.2f} ms | {p95:.2f} ms | "
                     f"{statistics.median(values) / pipe:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandbox", default="local", choices=("local", "bwrap", "docker"))
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    print("\n".join(run(args.sandbox, args.samples)))


if __name__ == "__main__":
    main()
