"""The kubernetes backend on a real cluster, against local (and docker) in the same run.

Run (a cluster at KUBECONFIG whose node has the image; scripts/kube-test-env.sh starts one):
    eval "$(bash scripts/kube-test-env.sh)"
    .venv/bin/python bench/kube_bench.py [--calls 40] [--rounds 3] [--agents 8] [--per-agent 20]

Everything goes through ``Toolbox.call`` (the run record on SQLite, redaction, the
pipeline), as resident_bench.py does:

1. the first call of a new agent: its pod made (the claim bound, the image's
   helpers checked, repos.json written), then shell `true` answered; per
   transport, --rounds new agents each, beside docker's and local's first call;
2. per shell `true` call on the resident transport, kubernetes against local,
   the two taking turns call by call (aim <= 1.5x); the exec transport beside;
3. --agents new agents at once: their first calls together (wall time), then
   --per-agent shell `true` calls each, all at once: calls/s, p50 and p99, beside
   local's.

Each pod asks for --cpu (requests = limits): the fleet's pods must fit the node.
Prints Markdown (pasted into docs/benchmarks.md under "Kubernetes").

With --claims, the claim mode instead (agent-sandbox's controller running; the
sections of bench/kube_claims_bench.py): a new agent's first call, a cold pod against
a claim from a warm pool (--claim-rounds of each, p50 and p99); an own sandbox
suspended, then resumed by its first call; --fleet agents claiming at once from a
pool of that size; per call on the resident transport, claimed pod against local.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resident_bench import interleaved, median_ms, pct_ms, tool_call  # noqa: E402

from guilds.sandbox import get_sandbox  # noqa: E402
from guilds.config.settings import parse_settings  # noqa: E402
from guilds.record.store import Store  # noqa: E402
from guilds.toolbox import Toolbox  # noqa: E402

IMAGE = os.environ.get("GUILDS_TEST_KUBE_IMAGE", "guilds-sandbox:kube-test")
NAMESPACE = os.environ.get("GUILDS_TEST_KUBE_NAMESPACE", "guilds-test")
DOCKER_IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")


class Fleet:
    """Toolboxes made for one run, each agent's pod, claim and secret removed at the end."""

    def __init__(self, root: Path, store: Store, cpu: str):
        self.root, self.store, self.cpu = root, store, cpu
        self.toolboxes: list[Toolbox] = []

    def toolbox(self, backend: str, transport: str, *, cpu: str | None = None, **kube: Any) -> Toolbox:
        """kube: more [kubernetes] keys (mode, warm, keep_home)."""
        agent = f"b{secrets.token_hex(4)}"
        home = self.root / "homes" / agent if backend != "kubernetes" else Path("/home/agent")
        data: dict[str, Any] = {"agent": {"id": agent, "home": str(home), "sandbox": backend,
                                          "transport": transport, "max_tool_calls": 10_000_000}}
        if backend == "kubernetes":
            data["kubernetes"] = {"namespace": NAMESPACE, "image": IMAGE, "cpu": cpu or self.cpu,
                                  "memory": "256Mi", "home_size": "1Gi", **kube}
        if backend == "docker":
            data["docker"] = {"image": DOCKER_IMAGE}
        settings = parse_settings(data, self.root, env={})
        toolbox = Toolbox(settings, get_sandbox(settings, self.root / "data"), self.store)
        self.toolboxes.append(toolbox)
        return toolbox

    async def close(self) -> None:
        await asyncio.gather(*(self.remove(tb) for tb in self.toolboxes))
        self.toolboxes.clear()

    async def remove(self, toolbox: Toolbox) -> None:
        await toolbox.close()
        if toolbox.sandbox.name == "local":
            return
        await toolbox.sandbox.stop()
        if toolbox.sandbox.name == "kubernetes":
            remove = _remove_claimed if hasattr(toolbox.sandbox, "claim") else _remove_claim_and_secret
            await asyncio.to_thread(remove, toolbox.sandbox)


def _remove_claim_and_secret(sandbox: Any) -> None:
    from kubernetes.client import ApiException

    for delete, name in ((sandbox.core.delete_namespaced_persistent_volume_claim, f"{sandbox.pod}-home"),
                         (sandbox.core.delete_namespaced_secret, f"{sandbox.pod}-env")):
        try:
            delete(name, NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _remove_claimed(sandbox: Any) -> None:
    """A claim-mode agent's own Sandbox (a claim is deleted by stop) and its home volume."""
    from kubernetes.client import ApiException

    from guilds.sandbox.kubernetes import kube_claim_spec as claims

    for delete, args in ((sandbox.custom.delete_namespaced_custom_object,
                          (claims.GROUP, claims.VERSION, NAMESPACE, claims.SANDBOXES, sandbox.claim)),
                         (sandbox.core.delete_namespaced_persistent_volume_claim, (f"home-{sandbox.claim}", NAMESPACE))):
        try:
            delete(*args)
        except ApiException as exc:
            if exc.status != 404:
                raise


async def first_call(toolbox: Toolbox) -> float:
    began = time.perf_counter()
    await tool_call(toolbox, "shell", {"command": "true"})()
    return time.perf_counter() - began


async def first_calls(fleet: Fleet, rounds: int, docker: bool) -> str:
    rows = ["| backend | transport | first call of a new agent, median of the rounds ms | each ms |",
            "| --- | --- | ---: | --- |"]
    backends = ["kubernetes", "local"] + (["docker"] if docker else [])
    for backend in backends:
        for transport in ("resident", "exec"):
            found = []
            for _ in range(rounds):
                toolbox = fleet.toolbox(backend, transport)
                found.append(await first_call(toolbox))
                await fleet.remove(toolbox)
                fleet.toolboxes.remove(toolbox)
            each = ", ".join(f"{t * 1000:.0f}" for t in found)
            rows.append(f"| {backend} | {transport} | {statistics.median(found) * 1000:.0f} | {each} |")
    return "\n".join(rows)


async def per_call(fleet: Fleet, calls: int) -> str:
    paths = {f"{backend} {transport}": tool_call(fleet.toolbox(backend, transport), "shell", {"command": "true"})
             for backend in ("local", "kubernetes") for transport in ("resident", "exec")}
    times = await interleaved(paths, calls)
    rows = ["| path | shell `true` per call, median ms | p90 ms |", "| --- | ---: | ---: |"]
    rows += [f"| {name} | {median_ms(found):.2f} | {pct_ms(found, 0.9):.2f} |" for name, found in times.items()]
    kube, local = median_ms(times["kubernetes resident"]), median_ms(times["local resident"])
    rows.append("")
    rows.append(f"kubernetes / local per shell call on the resident transport ({calls} calls each, "
                f"interleaved): {kube:.2f} / {local:.2f} ms = {kube / local:.2f}× (aim ≤ 1.5×).")
    return "\n".join(rows)


async def agents_at_once(fleet: Fleet, agents: int, per_agent: int, cpu: str) -> str:
    rows = [f"| backend | {agents} first calls at once: wall s | slowest first call s | "
            f"{agents} × {per_agent} calls: calls/s | p50 ms | p99 ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for backend in ("kubernetes", "local"):
        boxes = [fleet.toolbox(backend, "resident", cpu=cpu) for _ in range(agents)]
        began = time.perf_counter()
        firsts = await asyncio.gather(*(first_call(tb) for tb in boxes))
        wall = time.perf_counter() - began
        latencies: list[float] = []

        async def agent(toolbox: Toolbox) -> None:
            call = tool_call(toolbox, "shell", {"command": "true"})
            for _ in range(per_agent):
                started = time.perf_counter()
                await call()
                latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(agent(tb) for tb in boxes))
        rate = agents * per_agent / (time.perf_counter() - began)
        rows.append(f"| {backend} | {wall:.1f} | {max(firsts):.1f} | {rate:.0f} | {pct_ms(latencies, 0.5):.1f} | "
                    f"{pct_ms(latencies, 0.99):.1f} |")
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--per-agent", type=int, default=20)
    parser.add_argument("--cpu", default="1", help="each pod's cpu for sections 1 and 2")
    parser.add_argument("--fleet-cpu", default="200m", help="each pod's cpu for section 3")
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--claims", action="store_true", help="the claim mode's sections instead")
    parser.add_argument("--claim-rounds", type=int, default=50)
    parser.add_argument("--cold-rounds", type=int, default=20)
    parser.add_argument("--resume-rounds", type=int, default=5)
    parser.add_argument("--skip", nargs="*", default=[], help="claim sections left out: first suspend N per")
    parser.add_argument("--fleet", type=int, default=32)
    parser.add_argument("--claim-cpu", default="500m", help="each claimed pod's cpu (first calls, per call)")
    parser.add_argument("--warm", type=int, default=2, help="the warm pool's size for the first calls")
    parser.add_argument("--fleet-claim-cpu", default="20m", help="each pod's cpu when --fleet claim at once")
    args = parser.parse_args()
    if not os.environ.get("KUBECONFIG"):
        sys.exit("kube_bench: KUBECONFIG is not set (eval \"$(bash scripts/kube-test-env.sh)\")")
    if args.claims:
        from kube_claims_bench import claim_sections

        await claim_sections(Fleet, args)
        return
    with tempfile.TemporaryDirectory(prefix="guilds-kube-bench-") as tmp:
        root = Path(tmp)
        async with Store(f"sqlite:///{root}/guilds.db") as store:
            fleet = Fleet(root, store, args.cpu)
            try:
                print("### First call of a new agent\n")
                print(await first_calls(fleet, args.rounds, docker=not args.no_docker))
                await fleet.close()
                print("\n### Per call\n")
                print(await per_call(fleet, args.calls))
                await fleet.close()
                print(f"\n### {args.agents} agents at once (each pod {args.fleet_cpu} cpu)\n")
                print(await agents_at_once(fleet, args.agents, args.per_agent, args.fleet_cpu))
            finally:
                await fleet.close()


if __name__ == "__main__":
    asyncio.run(main())
