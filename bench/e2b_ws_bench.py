"""A WebSocket to a sandbox's port through `guilds serve --e2b`, against the same server reached
directly, in the same run.

Run: .venv/bin/python bench/e2b_ws_bench.py [--sandbox bwrap|docker] [--samples N] [--mb M]

One real `guilds serve --e2b`, the unmodified E2B Python SDK (sync), one sandbox running the
tests' WebSocket echo server (tests/test_e2b_ingress_ws.py, standard library only), and the
same server run on this machine beside it (the floor: what a WebSocket costs without guilds):

    round trip   a 32-byte text message sent and its echo read, on one open WebSocket
    upgrade      a new connection's upgrade answered and the server's first message read
    big message  one message of --mb MiB from the server, read whole

Samples taken in turns (through guilds, direct, through guilds, ...), --samples of each for the
round trip (default 300), a tenth of that for the others; prints a Markdown table of medians
and 95th percentiles and the ratio to the direct path (docs/benchmarks.md, "E2B ports: WebSockets").
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from e2b import Sandbox  # noqa: E402

from e2b_kit import e2b_server  # noqa: E402
from test_e2b_ingress_ws import PORT, WS_SERVER, Client, _serve_ws  # noqa: E402


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def _direct_server(folder: Path) -> tuple[subprocess.Popen, int]:
    """The same echo server on this machine, on a free port, once it listens."""
    script, port = folder / "ws.py", _free_port()
    script.write_text(WS_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the direct echo server did not start")


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def _opened(target: object, host: str) -> Client:
    client = Client(target, host)  # type: ignore[arg-type]
    client.receive()  # the server's first message
    return client


def run(sandbox: str, samples: int, megabytes: int) -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="e2b-ws-bench-"))
    direct, port = _direct_server(folder)
    try:
        with e2b_server(folder, sandbox) as server:
            os.environ.update(server.env())
            sbx = Sandbox.create(timeout=900)
            try:
                _serve_ws(sbx)
                paths = {"guilds": (server, sbx.get_host(PORT)),
                         "direct": (SimpleNamespace(url=f"http://127.0.0.1:{port}"), f"127.0.0.1:{port}")}
                return _table(sandbox, _measure(paths, samples, megabytes << 20))
            finally:
                sbx.kill()
    finally:
        direct.kill()
        direct.wait()


def _measure(paths: dict[str, tuple[object, str]], samples: int, size: int) -> dict[str, list[float]]:
    open_ws = {name: _opened(*target) for name, target in paths.items()}
    timings: dict[str, list[float]] = {}
    for _ in range(10):  # warm both paths
        for client in open_ws.values():
            client.send("warm")
            client.receive()
    for i in range(samples):
        for name, client in open_ws.items():
            def round_trip(client: Client = client) -> None:
                client.send("x" * 32)
                client.receive()
            timings.setdefault(f"round trip: {name}", []).append(_timed(round_trip))
            if i % 10 == 0:
                timings.setdefault(f"upgrade: {name}", []).append(_timed(lambda: _opened(*paths[name])))

                def big(client: Client = client) -> None:
                    client.send(f"big {size}")
                    assert len(client.receive()) == size
                timings.setdefault(f"big message ({size >> 20} MiB): {name}", []).append(_timed(big))
    return timings


def _table(sandbox: str, timings: dict[str, list[float]]) -> list[str]:
    load = os.getloadavg()[0]
    lines = [f"{sandbox}, load average {load:.1f}, samples in turns", "",
             "| what | path | median ms | p95 ms | / direct |", "| --- | --- | ---: | ---: | ---: |"]
    for name, values in timings.items():
        what, path = name.rsplit(": ", 1)
        floor = statistics.median(timings[f"{what}: direct"])
        p95 = statistics.quantiles(values, n=20)[-1]
        lines.append(f"| {what} | {path} | {statistics.median(values):.2f} | {p95:.2f} | "
                     f"{statistics.median(values) / floor:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandbox", default="bwrap", choices=("bwrap", "docker"))
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--mb", type=int, default=8)
    args = parser.parse_args()
    print("\n".join(run(args.sandbox, args.samples, args.mb)))


if __name__ == "__main__":
    main()
