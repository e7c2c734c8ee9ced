"""The memory of idle agents: N agents made on demand on bwrap, each with its egress proxy.

Run (as root, where bubblewrap works):
    .venv/bin/python bench/idle_agents_bench.py [-n 1000] [--settle 20] [--floor-mib 3072] [--compare] [--e2b]
        [--json out.json]

One server (``guilds.open`` in this process) serves a template ``idle``: bwrap,
``transport = "resident"``, ``network`` a list of one host (so each agent has an
egress proxy). The bench makes N agents of it, one after another, each followed
by one ``shell`` call (``true``), so each agent's init, resident helper and
proxy have been up; it then waits ``--settle`` seconds with no call (the agents
are idle) and reads the PSS (``/proc/<pid>/smaps_rollup``) of every process each
agent holds, by part:

    bwrap     bubblewrap's own process on the host (the parent of the init)
    init      the sandbox's pid 1 (it runs the egress relay too)
    helper    the resident helper inside (``guilds-code serve`` and its waiting workers;
              asleep, the bash waiter in its process, whose command line names it too)
    nsenter   the resident helper's entry on the host (``nsenter``, the helper's parent's parent)
    proxy     the agent's egress proxy on the host (its pidfile's process)
    other     any other process in the agent's pid namespace

Per part: processes per agent, PSS mean and median per agent, USS (private
pages: what an agent costs however many agents there are) mean per agent, and
USS against the floor, a bare ``python3 -I -S`` started in the same run (the
least a Python process costs). PSS divides each shared page among the
processes that map it, so it falls toward USS as N grows. Also: this server
process's own growth per agent (its PSS after the first agent and after the
last), and how many idle agents fit in 16 GiB (16 GiB over the PSS per agent
plus the server's growth per agent).

With ``--compare`` every other resident helper opened is kept awake (``--sleep-idle``
604800, as the helper was before it could sleep): both arms are made interleaved and
measured in the same run, each in a table of its own, with the first calls after
idle on WAKE_AGENTS agents of each (``wake_times``).

With ``--e2b`` the agents are E2B sandboxes instead: the unmodified E2B SDK's
``Sandbox.create()`` then ``commands.run("true")`` against a ``guilds serve --e2b``
the bench starts (its agent bwrap, ``transport = "resident"``, ``network`` a list of
one host), so each agent also holds its process service (part ``envd``: ``guilds-code
envd``, asleep the bash waiter in its process). With ``--compare`` two servers run,
sandboxes made on them in turn: one as served by default, one with
``--e2b-sleep-idle 0`` (the process service never sleeps, as before it could); the
first calls after idle are ``commands.run("true")`` twice, then ``files.read`` twice,
on WAKE_AGENTS sandboxes of each arm in turn.

Making stops early when the machine's MemAvailable falls under ``--floor-mib``
(the run says so and reports the agents it made). Every agent is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import guilds  # noqa: E402
from guilds.sandbox.bwrap.bwrap_argv import sandbox_python, unavailable  # noqa: E402

PARTS = ("bwrap", "init", "helper", "envd", "nsenter", "proxy", "other")
MIB = 1024.0
BUDGET_KIB = 16 * 1024 * 1024
SETTINGS = """\
[agent]
id = "idle-bench"
home = "home"
sandbox = "local"

[templates.idle.agent]
home = "template-home"
sandbox = "bwrap"
transport = "resident"
network = ["idle-bench.test"]

[agents]
max = {n}
max_per_owner = {n}
"""


def memory_kib(pid: int) -> tuple[int, int] | None:
    """(PSS, USS) of pid in KiB from its smaps_rollup; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0])
    return fields.get("Pss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / MIB
    return 0.0


@dataclass
class Proc:
    pid: int
    ppid: int
    argv: list[str]
    pidns: str


def host_processes() -> dict[int, Proc]:
    """Every process on the host: its parent, argv and pid namespace."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
            argv = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
            pidns = os.readlink(f"/proc/{name}/ns/pid")
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        out[int(name)] = Proc(int(name), ppid, [a for a in argv if a], pidns)
    return out


@dataclass
class AgentMemory:
    """One agent's processes by part: part -> [(pid, pss KiB, uss KiB)]."""

    parts: dict[str, list[tuple[int, int, int]]] = field(default_factory=lambda: {p: [] for p in PARTS})

    def pss(self, part: str | None = None) -> int:
        return sum(p for name in ([part] if part else PARTS) for _, p, _ in self.parts[name])

    def uss(self, part: str | None = None) -> int:
        return sum(u for name in ([part] if part else PARTS) for _, _, u in self.parts[name])


def descendants(procs: dict[int, Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += children.get(pid, [])
    return out


def agent_memory(procs: dict[int, Proc], data: Path, agent_id: str) -> AgentMemory:
    """The processes agent_id holds, by part (see the module docstring), with their memory."""
    record = json.loads((data / "sandboxes" / f"{agent_id}.json").read_text())
    init = record["pid"]
    found = AgentMemory()
    pids: dict[str, set[int]] = {p: set() for p in PARTS}
    pids["bwrap"].add(record["outer"][0])
    pids["init"].add(init)
    pidns = procs[init].pidns if init in procs else None
    for p in procs.values():
        if p.pid == init:
            continue
        if pidns is not None and p.pidns == pidns:
            ours = any(a.endswith("guilds-code") for a in p.argv)
            part = "helper" if ours and "serve" in p.argv else "envd" if ours and "envd" in p.argv else "other"
            pids[part].add(p.pid)
        elif p.argv[:1] and p.argv[0].endswith("nsenter") and f"--target={init}" in p.argv:
            pids["nsenter"].add(p.pid)
    proxy_pid = (data / "egress" / agent_id / "proxy.pid").read_text().split()[0] \
        if (data / "egress" / agent_id / "proxy.pid").exists() else None
    if proxy_pid:
        pids["proxy"] |= descendants(procs, int(proxy_pid))
    for part, members in pids.items():
        for pid in sorted(members):
            got = memory_kib(pid)
            if got is not None:
                found.parts[part].append((pid, *got))
    return found


WAKE_AGENTS = 20
ASK_PROXY = ("python3 -c 'import socket; c = socket.create_connection((\"127.0.0.1\", 3128)); "
             "c.sendall(b\"CONNECT unlisted.test:443 HTTP/1.1\\r\\n\\r\\n\"); print(c.recv(12).decode())'")


WAKE_TURNS = (("helper", "true"), ("helper again", "true"), ("proxy", ASK_PROXY), ("proxy again", ASK_PROXY))
"""The calls wake_times makes on each idle agent, in turn: the first wakes the resident
helper (and a worker), the third the proxy; each second finds what the first woke up."""


async def wake_times(server, agent_ids: list[str]) -> list[tuple[float, ...]]:
    """For each agent: (ms) each call of WAKE_TURNS, made one after another."""
    out = []
    for agent_id in agent_ids:
        agent = await server.made_agent(agent_id)
        times = []
        for turn, command in WAKE_TURNS:
            began = time.perf_counter()
            result = await agent.call(f"wake-{agent_id}-{turn.replace(' ', '-')}", "shell", {"command": command})
            times.append((time.perf_counter() - began) * 1000)
            if result.is_error or (command == ASK_PROXY and "403" not in result.text):
                raise SystemExit(f"agent {agent_id}: the {turn} call failed: {result.text}")
        out.append(tuple(times))
    return out


def floor_kib() -> tuple[int, int]:
    """(PSS, USS) of a bare ``python3 -I -S`` (the sandbox's python), started now."""
    python = sandbox_python() or sys.executable
    bare = subprocess.Popen([python, "-I", "-S", "-c", "import time\ntime.sleep(60)"])
    try:
        time.sleep(1.0)
        return memory_kib(bare.pid) or (0, 0)
    finally:
        bare.kill()
        bare.wait()


ARMS = ("asleep", "awake")
KEPT_AWAKE = ("--sleep-idle", "604800")
"""What the resident helpers of the ``awake`` arm are started with: they never sleep
(as before the helper could), so both arms are measured in one run."""


def split_arms(compare: bool) -> dict[str, str]:
    """Have the resident helpers opened from now on alternate between the arms (every
    other one kept awake) when compare, else all ``asleep``; the arm of each agent id."""
    from guilds.toolbox import transport

    arms: dict[str, str] = {}
    plain = transport.serve_argv

    def serve_argv(sandbox, max_in_flight):
        agent_id = sandbox.settings.id
        arm = arms.setdefault(agent_id, ARMS[len(arms) % 2] if compare else ARMS[0])
        return [*plain(sandbox, max_in_flight), *(KEPT_AWAKE if arm == "awake" else ())]

    transport.serve_argv = serve_argv
    return arms


async def run(n: int, settle: float, floor_mib: float, folder: Path, compare: bool = False) -> dict:
    arms = split_arms(compare)
    (folder / "template-home").mkdir(parents=True, exist_ok=True)
    settings = folder / "server.toml"
    settings.write_text(SETTINGS.format(n=max(n, 1)))
    settings.chmod(0o600)
    data = folder / "data"
    made: list[str] = []
    stopped_early = None
    async with guilds.open(settings, data_dir=data) as server:
        try:
            started = time.monotonic()
            for i in range(n):
                if available_mib() < floor_mib:
                    stopped_early = f"MemAvailable under {floor_mib:.0f} MiB after {i} agents"
                    break
                agent = await server.make_agent("idle")
                made.append(agent.id)
                result = await agent.call(f"run-{i}", "shell", {"command": "true"})
                if result.is_error:
                    raise SystemExit(f"agent {agent.id}: the shell call failed: {result.text}")
                if i == 0:
                    server_first = memory_kib(os.getpid())
                if (i + 1) % 100 == 0:
                    print(f"  {i + 1} agents, {time.monotonic() - started:.0f} s, "
                          f"MemAvailable {available_mib():.0f} MiB", file=sys.stderr, flush=True)
            make_seconds = time.monotonic() - started
            server_last = memory_kib(os.getpid())
            print(f"  made {len(made)} in {make_seconds:.0f} s; idle for {settle:g} s", file=sys.stderr, flush=True)
            await asyncio.sleep(settle)
            procs = host_processes()
            memories = [agent_memory(procs, data, agent_id) for agent_id in made]
            floor = floor_kib()
            wakes = {arm: await wake_times(server, [a for a in made if arms.get(a) == arm][:WAKE_AGENTS])
                     for arm in ARMS}
        finally:
            removing = time.monotonic()
            for agent_id in made:
                try:
                    await server.remove_agent(agent_id)
                except Exception as exc:  # noqa: BLE001 - go on removing the rest
                    print(f"  {agent_id}: not removed: {exc}", file=sys.stderr)
            print(f"  removed {len(made)} in {time.monotonic() - removing:.0f} s", file=sys.stderr)
    growth = (server_last[0] - server_first[0]) / max(len(made) - 1, 1) if len(made) > 1 else 0.0
    return {"n": len(made), "asked": n, "stopped_early": stopped_early, "settle_s": settle,
            "make_s": round(make_seconds, 1), "floor": {"pss_kib": floor[0], "uss_kib": floor[1]},
            "server": {"first_pss_kib": server_first[0], "last_pss_kib": server_last[0],
                       "growth_kib_per_agent": round(growth, 1)},
            "wakes": wakes, "agents": [{"arm": arms.get(agent_id, "?"), **{part: m.parts[part] for part in PARTS}}
                                       for agent_id, m in zip(made, memories)]}


E2B_SETTINGS = """\
transport = "resident"
network = ["idle-bench.test"]

[agents]
max = {n}
max_per_owner = {n}
"""
E2B_ARMS = {"asleep": (), "awake": ("--e2b-sleep-idle", "0")}
"""The options of each arm's server: its process services asleep when idle (the default), or never."""
E2B_WAKE_TURNS = ("run", "run again", "read", "read again")


def e2b_wakes(boxes: list) -> list[tuple[float, ...]]:
    """For each idle sandbox: (ms) commands.run("true") twice, then files.read twice."""
    out = []
    for box in boxes:
        times = []
        for turn in E2B_WAKE_TURNS:
            began = time.perf_counter()
            if turn.startswith("run"):
                ok = box.commands.run("true").exit_code == 0
            else:
                ok = box.files.read("probe.txt") == "probe"
            times.append((time.perf_counter() - began) * 1000)
            if not ok:
                raise SystemExit(f"sandbox {box.sandbox_id}: the {turn} call failed")
        out.append(tuple(times))
    return out


def e2b_agents(procs: dict[int, Proc], data: Path) -> list[AgentMemory]:
    """The memory of every agent of a server's data folder that holds a process service."""
    found = []
    for record in sorted((data / "sandboxes").glob("*.json")):
        memory = agent_memory(procs, data, record.stem)
        if memory.parts["envd"]:
            found.append(memory)
    return found


def run_e2b(n: int, settle: float, floor_mib: float, folder: Path, compare: bool) -> dict:
    """The E2B mode (the module docstring): one server per arm, sandboxes made on them in turn."""
    sys.path.insert(0, str(ROOT / "tests"))
    from e2b import Sandbox
    from e2b_kit import e2b_server

    arms = ARMS if compare else ARMS[:1]
    stopped_early, boxes = None, {arm: [] for arm in arms}
    for arm in arms:
        (folder / arm).mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        servers = {arm: stack.enter_context(e2b_server(folder / arm, "bwrap", E2B_SETTINGS.format(n=max(n, 1)),
                                                       options=E2B_ARMS[arm])) for arm in arms}
        started = time.monotonic()
        server_first = {}
        for i in range(n):
            if available_mib() < floor_mib:
                stopped_early = f"MemAvailable under {floor_mib:.0f} MiB after {i} agents"
                break
            arm = arms[i % len(arms)]
            env = servers[arm].env()
            box = Sandbox.create(timeout=3600, api_key=env["E2B_API_KEY"], api_url=env["E2B_API_URL"],
                                 sandbox_url=env["E2B_SANDBOX_URL"])
            boxes[arm].append(box)
            box.files.write("probe.txt", "probe")
            if box.commands.run("true").exit_code != 0:
                raise SystemExit(f"sandbox {box.sandbox_id}: the first command failed")
            server_first.setdefault(arm, memory_kib(servers[arm].pid))
            if (i + 1) % 50 == 0:
                print(f"  {i + 1} sandboxes, {time.monotonic() - started:.0f} s, "
                      f"MemAvailable {available_mib():.0f} MiB", file=sys.stderr, flush=True)
        make_seconds = time.monotonic() - started
        server_last = {arm: memory_kib(servers[arm].pid) for arm in server_first}
        made = sum(len(b) for b in boxes.values())
        print(f"  made {made} in {make_seconds:.0f} s; idle for {settle:g} s", file=sys.stderr, flush=True)
        time.sleep(settle)
        procs = host_processes()
        memories = {arm: e2b_agents(procs, folder / arm / "data") for arm in arms}
        floor = floor_kib()
        wakes: dict[str, list] = {arm: [] for arm in arms}
        for i in range(WAKE_AGENTS):  # the arms in turn
            for arm in arms:
                wakes[arm] += e2b_wakes(boxes[arm][i:i + 1])
        for box in (b for arm in arms for b in boxes[arm]):
            box.kill()
    growth = {arm: (server_last[arm][0] - server_first[arm][0]) / max(len(boxes[arm]) - 1, 1)
              for arm in server_first}
    return {"n": made, "asked": n, "stopped_early": stopped_early, "settle_s": settle, "e2b": True,
            "make_s": round(make_seconds, 1), "floor": {"pss_kib": floor[0], "uss_kib": floor[1]},
            "server": {arm: {"first_pss_kib": server_first[arm][0], "last_pss_kib": server_last[arm][0],
                             "growth_kib_per_agent": round(growth[arm], 1)} for arm in server_first},
            "wakes": wakes, "agents": [{"arm": arm, **{part: m.parts[part] for part in PARTS}}
                                       for arm in arms for m in memories[arm]]}


def e2b_summary(result: dict) -> str:
    """The Markdown tables of an E2B run: one per arm (its own server's growth in it)."""
    floor_uss = result["floor"]["uss_kib"]
    lines = [f"{len(result['agents'])} idle E2B sandboxes (asked {result['asked']}"
             f"{'; ' + result['stopped_early'] if result['stopped_early'] else ''}), "
             f"made in {result['make_s']:g} s, measured after {result['settle_s']:g} s idle"]
    for arm, server in result["server"].items():
        agents = [AgentMemory({p: [tuple(x) for x in a[p]] for p in PARTS}) for a in result["agents"]
                  if a["arm"] == arm]
        if not agents:
            continue
        lines += ["", f"{len(agents)} sandboxes, process service {E2B_ARM_SAYS[arm]}:", "",
                  *arm_table(agents, floor_uss, server["growth_kib_per_agent"]),
                  f"- its server process: {server['growth_kib_per_agent'] / MIB:.3f} MiB more per sandbox"]
        wakes = result["wakes"].get(arm) or []
        if wakes:
            run, run_again, read, read_again = (statistics.median(w[i] for w in wakes) for i in range(4))
            lines.append(f"- on {len(wakes)} of these sandboxes, medians: `commands.run(\"true\")` {run:.0f} ms "
                         f"(what slept woken), then at once again {run_again:.0f} ms ({run / run_again:.2f}x); "
                         f"`files.read` {read:.0f} ms, again {read_again:.0f} ms")
    lines += ["", f"- bare `python3 -I -S` (the floor): PSS {result['floor']['pss_kib'] / MIB:.2f} MiB, "
              f"USS {floor_uss / MIB:.2f} MiB"]
    return "\n".join(lines)


E2B_ARM_SAYS = {"asleep": "asleep when idle (the default)", "awake": "kept awake (--e2b-sleep-idle 0)"}


def summary(result: dict) -> str:
    """The Markdown tables of a run's result: one per arm."""
    floor_uss = result["floor"]["uss_kib"]
    growth = result["server"]["growth_kib_per_agent"]
    by_arm: dict[str, list[AgentMemory]] = {}
    for a in result["agents"]:
        by_arm.setdefault(a.get("arm", ARMS[0]), []).append(AgentMemory({p: [tuple(x) for x in a[p]] for p in PARTS}))
    lines = [f"{len(result['agents'])} idle agents (asked {result['asked']}"
             f"{'; ' + result['stopped_early'] if result['stopped_early'] else ''}), "
             f"made in {result['make_s']:g} s, measured after {result['settle_s']:g} s idle"]
    for arm, agents in by_arm.items():
        lines += ["", f"{len(agents)} agents, resident helper {ARM_SAYS.get(arm, arm)}:", "",
                  *arm_table(agents, floor_uss, growth)]
        wakes = result.get("wakes") or {}
        lines += wake_line(wakes.get(arm) or [] if isinstance(wakes, dict) else wakes)
    lines += ["",
              f"- bare `python3 -I -S` (the floor): PSS {result['floor']['pss_kib'] / MIB:.2f} MiB, "
              f"USS {floor_uss / MIB:.2f} MiB",
              f"- the server process: PSS {result['server']['first_pss_kib'] / MIB:.1f} MiB after the first agent, "
              f"{result['server']['last_pss_kib'] / MIB:.1f} MiB after the last: {growth / MIB:.3f} MiB per agent"]
    return "\n".join(lines)


ARM_SAYS = {"asleep": "asleep when idle", "awake": "kept awake (--sleep-idle 604800)"}


def arm_table(agents: list[AgentMemory], floor_uss: int, growth: float) -> list[str]:
    """The table of one arm's agents by part, and what fits in 16 GiB."""
    lines = ["| part | processes / agent | PSS mean (MiB) | PSS median (MiB) | USS mean (MiB) | USS / bare python |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]

    def row(name: str, pss: list[int], uss: list[int], count: float) -> str:
        ratio = statistics.fmean(uss) / floor_uss if floor_uss else 0.0
        return (f"| {name} | {count:.2f} | {statistics.fmean(pss) / MIB:.2f} | {statistics.median(pss) / MIB:.2f} | "
                f"{statistics.fmean(uss) / MIB:.2f} | {ratio:.2f}x |")

    for part in PARTS:
        lines.append(row(part, [a.pss(part) for a in agents], [a.uss(part) for a in agents],
                         statistics.fmean(len(a.parts[part]) for a in agents)))
    lines.append(row("**agent**", [a.pss() for a in agents], [a.uss() for a in agents],
                     statistics.fmean(sum(len(a.parts[p]) for p in PARTS) for a in agents)))
    per_agent = statistics.fmean(a.pss() for a in agents) + max(growth, 0.0)
    return [*lines, "",
            f"- per idle agent, its processes and the server's growth: {per_agent / MIB:.2f} MiB; "
            f"in 16 GiB: {int(BUDGET_KIB // per_agent) if per_agent else 0} idle agents"]


def wake_line(wakes: list) -> list[str]:
    if not wakes or len(wakes[0]) != len(WAKE_TURNS):
        return []
    helper, helper_again, proxy, proxy_again = (statistics.median(w[i] for w in wakes) for i in range(4))
    return [f"- on {len(wakes)} of these agents, medians: a `true` call {helper:.0f} ms (what of the helper "
            f"slept woken), then at once again {helper_again:.0f} ms ({helper / helper_again:.2f}x); then a call "
            f"asking the proxy {proxy:.0f} ms (the proxy woken), then again {proxy_again:.0f} ms "
            f"({proxy / proxy_again:.2f}x)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100, help="agents to make (default 100)")
    parser.add_argument("--settle", type=float, default=45.0, help="seconds idle before measuring (default 45)")
    parser.add_argument("--floor-mib", type=float, default=3072.0,
                        help="stop making agents under this MemAvailable (default 3072)")
    parser.add_argument("--json", type=Path, help="write the raw result here too")
    parser.add_argument("--compare", action="store_true",
                        help="keep every other agent's resident helper awake, and report both arms")
    parser.add_argument("--e2b", action="store_true",
                        help="E2B sandboxes through the E2B SDK against a guilds serve --e2b (with --compare: "
                             "every other one's process service kept awake)")
    args = parser.parse_args()
    reason = unavailable()
    if os.geteuid() != 0 or reason is not None:
        print(f"idle_agents_bench: needs root and bubblewrap ({reason or 'not root'})", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="guilds-idle-"))
    try:
        if args.e2b:
            result = run_e2b(args.n, args.settle, args.floor_mib, folder, args.compare)
        else:
            result = asyncio.run(run(args.n, args.settle, args.floor_mib, folder, args.compare))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result))
    print(e2b_summary(result) if args.e2b else summary(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
