"""A `guilds serve --e2b` serving one template, for the benches of agents made on demand
(bench/e2b_create_bench.py, bench/busy_agents_bench.py).

    with run_folder() as run:                       # a folder of its own; at its end, checked empty
        with served(run, "bwrap", cap=108) as server:   # the server, its caps raised to cap
            ...AsyncSandbox.create(template=run.template)...

The template (``run.template``, a name of the run's own: its agents and containers
are told apart from every other run's) has a starting home of a few files
(``home_mb`` MB more when asked). The caps (``agents.max_per_owner``, ``agents.max``:
the E2B front's too) are raised so that each owner may hold ``cap`` agents at once, the
E2B key and the in-process floor together, beside a full warm pool.

When the run ends, even on a failure: the agents left live in the record (the
server's stop removes its E2B ones; these are what another process made) are
removed through guilds.open, then the run is checked to have left nothing: no
agent live or being made, no home, no process of its folder, no container of its
template. Anything found is named on stderr and removed, and ``run.left`` holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import guilds  # noqa: E402
from e2b_kit import E2BServer, e2b_server, pids_alive  # noqa: E402

PROFILE_HOOK = Path(__file__).resolve().parent / "create_profile"
"""The folder whose sitecustomize.py times a server's steps (``profile``)."""


@dataclass
class Run:
    folder: Path
    template: str
    left: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def config(self) -> Path:
        return self.folder / "agent.toml"


def template_settings(name: str, sandbox: str, home: Path, cap: int, pool: int | None) -> str:
    """The TOML after the server's own agent: one template; each owner may hold cap agents, the
    server two owners' worth and its pool's most (so that no owner's make waits on another's or
    on the pool); ``pool``: a warm pool of that many spare agents, growing with the demand up to
    cap more."""
    pool_max = 0 if pool is None else cap + pool
    lines = [f"[templates.{name}.agent]", f'home = "{home}"', f'sandbox = "{sandbox}"', "max_tool_calls = 100000"]
    if pool is not None:
        lines += [f"[templates.{name}.pool]", f"spare = {pool}", f"max = {pool_max}"]
    lines += ["[agents]", f"max = {2 * cap + pool_max}", f"max_per_owner = {cap}"]
    return "\n".join(lines)


def make_template_home(home: Path, extra_mb: int) -> None:
    """A small project: a README, a package of a few modules, and extra_mb MB of data when asked."""
    (home / "src" / "app").mkdir(parents=True)
    (home / "README.md").write_text("# app\n\nA template's starting home.\n")
    for i in range(8):
        (home / "src" / "app" / f"mod{i}.py").write_text(f"def f{i}():\n    return {i}\n" * 20)
    if extra_mb:
        (home / "data.bin").write_bytes(os.urandom(extra_mb << 20))


@contextlib.contextmanager
def run_folder() -> Iterator[Run]:
    run = Run(Path(tempfile.mkdtemp(prefix="template-bench-")), f"tb{secrets.token_hex(3)}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # a stopped run cleans up as a failed one does
    try:
        yield run
    finally:
        try:
            asyncio.run(remove_left_agents(run))
        except Exception as exc:
            print(f"the agents left could not be listed: {exc}", file=sys.stderr)
        run.left = leftovers(run)
        if run.left:
            print("LEFT BEHIND (removed now):\n" + "\n".join(f"  {item}" for item in run.left), file=sys.stderr)
            remove_leftovers(run.left)
        else:
            print("\nnothing left behind: no agent live or being made, no home, no process, no container")
        shutil.rmtree(run.folder, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def served(run: Run, sandbox: str, *, cap: int, pool: int | None = None, home_mb: int = 0,
           profile: Path | None = None) -> Iterator[E2BServer]:
    """The server, its variables exported in this process (the SDK reads them); ``profile``:
    the server appends its steps' times to that file (bench/create_profile/sitecustomize.py)."""
    home = run.folder / "template-home"
    make_template_home(home, home_mb)
    settings = template_settings(run.template, sandbox, home, cap, pool)
    saved = {name: os.environ.get(name) for name in ("GUILDS_BENCH_PROFILE", "PYTHONPATH")}
    if profile is not None:
        os.environ["GUILDS_BENCH_PROFILE"] = str(profile)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROFILE_HOOK), saved["PYTHONPATH"]]))
    with e2b_server(run.folder, sandbox, settings) as server:
        for name, value in saved.items():  # the server has them; nothing else this process starts
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.environ.update(server.env())
        yield server


async def remove_left_agents(run: Run) -> None:
    """The agents a failed run left live, removed (the server's stop removes its E2B ones)."""
    if not run.config.exists():
        return
    async with guilds.open(run.config, data_dir=run.data) as agent:
        for record in await agent.list_agents():
            try:
                await agent.remove_agent(record.id)
            except Exception as exc:
                print(f"could not remove agent {record.id}: {exc}", file=sys.stderr)


def leftovers(run: Run) -> list[str]:
    """What the run left: agents live or being made, homes, processes of its folder, containers."""
    left = []
    db = run.data / "guilds.db"
    if db.exists():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            left += [f"agent {row[0]} {row[1]}" for row in
                     conn.execute("SELECT id, status FROM agents WHERE status IN ('live', 'making')")]
    homes = run.data / "agent-homes"
    if homes.is_dir():
        left += [f"home {p}" for p in homes.iterdir()]
    left += [f"process {pid}" for pid in pids_alive(str(run.folder)) if pid != os.getpid()]
    if shutil.which("docker") and os.environ.get("DOCKER_HOST"):
        names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                               check=False).stdout.split()
        left += [f"container {n}" for n in names if n.startswith(f"guilds-{run.template}-")]
    return left


def remove_leftovers(left: list[str]) -> None:
    """Everything leftovers() named, removed (the processes are this run's own, by pid)."""
    for item in left:
        kind, name = item.split(" ", 2)[:2]
        if kind == "process":
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(name), signal.SIGKILL)
        elif kind == "container":
            subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True, check=False)


@dataclass
class PoolState:
    ready: int = 0
    making: int = 0
    target: int = 0
    hits: int = 0
    misses: int = 0


def pool_state(server: E2BServer, template: str) -> PoolState:
    """The template's warm pool as the server's /metrics says (all 0 without a pool)."""
    token = (server.data / "serve.token").read_text().strip()
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    state = PoolState()
    for line in text.splitlines():
        found = re.match(r'guilds_pool_(agents|hits_total|misses_total)\{(.*)\} ([0-9.e+]+)$', line)
        if not found or f'template="{template}"' not in found.group(2):
            continue
        value = int(float(found.group(3)))
        if found.group(1) == "agents":
            setattr(state, re.search(r'state="(\w+)"', found.group(2)).group(1), value)  # type: ignore[union-attr]
        else:
            setattr(state, found.group(1).removesuffix("_total"), value)
    return state


async def pool_settled(server: E2BServer, template: str, most_seconds: float = 180) -> PoolState:
    """The pool once nothing is being made and it holds its target (or most_seconds passed)."""
    deadline = time.monotonic() + most_seconds
    while True:
        state = await asyncio.to_thread(pool_state, server, template)
        if (state.making == 0 and state.ready >= state.target) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.5)


def error_kind(exc: BaseException) -> str:
    """An error's class and first line, its ids and numbers masked, so alike errors count together."""
    text = (str(exc).strip().splitlines() or [""])[0][:120]
    text = re.sub(r"[0-9a-f]{8,}", "<id>", text)
    return f"{type(exc).__name__}: {re.sub(r'[0-9]+', 'N', text)}"


def nearest_rank(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (p99 of 100 values: the second largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]
