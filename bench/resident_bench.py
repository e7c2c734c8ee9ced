"""The resident helper against one process per call, the floors, and SWE-ReX.

Run: .venv/bin/python bench/resident_bench.py [--calls N] [--backends local,bwrap,docker]
     [--fleet-backends local,bwrap] [--agents 8] [--per-agent 100] [--rss-calls 10000] [--no-swerex]

Everything goes through ``Toolbox.call`` (the run record on SQLite, redaction,
the pipeline), with ``agent.transport`` = ``resident`` and ``exec`` side by side.

1. per call, median wall time, all paths taking turns call by call, each round
   in a new shuffled order (seeded: the same every run), so the machine's load
   falls on all alike and no path always follows the same one (the call right
   after rg's 25 ms over the standard library runs slower, whichever it is: in a
   fixed rotation that was always shell on resident):
     shell     shell `true`
     read      file_read of a 200-line file (each call a run of its own: read in full)
     search    code_search `def __init__` (files mode) over a copy of the Python
               standard library in the home
     direct    shell `true` sent straight to the toolbox's transport (no run
               record, no pipeline)
     trip      a request with an unknown op, straight to the transport: the
               helper answers at once, so this is the transport's own round trip
   on each backend and transport; the floors, spawned from the orchestrator:
   `bash -c true`, and rg with the very argv the helper builds; and SWE-ReX
   (``swerex-remote`` on loopback, its own client): `true` and `cat` of the
   same 200-line file. Ratios: shell / spawn (aim <= 3x), read / spawn (<= 2x),
   search / rg (<= 1.15x), docker / local (<= 1.3x), ours / SWE-ReX; then
   docker / local again with the two resident paths alone taking turns;
2. the first call of a new agent (the sandbox's start, then the channel or the
   process), per backend and transport (auto's first call goes by exec while
   the channel opens in the background);
3. --agents agents x --per-agent shell `true` calls at once, per backend and
   transport, the transports taking turns: calls/s, p50 and p99 per call;
4. the local server's RSS after 100 calls and after --rss-calls calls (shell and
   file_read alternating), and its waiting workers' (each answers at most
   SERVE_WORKER_REQUESTS_MAX requests, then a fresh fork takes over).

Prints Markdown tables (pasted into docs/benchmarks.md under "Resident helper").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox import get_sandbox
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.toolbox import Toolbox
from guilds_code.ops.rg import rg_argv
from guilds_code.protocol import validate_args

LINES = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(200))
SEARCH = {"pattern": "def __init__"}
WARMUP = 3
ORDER_SEED = 20261203
"""The shuffled orders of the rounds are drawn from this seed: the same in every run."""
SECRET = {"API_KEY": "bench-secret-0123456789"}
Timed = Callable[[], Awaitable[Any]]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def pct_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


class Bench:
    """The machine's state for one run: a root folder, one store, the toolboxes made."""

    def __init__(self, root: Path, store: Store):
        self.root, self.store = root, store
        self.toolboxes: list[Toolbox] = []

    def home(self, agent_id: str) -> Path:
        home = self.root / "homes" / agent_id
        if not home.exists():
            home.mkdir(parents=True)
            (home / "f.txt").write_text(LINES)
        return home

    def toolbox(self, agent_id: str, backend: str, transport: str) -> Toolbox:
        settings = parse_settings({"agent": {"id": agent_id, "home": str(self.home(agent_id)),
                                             "sandbox": backend, "transport": transport,
                                             "max_tool_calls": 10_000_000}, "secrets": SECRET},
                                  self.root, env={})
        toolbox = Toolbox(settings, get_sandbox(settings, self.root / "data"), self.store)
        self.toolboxes.append(toolbox)
        return toolbox

    async def close(self) -> None:
        for toolbox in self.toolboxes:
            await toolbox.close()
        for toolbox in self.toolboxes:
            if toolbox.sandbox.name != "local":
                await toolbox.sandbox.stop()


def stdlib_into(home: Path) -> None:
    target = home / "stdlib"
    if not target.exists():
        shutil.copytree(sysconfig.get_paths()["stdlib"], target, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "site-packages"))


async def spawn(argv: list[str], cwd: str | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL, cwd=cwd)
    await proc.communicate()


def transport_call(toolbox: Toolbox, tool: str, args: dict) -> Timed:
    """The same request straight to the toolbox's transport: no run record, no pipeline.
    An op the helper does not know is answered at once: the transport's round trip alone."""
    request = {"op": tool, "args": args, "run_id": "direct", "agent_id": toolbox.settings.id,
               "call_id": "d1", "home": toolbox.sandbox.home, "cwd": toolbox.sandbox.home}

    async def call() -> None:
        envelope = await toolbox.transport.call(request, wait=60)
        assert envelope["ok"] or tool == "none", envelope
    return call


def tool_call(toolbox: Toolbox, tool: str, args: dict, fresh_run: bool = False) -> Timed:
    async def call() -> None:
        run = f"r{secrets.token_hex(4)}" if fresh_run else f"bench-{toolbox.settings.id}"
        result = await toolbox.call(run, tool, args)
        assert not result.is_error, result.text
    return call


async def interleaved(paths: dict[str, Timed], calls: int) -> dict[str, list[float]]:
    """Each path `calls` times (after WARMUP), all taking turns, each round in a new
    shuffled order (ORDER_SEED): what the call before leaves behind (the machine's
    caches after rg, a process exiting) falls on every path alike."""
    names = list(paths)
    for name in names:
        for _ in range(WARMUP):
            await paths[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    order = random.Random(ORDER_SEED)
    for _ in range(calls):
        for name in order.sample(names, len(names)):
            began = time.perf_counter()
            await paths[name]()
            times[name].append(time.perf_counter() - began)
    return times


# --- SWE-ReX ------------------------------------------------------------------
class SweRex:
    """swerex-remote on loopback and its own client."""

    async def __aenter__(self) -> SweRex:
        from swerex.runtime.remote import RemoteRuntime

        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        token = secrets.token_hex(8)
        exe = Path(sys.executable).parent / "swerex-remote"
        self.proc = subprocess.Popen([str(exe), "--host", "127.0.0.1", "--port", str(port),
                                      "--auth-token", token], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        await self.runtime.wait_until_alive(timeout=60)
        return self

    def run(self, command: Any, shell: bool) -> Timed:
        from swerex.runtime.abstract import Command

        async def call() -> None:
            result = await self.runtime.execute(Command(command=command, shell=shell))
            assert result.exit_code == 0, result
        return call

    async def __aexit__(self, *exc: Any) -> None:
        await self.runtime.close()
        self.proc.terminate()
        self.proc.wait()


# --- 1. per call ---------------------------------------------------------------
async def per_call(bench: Bench, backends: list[str], calls: int, swerex: SweRex | None) -> dict[str, list[float]]:
    paths: dict[str, Timed] = {}
    for backend in backends:
        for transport in ("resident", "exec"):
            toolbox = bench.toolbox(f"pc-{backend}", backend, transport)
            stdlib_into(Path(toolbox.settings.home))
            key = f"{backend}/{transport}"
            paths[f"shell {key}"] = tool_call(toolbox, "shell", {"command": "true"})
            paths[f"read {key}"] = tool_call(toolbox, "file_read", {"path": "f.txt"}, fresh_run=True)
            paths[f"search {key}"] = tool_call(toolbox, "code_search", {**SEARCH, "path": "stdlib"})
            paths[f"direct {key}"] = transport_call(toolbox, "shell", {"command": "true"})
            paths[f"trip {key}"] = transport_call(toolbox, "none", {})
    home = bench.home(f"pc-{backends[0]}")
    argv = rg_argv("rg", validate_args("code_search", {**SEARCH, "path": "stdlib"}), "stdlib")
    paths["spawn bash -c true"] = lambda: spawn(["bash", "-c", "true"])
    paths["rg directly"] = lambda: spawn(argv, cwd=str(home))
    if swerex is not None:
        paths["swerex true"] = swerex.run("true", shell=True)
        paths["swerex cat"] = swerex.run(["cat", str(home / "f.txt")], shell=False)
    return await interleaved(paths, calls)


def per_call_table(times: dict[str, list[float]], backends: list[str]) -> str:
    spawn_ms, rg_ms = median_ms(times["spawn bash -c true"]), median_ms(times["rg directly"])
    rows = ["| backend | transport | shell `true` ms | × spawn (aim ≤ 3×) | file_read 200 lines ms "
            "| × spawn (aim ≤ 2×) | code_search stdlib ms | × rg (aim ≤ 1.15×) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for backend in backends:
        for transport in ("resident", "exec"):
            key = f"{backend}/{transport}"
            shell, read, search = (median_ms(times[f"{op} {key}"]) for op in ("shell", "read", "search"))
            rows.append(f"| {backend} | {transport} | {shell:.1f} | {shell / spawn_ms:.2f}× | {read:.1f} | "
                        f"{read / spawn_ms:.2f}× | {search:.1f} | {search / rg_ms:.2f}× |")
    direct = ", ".join(f"{b}/{t} {median_ms(times[f'direct {b}/{t}']):.1f} ms"
                       for b in backends for t in ("resident", "exec"))
    trip = ", ".join(f"{b}/{t} {median_ms(times[f'trip {b}/{t}']):.1f} ms"
                     for b in backends for t in ("resident", "exec"))
    rows.append(f"\nshell `true` through the transport alone (no run record, no pipeline): {direct}.")
    rows.append(f"A request the helper refuses at once (the transport's round trip, to a warm worker "
                f"on resident, a whole helper start on exec): {trip}.")
    rows.append(f"Floors: spawning `bash -c true` {spawn_ms:.1f} ms; the helper's rg argv run "
                f"directly {rg_ms:.1f} ms.")
    if "docker" in backends and "local" in backends:
        for transport in ("resident", "exec"):
            ratio = median_ms(times[f"shell docker/{transport}"]) / median_ms(times[f"shell local/{transport}"])
            rows.append(f"docker / local per shell call, {transport}: {ratio:.2f}× (aim ≤ 1.3×).")
    if "swerex true" in times:
        true_ms, cat_ms = median_ms(times["swerex true"]), median_ms(times["swerex cat"])
        ours_true, ours_cat = median_ms(times["shell local/resident"]), median_ms(times["read local/resident"])
        rows.append(f"SWE-ReX on loopback: `true` {true_ms:.1f} ms, `cat` {cat_ms:.1f} ms; ours (local, "
                    f"resident, through Toolbox.call): shell {ours_true:.1f} ms ({ours_true / true_ms:.2f}×), "
                    f"file_read {ours_cat:.1f} ms ({ours_cat / cat_ms:.2f}×).")
    return "\n".join(rows)


async def docker_pair(bench: Bench, calls: int) -> str:
    """docker against local, resident, the two alone taking turns call by call: the
    rotation above also runs the exec paths, whose engine-side cleanup lands on
    whatever runs next."""
    paths = {backend: tool_call(bench.toolbox(f"pair-{backend}", backend, "resident"), "shell",
                                {"command": "true"}) for backend in ("local", "docker")}
    times = await interleaved(paths, calls)
    local, docker = median_ms(times["local"]), median_ms(times["docker"])
    return (f"docker / local per shell call, resident, the two alone ({calls} calls each, interleaved): "
            f"{docker:.1f} / {local:.1f} ms = {docker / local:.2f}× (aim ≤ 1.3×).")


# --- 2. first call ---------------------------------------------------------------
async def first_calls(bench: Bench, backends: list[str]) -> str:
    rows = ["| backend | transport | first call of a new agent ms |", "| --- | --- | ---: |"]
    for backend in backends:
        for transport in ("resident", "auto", "exec"):
            toolbox = bench.toolbox(f"first-{backend}-{transport}-{secrets.token_hex(3)}", backend, transport)
            began = time.perf_counter()
            await tool_call(toolbox, "shell", {"command": "true"})()
            rows.append(f"| {backend} | {transport} | {(time.perf_counter() - began) * 1000:.0f} |")
            await toolbox.transport.opened()
            await toolbox.close()
            if backend != "local":
                await toolbox.sandbox.stop()
    return "\n".join(rows)


# --- 3. agents at once -----------------------------------------------------------
async def fleet(bench: Bench, backend: str, transport: str, agents: int, per_agent: int) -> tuple[float, list[float]]:
    boxes = [bench.toolbox(f"fleet-{backend}-{i}", backend, transport) for i in range(agents)]
    await asyncio.gather(*(tool_call(tb, "shell", {"command": "true"})() for tb in boxes))
    latencies: list[float] = []

    async def agent(toolbox: Toolbox) -> None:
        call = tool_call(toolbox, "shell", {"command": "true"})
        for _ in range(per_agent):
            began = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(agent(tb) for tb in boxes))
    return agents * per_agent / (time.perf_counter() - began), latencies


async def fleets(bench: Bench, backends: list[str], agents: int, per_agent: int) -> str:
    rows = [f"| backend | transport | {agents} agents × {per_agent} calls: calls/s | p50 ms | p99 ms |",
            "| --- | --- | ---: | ---: | ---: |"]
    for i, backend in enumerate(backends):
        order = ("resident", "exec") if i % 2 == 0 else ("exec", "resident")
        found = {t: await fleet(bench, backend, t, agents, per_agent) for t in order}
        for transport in ("resident", "exec"):
            rate, latencies = found[transport]
            rows.append(f"| {backend} | {transport} | {rate:.0f} | {pct_ms(latencies, 0.5):.1f} | "
                        f"{pct_ms(latencies, 0.99):.1f} |")
    return "\n".join(rows)


# --- 4. the server's memory ------------------------------------------------------
def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def workers_rss_kib(server: int) -> int:
    """The RSS of the server's children (its waiting workers), summed."""
    total = 0
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            if parent == server:
                total += rss_kib(int(entry))
        except (OSError, StopIteration, ValueError):
            continue
    return total


async def server_rss(bench: Bench, total: int) -> str:
    toolbox = bench.toolbox("rss-local", "local", "resident")
    shell = tool_call(toolbox, "shell", {"command": "echo x"})
    read = tool_call(toolbox, "file_read", {"path": "f.txt"}, fresh_run=True)
    for i in range(100):
        await (shell if i % 2 else read)()
    pid = toolbox.transport.channel.pid
    after_100, workers_100 = rss_kib(pid), workers_rss_kib(pid)
    workers_most = workers_100
    for i in range(total - 100):
        await (shell if i % 2 else read)()
        if i % 100 == 99:
            workers_most = max(workers_most, workers_rss_kib(pid))
    assert toolbox.transport.channel.pid == pid
    after_all = rss_kib(pid)
    return (f"| | after 100 calls | after {total} calls | growth |\n| --- | ---: | ---: | ---: |\n"
            f"| the server | {after_100} KiB | {after_all} KiB | {after_all - after_100:+d} KiB |\n"
            f"| its waiting workers (the most seen, every 100 calls) | {workers_100} KiB | "
            f"{workers_most} KiB | {workers_most - workers_100:+d} KiB |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--backends", default="local,bwrap,docker")
    parser.add_argument("--fleet-backends", default="local,bwrap")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--per-agent", type=int, default=100)
    parser.add_argument("--rss-calls", type=int, default=10_000)
    parser.add_argument("--no-swerex", action="store_true")
    opts = parser.parse_args()
    backends = [b for b in opts.backends.split(",") if b]
    root = Path(tempfile.mkdtemp(prefix="guilds-resident-bench-"))
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            bench = Bench(root, store)
            try:
                if opts.no_swerex:
                    times = await per_call(bench, backends, opts.calls, None)
                else:
                    async with SweRex() as swerex:
                        times = await per_call(bench, backends, opts.calls, swerex)
                print(f"### Per call ({opts.calls} calls per path, interleaved; median)\n")
                print(per_call_table(times, backends), "\n", flush=True)
                if {"local", "docker"} <= set(backends):
                    print(await docker_pair(bench, opts.calls * 5), "\n", flush=True)
                print("### First call of a new agent\n")
                print(await first_calls(bench, backends), "\n", flush=True)
                fleet_backends = [b for b in opts.fleet_backends.split(",") if b]
                if fleet_backends and opts.agents:
                    print("### Agents at once\n")
                    print(await fleets(bench, fleet_backends, opts.agents, opts.per_agent), "\n", flush=True)
                if opts.rss_calls:
                    print("### The resident server's memory (local)\n")
                    print(await server_rss(bench, opts.rss_calls), flush=True)
            finally:
                await bench.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GUILDS_DATA", "/nonexistent")
    asyncio.run(main())
