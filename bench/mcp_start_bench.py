"""How soon `guilds mcp` answers a client's opening requests, idle and under a CPU load.

Run: .venv/bin/python bench/mcp_start_bench.py [--rounds N] [--busy N] [--src DIR] [--no-sdk-alone]

Each start is spawned with the client's opening lines already written to its
stdin, and timed from the spawn to each answer line on its stdout; then its
stdin is closed and it is waited for. Two clients' openings:

    handshake   initialize, notifications/initialized, tools/list (the official
                SDK's client, Claude Desktop, Cursor)
    2026-07-28  server/discover, then prompts/list, resources/list, tools/list
                (Claude Code: the envelope it sends)

The kinds, one of each per round, the order turning so the load falls on all alike:

    guilds mcp                  the console script, `guilds mcp --config FILE`
    the SDK alone               the same server without the early answers
                                (guilds.fronts.mcp_server.run_stdio: the SDK answers all)
    floor: python -c pass       the bare interpreter, spawn to exit
    guilds mcp, --src           with --src DIR: `guilds mcp` on the guilds source in DIR
                                (PYTHONPATH), a before taking turns with this tree's

--no-sdk-alone leaves the SDK alone out (its starts take seconds under load).

Each run is made idle and then with ``--busy`` processes spinning on the CPU
(started by the bench, ended after). Reported: medians of the time to the
first answer (initialize or server/discover) and to the tools/list answer, and
their ratio to the floor measured in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

PYTHON = sys.executable
GUILDS = str(Path(PYTHON).with_name("guilds"))
START_SECONDS = 60
AIM_FIRST_MS, AIM_TOOLS_MS = 300, 500
"""The aims under load: the opening answer and the tools' within these of the spawn."""
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {"roots": {"listChanged": True}}}
OPENINGS: dict[str, list[dict]] = {
    "handshake": [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ],
    "2026-07-28": [
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": ENVELOPE}},
        *({"jsonrpc": "2.0", "id": n, "method": method, "params": {"_meta": ENVELOPE}}
          for n, method in ((2, "prompts/list"), (3, "resources/list"), (4, "tools/list"))),
    ],
}
SDK_ALONE = ("import sys; from guilds.fronts.wiring import resolve; from guilds.fronts.mcp_server import run_stdio; "
             "run_stdio(resolve(sys.argv[1], data_dir=sys.argv[2]))")


def _answers(proc: subprocess.Popen, t0: float, ids: set[int]) -> dict[int, float]:
    """Seconds from t0 to each answer line whose id is in ids."""
    out = proc.stdout
    assert out is not None
    seen: dict[int, float] = {}
    buf, deadline = b"", t0 + START_SECONDS
    while len(seen) < len(ids) and time.perf_counter() < deadline:
        if not select.select([out], [], [], max(0.0, deadline - time.perf_counter()))[0]:
            break
        chunk = os.read(out.fileno(), 1 << 20)
        if not chunk:
            break
        now = time.perf_counter() - t0
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            seen.setdefault(json.loads(line)["id"], now)
    if len(seen) < len(ids):
        raise RuntimeError(f"answered only {sorted(seen)} of {sorted(ids)}")
    return seen


def timed_start(argv: list[str], opening: list[dict], env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first answer, seconds to the tools/list answer)."""
    lines = b"".join(json.dumps(message).encode() + b"\n" for message in opening)
    ids = {message["id"] for message in opening if "id" in message}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdin is not None
        proc.stdin.write(lines)
        proc.stdin.flush()
        seen = _answers(proc, t0, ids)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=START_SECONDS)
        if proc.stdout is not None:
            proc.stdout.close()
    return seen[min(ids)], seen[max(ids)]


def timed_floor(env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run([PYTHON, "-c", "pass"], env=env, check=True)
    wall = time.perf_counter() - t0
    return wall, wall


@contextmanager
def busy(n: int) -> Iterator[None]:
    """n processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0 if n else 0.0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def kinds(folder: Path, src: str = "", sdk_alone: bool = True) -> dict[str, Callable[[list[dict]], tuple[float, float]]]:
    settings = folder / "settings.toml"
    (folder / "home").mkdir()
    settings.write_text(f'[agent]\nid = "bench"\nhome = "{folder / "home"}"\nsandbox = "local"\n')
    data = str(folder / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUILDS_")} | {"GUILDS_DATA": data}
    mcp = [GUILDS, "mcp", "--config", str(settings)]
    runs = {"guilds mcp": lambda opening: timed_start(mcp, opening, env)}
    if src:
        runs["guilds mcp, --src"] = lambda opening: timed_start(mcp, opening, env | {"PYTHONPATH": src})
    if sdk_alone:
        runs["the SDK alone"] = lambda opening: timed_start([PYTHON, "-c", SDK_ALONE, str(settings), data], opening, env)
    runs["floor: python -c pass"] = lambda opening: timed_floor(env)
    return runs


def measure(rounds: int, folder: Path, src: str = "",
            sdk_alone: bool = True) -> dict[tuple[str, str], list[tuple[float, float]]]:
    runs = kinds(folder, src, sdk_alone)
    cases = [(kind, opening) for kind in runs for opening in OPENINGS]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {case: [] for case in cases}
    runs["guilds mcp"](OPENINGS["handshake"])  # the data folder and the record made: not measured
    for i in range(rounds):
        for kind, opening in cases[i % len(cases):] + cases[:i % len(cases)]:
            times[(kind, opening)].append(runs[kind](OPENINGS[opening]))
    return times


def report(label: str, times: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    floor = statistics.median(w for pairs in (v for (k, _), v in times.items() if k.startswith("floor"))
                              for w, _ in pairs)
    print(f"{label}: floor python -c pass {floor * 1000:.0f} ms")
    print(f"  {'kind':16} {'opening':11} {'first answer':>13} {'tools/list':>11} {'first/floor':>12} {'tools/floor':>12}")
    for (kind, opening), pairs in times.items():
        if kind.startswith("floor"):
            continue
        first = statistics.median(f for f, _ in pairs)
        tools = statistics.median(t for _, t in pairs)
        print(f"  {kind:16} {opening:11} {first * 1000:10.0f} ms {tools * 1000:8.0f} ms "
              f"{first / floor:11.1f}x {tools / floor:11.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--busy", type=int, default=4, help="processes spinning during the loaded run (default 4)")
    parser.add_argument("--src", default="", help="also `guilds mcp` on the guilds source in this folder (a before)")
    parser.add_argument("--no-sdk-alone", action="store_true", help="leave the SDK alone out")
    args = parser.parse_args()
    for label, n in (("idle", 0), (f"{args.busy} busy processes", args.busy)):
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp, busy(n):
            times = measure(args.rounds, Path(tmp), args.src, not args.no_sdk_alone)
        report(f"{label} (load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)", times)
    print(f"aim under load: first answer < {AIM_FIRST_MS} ms, tools/list < {AIM_TOOLS_MS} ms; rounds {args.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
