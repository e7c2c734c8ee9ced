"""What a client that sends much, or reads nothing, costs `guilds serve --e2b`: the server's
resident memory (RSS) before and after, against the idle server's own in the same run.

Run: .venv/bin/python bench/e2b_bounds_bench.py [--sandbox local|bwrap|docker] [--seconds N]

With ``PYTHONPATH=<another tree>/src`` the server runs that tree's code (a before and
after on one machine; the SDK and this script stay the same).

One real `guilds serve --e2b` and the unmodified E2B Python SDK (sync), one after the other:

    body       POST /sandboxes with a 600 MB body (chunked, one metadata value): the
               server's growth, and the answer (or a closed connection)
    unread     commands.run("cat /dev/zero", background=True), its stream never read for
               --seconds (default 12): the server's growth
    read       commands.run("head -c 100M /dev/zero"): seconds to read it all through the
               SDK, beside files.read of a 100 MB file (the same bytes through the
               service's other path), in turns, median of 3
    connects   8 Sandbox.connect at once to a paused sandbox: process services left running

Prints a Markdown table (pasted into docs/benchmarks.md under "E2B front: bounds").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from e2b import Sandbox  # noqa: E402

from e2b_kit import E2BServer, e2b_server, home_of, pids_alive  # noqa: E402

MB = 1024 * 1024


def big_body(server: E2BServer) -> tuple[float, str]:
    """The server's growth (MB) over a 600 MB create body, and how it was answered."""
    before = server.rss_mb()

    def body():
        yield b'{"metadata": {"a": "'
        for _ in range(600):
            yield b"x" * MB
        yield b'"}}'

    try:
        answer = httpx.post(f"{server.url}/sandboxes", content=body(), timeout=300,
                            headers={"X-API-KEY": server.key, "Content-Type": "application/json"})
        told = str(answer.status_code)
    except httpx.TransportError:
        told = "connection closed"
    return server.rss_mb() - before, told


def unread(server: E2BServer, sbx: Sandbox, seconds: float) -> float:
    before = server.rss_mb()
    handle = sbx.commands.run("cat /dev/zero", background=True, timeout=0)
    time.sleep(seconds)
    grown = server.rss_mb() - before
    sbx.commands.kill(handle.pid)
    handle.disconnect()
    return grown


def read_speed(sbx: Sandbox) -> tuple[float, float]:
    sbx.commands.run("head -c 100M /dev/zero > bench.bin")
    outputs, files = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        got = sbx.commands.run("cat bench.bin", timeout=300).stdout
        outputs.append(time.perf_counter() - t0)
        assert len(got) == 100 * MB
        t0 = time.perf_counter()
        assert len(sbx.files.read("bench.bin", format="bytes")) == 100 * MB
        files.append(time.perf_counter() - t0)
    return statistics.median(outputs), statistics.median(files)


def connects(server: E2BServer, sbx: Sandbox, home: Path) -> int:
    service = f"envd\0{home}"
    sbx.beta_pause()
    time.sleep(1)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: Sandbox.connect(sbx.sandbox_id), range(8)))
    time.sleep(1)
    return len(pids_alive(service))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandbox", default="local")
    parser.add_argument("--seconds", type=float, default=12)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, e2b_server(Path(tmp), opts.sandbox) as server:
        os.environ.update(server.env())
        idle = server.rss_mb()
        body_mb, told = big_body(server)
        sbx = Sandbox.create(timeout=3600)
        unread_mb = unread(server, sbx, opts.seconds)
        output_s, file_s = read_speed(sbx)
        services = connects(server, sbx, home_of(sbx))
        Sandbox.connect(sbx.sandbox_id).kill()
    code = os.environ.get("PYTHONPATH") or "this tree"
    print(f"sandbox {opts.sandbox}, server code: {code}; idle server {idle:.0f} MB\n")
    print("| case | figure | vs the idle server |\n| --- | ---: | ---: |")
    print(f"| 600 MB create body ({told}) | +{body_mb:.0f} MB | {body_mb / idle:.2f}x |")
    print(f"| unread `cat /dev/zero`, {opts.seconds:.0f} s | +{unread_mb:.0f} MB | {unread_mb / idle:.2f}x |")
    print(f"| 100 MB of command output read | {output_s:.2f} s ({100 / output_s:.0f} MB/s), "
          f"{output_s / file_s:.2f}x files.read's {file_s:.2f} s | |")
    print(f"| 8 connects at once to a paused sandbox | {services} process services | |")


if __name__ == "__main__":
    main()
