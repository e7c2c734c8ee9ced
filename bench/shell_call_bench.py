"""A shell call of `true` against spawning `bash -c true`, per backend, on the resident transport.

Run: .venv/bin/python bench/shell_call_bench.py [--calls N] [--backends local,bwrap,docker,kubernetes]

``kubernetes-direct`` is the kubernetes backend with ``channel = "direct"`` (the helper's
frames on TCP to the pod's IP, docs/sandboxes.md), beside ``kubernetes`` (on the exec's stream).
``docker-hostbin`` is the docker backend with this machine's bash, loader, libraries and
locales bound read-only over the image's (HOSTBIN): the same files, so the same pages in
memory and in the CPU's caches, as the floor's bash and local's. Beside ``docker`` it shows
what the image's own copy of them costs in the caches, apart from what docker adds.

Each backend's agent makes shell `true` calls through ``Toolbox.call`` (the run
record on SQLite, redaction, the pipeline) on the resident transport; the floor
is `bash -c true` spawned from the orchestrator (asyncio, as
bench/resident_bench.py spawns it). Every path takes turns with the others call
by call, each round in a new shuffled order (resident_bench's ``interleaved``),
so the machine's load falls on all alike. A backend that cannot start here is
left out with one line saying why.

The script times the tree it sits in: copied into another checkout's bench/
(beside that tree's resident_bench.py), it times that tree, so a change's
before and after run one right after the other.

Prints a Markdown table: median ms per backend, and its shell / spawn (aim <= 1.5x);
with --round-trips, each backend's channel alone too (a request the helper answers at once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.sandbox.docker import docker_spec
from guilds.toolbox import Toolbox
from resident_bench import Timed, interleaved, median_ms, spawn, transport_call


HOSTBIN = ("/usr/bin/bash", "/usr/lib/x86_64-linux-gnu", "/usr/lib/locale")
"""What ``docker-hostbin`` binds from this machine, each at its own path (ld.so, libc and
libtinfo are in the library folder; /lib64's loader is a link into it)."""


def bind_host_binaries(agent_id: str) -> None:
    """The container of agent_id made with HOSTBIN bound read-only (docker_spec, for this run)."""
    make = docker_spec.container_spec

    def spec(cfg: Any, **kwargs: Any) -> dict[str, Any]:
        made = make(cfg, **kwargs)
        if kwargs.get("agent_id") == agent_id:
            made["volumes"] = {**made["volumes"], **{path: {"bind": path, "mode": "ro"} for path in HOSTBIN}}
        return made
    docker_spec.container_spec = spec  # type: ignore[assignment]


async def toolboxes(root: Path, store: Store, backends: list[str]) -> dict[str, Toolbox]:
    """backend -> a Toolbox on the resident transport whose first call answered."""
    made: dict[str, Toolbox] = {}
    for backend in backends:
        home = root / "homes" / backend
        home.mkdir(parents=True)
        sandbox, _, channel = backend.partition("-")
        data: dict[str, Any] = {"agent": {"id": f"sc-{backend}-{os.getpid()}", "home": str(home),
                                          "sandbox": sandbox, "transport": "resident", "max_tool_calls": 10_000_000}}
        if sandbox == "kubernetes":  # the test cluster's (scripts/kube-test-env.sh)
            data["kubernetes"] = {"namespace": os.environ.get("GUILDS_TEST_KUBE_NAMESPACE", "guilds-test"),
                                  "image": os.environ.get("GUILDS_TEST_KUBE_IMAGE", "guilds-sandbox:latest"),
                                  "channel": channel or "exec"}
        if backend == "docker-hostbin":
            bind_host_binaries(data["agent"]["id"])
        settings = parse_settings(data, root, env={})
        toolbox = Toolbox(settings, get_sandbox(settings, root / "data"), store)
        try:
            await shell_call(toolbox)()
        except Exception as exc:  # noqa: BLE001 - a backend this machine lacks is said, not fatal
            print(f"{backend}: left out ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})")
            with contextlib.suppress(Exception):
                await close(toolbox)
            continue
        made[backend] = toolbox
    return made


async def close(toolbox: Any) -> None:
    await toolbox.close()
    if toolbox.sandbox.name != "local":
        await toolbox.sandbox.stop()


def shell_call(toolbox: Toolbox) -> Timed:
    async def call() -> None:
        result = await toolbox.call(f"bench-{toolbox.settings.id}", "shell", {"command": "true"})
        if result.is_error:
            raise RuntimeError(result.text)
    return call


def table(times: dict[str, list[float]], backends: list[str]) -> str:
    spawn_ms = median_ms(times["spawn"])
    rows = ["| backend | shell `true` ms | × spawn `bash -c true` (aim ≤ 1.5×) |", "| --- | ---: | ---: |"]
    for backend in backends:
        shell = median_ms(times[backend])
        rows.append(f"| {backend} | {shell:.2f} | {shell / spawn_ms:.2f}× |")
    trips = [f"{b} {median_ms(times[f'{b} round trip']):.2f} ms" for b in backends if f"{b} round trip" in times]
    if trips:
        rows.append("\nRound trip (an op the helper does not know, answered at once, no record): " + ", ".join(trips)
                    + ".")
    rows.append(f"\nFloor: spawning `bash -c true` {spawn_ms:.2f} ms.")
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--backends", default="local,bwrap")
    parser.add_argument("--round-trips", action="store_true",
                        help="also time each backend's channel alone: a request the helper answers at once")
    opts = parser.parse_args()
    print(f"tree: {ROOT}; load average {os.getloadavg()[0]:.1f}")
    root = Path(tempfile.mkdtemp(prefix="guilds-shell-call-bench-"))
    try:
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            made = await toolboxes(root, store, [b for b in opts.backends.split(",") if b])
            try:
                paths: dict[str, Timed] = {backend: shell_call(tb) for backend, tb in made.items()}
                if opts.round_trips:
                    paths.update({f"{backend} round trip": transport_call(tb, "none", {})
                                  for backend, tb in made.items()})
                paths["spawn"] = lambda: spawn(["bash", "-c", "true"])
                times = await interleaved(paths, opts.calls)
            finally:
                for toolbox in made.values():
                    await close(toolbox)
        print(table(times, list(made)))
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("GUILDS_DATA", "/nonexistent")
    asyncio.run(main())
