"""The claim mode's sections of bench/kube_bench.py (``--claims``): agent-sandbox's warm
pools against a pod made on first use, on the same cluster in the same run.

Every first call is a new agent's shell `true` through ``Toolbox.call`` (the run
record on SQLite, redaction, the pipeline), from making its toolbox to the answer:
for a claim, the claim made, adopted and bound, the pod's helpers checked, the
secrets file and repos.json written, the resident helper opened, the call answered.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kube_bench import NAMESPACE, first_call
from resident_bench import interleaved, median_ms, pct_ms, tool_call

from guilds.record.store import Store
from guilds.sandbox.kubernetes import kube_claim_spec as claims

POOL_WAIT_SECONDS = 300


def _pool_of(toolbox: Any) -> str:
    box = toolbox.sandbox
    return str(claims.template_manifest(box.config, home=box.home, network=False, base_env=box._base_env,
                                        helpers=_digest())["metadata"]["name"])


def _digest() -> str:
    from guilds.sandbox._container import helpers_digest

    return helpers_digest()


async def _ready(toolbox: Any, pool: str, replicas: int) -> None:
    """Until the pool has `replicas` ready sandboxes."""
    box = toolbox.sandbox
    deadline = time.monotonic() + POOL_WAIT_SECONDS
    while time.monotonic() < deadline:
        got = await asyncio.to_thread(box.custom.get_namespaced_custom_object, claims.EXTENSIONS, claims.VERSION,
                                      NAMESPACE, claims.POOLS, pool)
        if int((got.get("status") or {}).get("readyReplicas") or 0) >= replicas:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the warm pool {pool} had not {replicas} ready sandboxes after {POOL_WAIT_SECONDS} s")


async def _resize(toolbox: Any, pool: str, replicas: int) -> None:
    box = toolbox.sandbox
    await asyncio.to_thread(box.custom.patch_namespaced_custom_object, claims.EXTENSIONS, claims.VERSION,
                            NAMESPACE, claims.POOLS, pool, {"spec": {"replicas": replicas}})


def _launch(toolbox: Any) -> str:
    box = toolbox.sandbox
    claim = box.custom.get_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, NAMESPACE, claims.CLAIMS,
                                                    box.claim)
    sandbox = box.custom.get_namespaced_custom_object(claims.GROUP, claims.VERSION, NAMESPACE, claims.SANDBOXES,
                                                      claim["status"]["sandbox"]["name"])
    return str(sandbox["metadata"].get("labels", {}).get("agents.x-k8s.io/launch-type", "?"))


def timing_claims(toolbox: Any, found: list[float]) -> None:
    """Record in found how long the sandbox's claim takes to be bound (made, adopted by the
    controller, its sandbox and pod read): the controller's part, apart from the pod's cpu."""
    box = toolbox.sandbox
    claimed = box._claimed

    def timed(pool: str) -> bool:
        began = time.perf_counter()
        made = claimed(pool)
        found.append(time.perf_counter() - began)
        return bool(made)

    box._claimed = timed


async def set_up_then_call(toolbox: Any) -> tuple[float, float]:
    """(the sandbox's start: claimed and set up; the whole first call, that start included)."""
    began = time.perf_counter()
    await toolbox.sandbox.start()
    started = time.perf_counter() - began
    await tool_call(toolbox, "shell", {"command": "true"})()
    return started, time.perf_counter() - began


def _row(name: str, found: list[float], note: str = "") -> str:
    return (f"| {name} | {len(found)} | {pct_ms(found, 0.5):.0f} | {pct_ms(found, 0.99):.0f} | "
            f"{min(found) * 1000:.0f} | {max(found) * 1000:.0f} | {note} |")


async def first_calls(fleet: Any, args: argparse.Namespace) -> str:
    rows = ["| a new agent's first call | agents | p50 ms | p99 ms | min ms | max ms | |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    cold = []
    for _ in range(args.cold_rounds):
        toolbox = fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu)
        cold.append(await first_call(toolbox))
        await fleet.remove(toolbox)
        fleet.toolboxes.remove(toolbox)
    rows.append(_row("pod mode: a pod made on first use", cold))
    warm = args.warm
    seed = fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu, mode="claim", warm=warm)
    await first_call(seed)  # makes the template and the pool, and checks the image's helpers once
    pool = _pool_of(seed)
    found, set_up, launches, bound = [], [], [], []
    for _ in range(args.claim_rounds):
        await _ready(seed, pool, 1)
        toolbox = fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu, mode="claim", warm=warm)
        timing_claims(toolbox, bound)
        started, whole = await set_up_then_call(toolbox)
        set_up.append(started)
        found.append(whole)
        launches.append(await asyncio.to_thread(_launch, toolbox))
        await fleet.remove(toolbox)
        fleet.toolboxes.remove(toolbox)
    rows.append(_row("claim mode: the claim bound (made, adopted by the controller, its sandbox and pod read)",
                     bound))
    rows.append(_row(f"claim mode: the claim bound to a ready sandbox of a pool of {warm}, secrets and "
                     "repos.json written (the sandbox's start)", set_up))
    rows.append(_row("claim mode: the whole first call (that start, the resident helper opened, the call "
                     "answered)", found, f"{launches.count('warm')} of {len(launches)} adopted warm"))
    rows.append("")
    rows.append(f"claim from the warm pool / pod made on first use, p50: {pct_ms(found, 0.5):.0f} / "
                f"{pct_ms(cold, 0.5):.0f} ms = {statistics.median(found) / statistics.median(cold):.2f}×.")
    await _resize(seed, pool, 0)
    return "\n".join(rows)


async def suspend_resume(fleet: Any, args: argparse.Namespace) -> str:
    toolbox = fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu, mode="claim", warm=0, keep_home=True)
    made = await first_call(toolbox)
    found = []
    for _ in range(args.resume_rounds):
        await toolbox.close()
        await toolbox.sandbox.stop()  # suspended: the pod deleted, the volume kept
        box = toolbox.sandbox
        while await asyncio.to_thread(box._read_pod) is not None:
            await asyncio.sleep(0.2)
        began = time.perf_counter()
        await tool_call(toolbox, "shell", {"command": "test -f ~/.bashrc -o -d ~"})()
        found.append(time.perf_counter() - began)
    rows = ["| an agent's own sandbox | rounds | p50 ms | p99 ms | min ms | max ms | |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
            _row("made, to its first call", [made], "the volume bound, the pod started"),
            _row("suspended (pod deleted, volume kept), resumed by the next call, to its answer", found)]
    return "\n".join(rows)


async def claims_at_once(fleet: Any, args: argparse.Namespace) -> str:
    n = args.fleet
    seed = fleet.toolbox("kubernetes", "resident", cpu=args.fleet_claim_cpu, mode="claim", warm=n)
    await first_call(seed)
    pool = _pool_of(seed)
    await _ready(seed, pool, n)
    boxes = [fleet.toolbox("kubernetes", "resident", cpu=args.fleet_claim_cpu, mode="claim", warm=n)
             for _ in range(n)]
    bound: list[float] = []
    for toolbox in boxes:
        timing_claims(toolbox, bound)
    began = time.perf_counter()
    both = await asyncio.gather(*(set_up_then_call(tb) for tb in boxes))
    wall = time.perf_counter() - began
    set_up, firsts = [b[0] for b in both], [b[1] for b in both]
    launches = await asyncio.gather(*(asyncio.to_thread(_launch, tb) for tb in boxes))
    await _resize(seed, pool, 0)
    return "\n".join([
        f"| {n} new agents at once, a pool of {n} ready (each pod {args.fleet_claim_cpu} cpu) | wall s | per s | "
        "p50 ms | p99 ms | adopted warm |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| the claim bound (made, adopted, its sandbox and pod read) | {max(bound):.1f} | {n / max(bound):.1f} | "
        f"{pct_ms(bound, 0.5):.0f} | {pct_ms(bound, 0.99):.0f} | |",
        f"| claimed and set up (the sandbox's start) | {max(set_up):.1f} | {n / max(set_up):.1f} | "
        f"{pct_ms(set_up, 0.5):.0f} | {pct_ms(set_up, 0.99):.0f} | {launches.count('warm')} of {n} |",
        f"| the whole first call | {wall:.1f} | {n / wall:.1f} | {pct_ms(firsts, 0.5):.0f} | "
        f"{pct_ms(firsts, 0.99):.0f} | |"])


async def per_call(fleet: Any, args: argparse.Namespace) -> str:
    paths = {"local resident": tool_call(fleet.toolbox("local", "resident"), "shell", {"command": "true"}),
             "pod mode resident": tool_call(fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu),
                                            "shell", {"command": "true"}),
             "claimed pod resident": tool_call(fleet.toolbox("kubernetes", "resident", cpu=args.claim_cpu,
                                                             mode="claim", warm=0), "shell", {"command": "true"})}
    times = await interleaved(paths, args.calls)
    kube, local = median_ms(times["claimed pod resident"]), median_ms(times["local resident"])
    rows = ["| path | shell `true` per call, median ms | p90 ms |", "| --- | ---: | ---: |"]
    rows += [f"| {name} | {median_ms(found):.2f} | {pct_ms(found, 0.9):.2f} |" for name, found in times.items()]
    rows += ["", f"claimed pod / local per shell call on the resident transport ({args.calls} calls each, "
             f"interleaved): {kube:.2f} / {local:.2f} ms = {kube / local:.2f}× (aim ≤ 1.5×)."]
    return "\n".join(rows)


async def claim_sections(fleet_class: Any, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="guilds-kube-bench-") as tmp:
        root = Path(tmp)
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            fleet = fleet_class(root, store, args.claim_cpu)
            try:
                for title, section in ((f"First call of a new agent (each pod {args.claim_cpu} cpu)", first_calls),
                                       ("Suspend and resume", suspend_resume),
                                       (f"{args.fleet} agents claiming at once", claims_at_once),
                                       ("Per call on a claimed pod", per_call)):
                    if title.split()[0].lower() in args.skip or (title[0].isdigit() and "N" in args.skip):
                        continue
                    print(f"### {title}\n", flush=True)
                    print(await section(fleet, args), flush=True)
                    print(flush=True)
                    await fleet.close()
            finally:
                await fleet.close()
