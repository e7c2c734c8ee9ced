"""The claim mode's sections of bench/kube_bench.py (``--claims``): agent-sandbox's warm
pools against a pod made on first use, on the same cluster in the same run.

Every first call is a new agent's shell `true` through ``Toolbox.call`` (the run
record on SQLite, redaction, the pipeline), from making its toolbox to the answer:
for a claim, the claim made, adopted and bound, the pod's helpers checked, the
secrets file and repos.json written, the resident helper opened, the call answered.

Run alone (``python bench/kube_claims_bench.py``), the claim mode through the CLI
instead: each call a ``guilds call shell true`` process, against local's, the two
taking turns: a claimed agent's later calls (--cli-rounds), then new agents' first
calls from a warm pool of --cli-warm, one ready for each before each round
(--cli-first-rounds). --src runs the calls from another guilds source folder
(PYTHONPATH); --before adds that folder's claim-mode calls, taking turns with this
one's and local's in the same rounds (a before and an after at the same load).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kube_bench import IMAGE, NAMESPACE, first_call
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

    def timed(template: dict[str, Any]) -> bool:
        began = time.perf_counter()
        made = claimed(template)
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


# --- through the CLI: each call a process of its own -----------------------------------
CLI_MEMORY = "240Mi"
"""The CLI section's agents ask for a memory no other section does: their template is theirs."""
CLI_TIMEOUT_SECONDS = 300


def _cli_config(root: Path, agent: str, backend: str, args: argparse.Namespace) -> Path:
    path = root / f"{agent}.toml"
    home = "/home/agent" if backend == "kubernetes" else str(root / "homes" / agent)
    text = (f'[agent]\nid = "{agent}"\nhome = "{home}"\nsandbox = "{backend}"\nmax_tool_calls = 100000\n'
            'transport = "resident"\n')
    if backend == "kubernetes":
        text += (f'[kubernetes]\nnamespace = "{NAMESPACE}"\nimage = "{IMAGE}"\nmode = "claim"\nwarm = {args.cli_warm}\n'
                 f'cpu = "{args.claim_cpu}"\nmemory = "{CLI_MEMORY}"\nhome_size = "1Gi"\n')
    path.write_text(text)
    return path


def _cli_call(config: Path, env: dict[str, str]) -> float:
    """One `guilds call shell true` process, to its exit: seconds."""
    argv = [sys.executable, "-m", "guilds.fronts.cli", "call", "shell", '{"command": "true"}', "--config",
            str(config), "--run", f"bench-{config.stem}"]
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=CLI_TIMEOUT_SECONDS, check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"guilds call failed ({done.returncode}): {done.stderr.decode(errors='replace')[-600:]}")
    return took


def _custom(admin: bool = False) -> Any:
    """agent-sandbox's objects, as the orchestrator (admin: as the cluster's admin, whose
    kubeconfig lies beside the orchestrator's on the test cluster)."""
    from kubernetes import client, config

    from guilds.sandbox.kubernetes import kube_cluster

    if admin:
        path = Path(os.environ["KUBECONFIG"]).with_name("admin.kubeconfig")
        return client.CustomObjectsApi(config.new_client_from_config(str(path)))
    return client.CustomObjectsApi(kube_cluster.connect().api_client)


def _cli_pool() -> str:
    """The CLI section's template (and pool): the one of CLI_MEMORY."""
    items = _custom().list_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, NAMESPACE, claims.TEMPLATES,
                                                    label_selector=claims.LABEL_TEMPLATE)["items"]
    ours = sorted((item["metadata"]["creationTimestamp"], item["metadata"]["name"]) for item in items
                  if item["spec"]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == CLI_MEMORY
                  and not item["metadata"].get("deletionTimestamp"))
    if not ours:
        raise LookupError(f"no template of memory {CLI_MEMORY}")
    return str(ours[-1][1])  # the newest: one of an earlier run may still be going


def _cli_pool_ready(pool: str, ready: int = 1) -> None:
    deadline = time.monotonic() + POOL_WAIT_SECONDS
    while time.monotonic() < deadline:
        got = _custom().get_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, NAMESPACE, claims.POOLS, pool)
        if int((got.get("status") or {}).get("readyReplicas") or 0) >= ready:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the warm pool {pool} had not {ready} ready sandboxes after {POOL_WAIT_SECONDS} s")


def _cli_clean(agents: list[str], pool: str | None) -> None:
    """Delete the agents' claims, then the pool and template (when named)."""
    from kubernetes.client import ApiException

    from guilds.sandbox.kubernetes import kube_spec as spec

    custom = _custom(admin=True)
    doomed = [(claims.CLAIMS, spec.object_name(a)) for a in agents]
    doomed += [(claims.POOLS, pool), (claims.TEMPLATES, pool)] if pool else []
    for plural, name in doomed:
        try:
            custom.delete_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, NAMESPACE, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _pair(rounds: int, make: Any, between: Any = None) -> dict[str, list[float]]:
    """rounds of `guilds call`s, one of each name make(i) gives ({name: (config, env)}),
    the order turning each round; between(i) before each round (not timed)."""
    times: dict[str, list[float]] = {}
    for i in range(rounds):
        if between is not None:
            between(i)
        configs = make(i)
        names = list(configs)
        for name in names[i % len(names):] + names[: i % len(names)]:
            times.setdefault(name, []).append(_cli_call(*configs[name]))
    return times


def _mode_envs(env: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The claim mode's calls by name: this source's ("claim"), and --before's ("before")."""
    envs = {"claim": env}
    if args.before:
        envs["before"] = {**env, "PYTHONPATH": args.before}
    return envs


def cli_sections(args: argparse.Namespace) -> str:
    """A claimed agent's later calls and new agents' first calls, each a `guilds call`
    process, interleaved with local's (--src: the guilds source the calls run; --before:
    another source's claim-mode calls taking turns with them, each its own agent)."""
    with tempfile.TemporaryDirectory(prefix="guilds-kube-cli-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "GUILDS_DATA": str(root / "data")}
        if args.src:
            env["PYTHONPATH"] = args.src
        envs = _mode_envs(env, args)
        agents: list[str] = []
        later = {"local": (_cli_config(root, "local-later", "local", args), env)}
        for name, mode_env in envs.items():
            agents.append(f"cs{secrets.token_hex(3)}")
            later[name] = (_cli_config(root, agents[-1], "kubernetes", args), mode_env)
            _cli_call(*later[name])  # the template, the pool (once), a claim
        pool = _cli_pool()
        kept = len(agents)
        try:
            _cli_call(*later["local"])
            later_times = _pair(args.cli_rounds, lambda i: later)
            _cli_clean(agents, None)  # their pods' cpu back to the node, for the pool's

            def fresh(i: int) -> dict[str, tuple[Path, dict[str, str]]]:
                made = {"local": (_cli_config(root, f"lf{i}{secrets.token_hex(3)}", "local", args), env)}
                for name, mode_env in envs.items():
                    agents.append(f"cf{i}{secrets.token_hex(3)}")
                    made[name] = (_cli_config(root, agents[-1], "kubernetes", args), mode_env)
                return made

            def between(i: int) -> None:  # the last round's new agents give their claims back; sandboxes wait
                _cli_clean(agents[kept:], None)
                _cli_pool_ready(pool, len(envs))

            first_times = _pair(args.cli_first_rounds, fresh, between)
        finally:
            _cli_clean(agents, pool)
    return _cli_rows(later_times, first_times, args)


def _cli_rows(later_times: dict[str, list[float]], first_times: dict[str, list[float]],
              args: argparse.Namespace) -> str:
    rows = ["| `guilds call shell true`, a process each | calls | p50 ms | p99 ms | against local, p50 |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for title, times in (("a later call", later_times), (f"a new agent's first call (pool of {args.cli_warm})",
                                                         first_times)):
        local = pct_ms(times["local"], 0.5)
        for name, found in times.items():
            p50 = pct_ms(found, 0.5)
            against = "" if name == "local" else (f"{p50 / local:.2f}×" if title.startswith("a later") else
                                                   f"{p50 - local:+.0f} ms")
            rows.append(f"| {title}: {name} | {len(found)} | {p50:.0f} | {pct_ms(found, 0.99):.0f} | {against} |")
    later_local, first_local = pct_ms(later_times["local"], 0.5), pct_ms(first_times["local"], 0.5)
    rows += [""] + [f"{name}: a later call {pct_ms(later_times[name], 0.5):.0f} / {later_local:.0f} ms = "
                    f"{pct_ms(later_times[name], 0.5) / later_local:.2f}× local's (aim ≤ 1.2×); a new agent's "
                    f"first call from the pool {pct_ms(first_times[name], 0.5) - first_local:.0f} ms past "
                    "local's (aim ≤ 1000 ms)." for name in later_times if name != "local"]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description="The claim mode through the CLI against local, interleaved.")
    parser.add_argument("--cli-rounds", type=int, default=20, help="later calls of each")
    parser.add_argument("--cli-first-rounds", type=int, default=10, help="new agents' first calls of each")
    parser.add_argument("--cli-warm", type=int, default=2, help="the warm pool's size")
    parser.add_argument("--claim-cpu", default="500m", help="each claimed pod's cpu")
    parser.add_argument("--src", default="", help="the guilds source folder the calls run (default: this one)")
    parser.add_argument("--before", default="", help="another guilds source folder whose claim-mode calls take "
                        "turns with this one's (its own agents; the same image)")
    print(cli_sections(parser.parse_args()), flush=True)


if __name__ == "__main__":
    main()
