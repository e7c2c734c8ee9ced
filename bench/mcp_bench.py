"""The MCP front's added cost per call, and `guilds mcp` against desktop-commander.

Run: .venv/bin/python bench/mcp_bench.py [--runs N] [--sandbox local|bwrap] [--no-dc]

Needs, for the comparison, desktop-commander installed under bench/.out:
    cd bench/.out && PUPPETEER_SKIP_DOWNLOAD=1 npm install @wonderwhy-er/desktop-commander

Two calls, each measured the same way in the same run on the same machine
(median wall time of N calls after 3 warm-up calls):
    echo   shell `echo hi`            desktop-commander: start_process `echo hi`
    read   file_read of a 200-line file (a new file each call, so no call is
           answered by a repeated-read pointer)   desktop-commander: read_file
Paths:
    toolbox      Toolbox.call in this process: the floor the front adds to
    front        the official SDK client against build_server() in memory (no transport)
    guilds mcp   the SDK client over stdio against `python -m guilds.fronts.mcp_server`
    dc           the SDK client over stdio against desktop-commander (node), telemetry off
and the MCP layer alone, over a stub toolbox that answers at once (so the
helper's and the machine's noise drop out): in memory, and over stdio
(`python bench/mcp_bench.py --stub-server`). The paths take turns call by
call, in a rotating order, so a change in the machine's load falls on all alike.
Prints a Markdown table (pasted into docs/benchmarks.md under "MCP").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from mcp import Client, StdioServerParameters

from guilds.fronts.mcp_server import build_server, serve_streams
from guilds.sandbox import get_sandbox
from guilds.config.settings import load_settings
from guilds.record.store import Store
from guilds.toolbox import CallResult, Toolbox, tool_specs

DC_SCRIPT = ROOT / "bench/.out/node_modules/@wonderwhy-er/desktop-commander/dist/index.js"
WARMUP = 3
LINES = 200
Call = Callable[[str, int], Awaitable[Any]]
"""(operation, index) -> the call's result; operation is "echo" or "read"."""


def make_files(home: Path, count: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    body = "".join(f"line {n}: the quick brown fox jumps over the lazy dog\n" for n in range(LINES))
    for i in range(count):
        (home / f"f{i}.txt").write_text(body)


async def measure(paths: dict[str, Call], runs: int) -> dict[str, dict[str, float]]:
    """Median ms per call of each path and operation, the paths taking turns call by call
    (so a change in the machine's load falls on all of them alike)."""
    samples: dict[str, dict[str, list[float]]] = {name: {"echo": [], "read": []} for name in paths}
    names = list(paths)
    for i in range(WARMUP + runs):
        order = names[i % len(names):] + names[:i % len(names)]
        for op in ("echo", "read"):
            for name in order:
                call = paths[name]
                start = time.perf_counter()
                await call(op, i)
                if i >= WARMUP:
                    samples[name][op].append((time.perf_counter() - start) * 1000)
    return {name: {op: statistics.median(v) for op, v in ops.items()} for name, ops in samples.items()}


def checked(result: Any) -> Any:
    if getattr(result, "is_error", False):
        raise RuntimeError(f"call failed: {result}")
    return result


def guilds_call(call_tool: Callable[..., Awaitable[Any]], home: Path) -> Call:
    async def call(op: str, i: int) -> Any:
        if op == "echo":
            return checked(await call_tool("shell", {"command": "echo hi"}))
        return checked(await call_tool("file_read", {"path": str(home / f"f{i}.txt")}))
    return call


def dc_call(client: Client, home: Path) -> Call:
    async def call(op: str, i: int) -> Any:
        if op == "echo":
            return checked(await client.call_tool("start_process", {"command": "echo hi", "timeout_ms": 10000}))
        return checked(await client.call_tool("read_file", {"path": str(home / f"f{i}.txt")}))
    return call


async def open_paths(stack: AsyncExitStack, folder: Path, home: Path, sandbox: str,
                     with_dc: bool) -> dict[str, Call]:
    settings_file = folder / "settings.toml"
    settings_file.write_text(f'[agent]\nhome = "{home}"\nsandbox = "{sandbox}"\nmax_tool_calls = 100000\n')
    settings, data = load_settings(settings_file), folder / "data"
    data.mkdir()
    store = await stack.enter_async_context(Store(f"sqlite:///{data / 'guilds.db'}"))
    toolbox = Toolbox(settings, get_sandbox(settings, data), store)
    paths = {"toolbox": guilds_call(lambda tool, args: _direct(toolbox, tool, args), home)}
    front = await stack.enter_async_context(Client(build_server(toolbox, run_id="mcp-bench-front")))
    paths["front"] = guilds_call(front.call_tool, home)
    params = StdioServerParameters(command=sys.executable, args=["-m", "guilds.fronts.mcp_server", str(settings_file),
                                                                  str(data)], env=_env())
    stdio = await stack.enter_async_context(Client(params, read_timeout_seconds=120))
    paths["guilds mcp"] = guilds_call(stdio.call_tool, home)
    if with_dc:
        paths["desktop-commander"] = dc_call(await stack.enter_async_context(dc_client(folder)), home)
    return paths


STUB_TEXT = "hi\nremaining_tool_calls: 199"
STUB_META = {"exit_code": 0, "cwd": "/home/agent", "timed_out": False, "call": "c0123456789ab", "tool": "shell",
             "run": "mcp-stub", "seq": 1, "started_at": "2026-01-01T00:00:00.000+00:00", "duration_ms": 0,
             "row": "Run echo hi"}


class StubStore:
    """The run record's part the MCP front asks of (a run's principal), answered at once."""

    async def claim_run(self, run_id: str, principal: str) -> str:
        return principal

    async def get_run(self, run_id: str) -> None:
        return None


class StubToolbox:
    """Answers every call at once with a result shaped like a real one: the MCP layer alone."""

    store = StubStore()

    def tools(self) -> list:
        return tool_specs()

    async def call(self, run_id: str, tool: str, args: Any, *, context_reset: bool = False) -> CallResult:
        return CallResult(STUB_TEXT, False, STUB_META)


async def open_stub_paths(stack: AsyncExitStack, home: Path) -> dict[str, Call]:
    memory = await stack.enter_async_context(Client(build_server(StubToolbox(), run_id="mcp-stub")))
    params = StdioServerParameters(command=sys.executable, args=[__file__, "--stub-server"], env=_env())
    stdio = await stack.enter_async_context(Client(params, read_timeout_seconds=120))
    return {"layer in memory": guilds_call(memory.call_tool, home),
            "layer over stdio": guilds_call(stdio.call_tool, home)}


async def _direct(toolbox: Toolbox, tool: str, args: dict) -> Any:
    return checked(await toolbox.call("mcp-bench-direct", tool, args))


def dc_client(folder: Path) -> Client:
    """desktop-commander with its config in a home of its own, telemetry and onboarding off."""
    if not DC_SCRIPT.exists() or not shutil.which("node"):
        sys.exit(f"desktop-commander not installed at {DC_SCRIPT} (see this script's docstring)")
    dc_home = folder / "dc-home"
    dc_home.mkdir()
    env = _env(HOME=str(dc_home), DESKTOP_COMMANDER_DISABLE_TELEMETRY="1")
    params = StdioServerParameters(command="node", args=[str(DC_SCRIPT), "--no-onboarding"], env=env)
    return Client(params, read_timeout_seconds=120)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUILDS_")}
    return {**env, **extra}


def table(rows: dict[str, dict[str, float]], layer: dict[str, dict[str, float]]) -> str:
    base = rows["toolbox"]
    lines = ["| path | echo (ms) | read (ms) | echo vs toolbox | read vs toolbox |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, ms in rows.items():
        lines.append(f"| {name} | {ms['echo']:.1f} | {ms['read']:.1f} | "
                     f"{ms['echo'] / base['echo']:.2f}x | {ms['read'] / base['read']:.2f}x |")
    for name, ms in layer.items():
        lines.append(f"| {name} (stub toolbox) | {ms['echo']:.2f} | {ms['read']:.2f} | | |")
    if "desktop-commander" in rows:
        ours, theirs = rows["guilds mcp"], rows["desktop-commander"]
        lines.append("")
        lines.append(f"guilds mcp / desktop-commander: echo {ours['echo'] / theirs['echo']:.2f}x, "
                     f"read {ours['read'] / theirs['read']:.2f}x")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--sandbox", default="local", choices=("local", "bwrap"))
    parser.add_argument("--no-dc", action="store_true", help="skip desktop-commander")
    parser.add_argument("--stub-server", action="store_true", help="serve the stub toolbox on stdio (internal)")
    opts = parser.parse_args()
    if opts.stub_server:
        await serve_streams(build_server(StubToolbox(), run_id="mcp-stub"))
        return
    folder = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    try:
        home = folder / "home"
        make_files(home, opts.runs + WARMUP)
        async with AsyncExitStack() as stack:
            paths = await open_paths(stack, folder, home, opts.sandbox, not opts.no_dc)
            rows = await measure(paths, opts.runs)
        async with AsyncExitStack() as stack:
            layer = await measure(await open_stub_paths(stack, home), opts.runs * 10)
        print(f"sandbox {opts.sandbox}, {opts.runs} calls each ({opts.runs * 10} for the stub), median; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
        print(table(rows, layer))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
