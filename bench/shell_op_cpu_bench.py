"""The helper's own CPU for a shell call of `true`, against a bare spawn of the same bash.

Run: .venv/bin/python bench/shell_op_cpu_bench.py [--calls N] [--rounds R] [--syscalls]

The shell op runs in this process, as a resident worker runs it (the shared
watchdog started, the request parsed, the envelope made), in a small
environment like a sandbox's; the floor is ``os.posix_spawn`` of `bash -c true`
and its ``waitpid``. What is timed is this process's CPU (``getrusage``, user and
system), not its wall time: bash's own CPU is its child's and counted in
neither, so the figure is what the helper adds around bash, and the machine's
load moves it far less than it moves a wall time. The two take turns, a block
of calls each, R rounds; medians of the rounds.

With --syscalls (strace on PATH), the system calls the helper's process makes
a call (bash's own not counted), counted by ``strace -c`` over N calls of each:
a figure the load does not move at all.

The script times the tree it sits in: copied into another checkout's bench/,
it times that tree, so a before and an after run one right after the other.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SANDBOX_LIKE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def measure(calls: int, rounds: int, only: str = "") -> None:
    """Runs in a child with the sandbox-like environment: prints the table's row values."""
    sys.path.insert(0, str(ROOT / "src"))
    from guilds_code import __main__ as helper, watchdog

    root = tempfile.mkdtemp(prefix="guilds-shell-op-bench-")
    os.environ["GUILDS_STATE_DIR"] = f"{root}/state"
    home = f"{root}/home"
    os.makedirs(home)
    watchdog.start()
    serial = iter(range(10**9))

    def op() -> None:
        i = next(serial)
        request = {"op": "shell", "args": {"command": "true"}, "run_id": "r1", "agent_id": "a1",
                   "call_id": f"c{i:012d}", "home": home, "cwd": home, "max_bytes": 20000, "seq": i,
                   "redact_env": []}
        helper.envelope(request, helper.dispatch_object)

    def spawn() -> None:
        os.waitpid(os.posix_spawn("/bin/bash", ["bash", "-c", "true"], os.environ), 0)

    for _ in range(20):
        op()
        spawn()
    if only:
        run = op if only == "op" else spawn
        os.kill(os.getpid(), signal.SIGSTOP)  # strace attaches here: the warm-up is not counted
        for _ in range(calls):
            run()
        return
    per_call: dict[str, list[float]] = {"op": [], "spawn": []}
    for _ in range(rounds):
        for name, run in (("op", op), ("spawn", spawn)):
            began = cpu_seconds()
            for _ in range(calls):
                run()
            per_call[name].append((cpu_seconds() - began) / calls * 1e6)
    op_us, spawn_us = statistics.median(per_call["op"]), statistics.median(per_call["spawn"])
    print(f"| {ROOT.name} | {op_us:.0f} | {spawn_us:.0f} | {op_us - spawn_us:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--syscalls", action="store_true", help="count system calls a call (strace)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure:
        measure(opts.calls, opts.rounds, opts.only)
        return
    if opts.syscalls:
        counts = {only: syscalls_a_call(only, opts.calls) for only in ("op", "spawn")}
        print("| tree | shell op, system calls a call | bare spawn | added by the helper |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| {ROOT.name} | {counts['op']:.0f} | {counts['spawn']:.0f} | {counts['op'] - counts['spawn']:.0f} |")
        return
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| tree | shell op, µs of CPU a call | bare spawn | added by the helper |")
    print("| --- | ---: | ---: | ---: |")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-I", "-S", __file__, "--measure", "--calls", str(opts.calls),
                    "--rounds", str(opts.rounds)], env=SANDBOX_LIKE_ENV, check=True)


def syscalls_a_call(only: str, calls: int) -> float:
    """strace -c's total over `calls` calls of `only` (op or spawn), the warm-up left out."""
    with tempfile.NamedTemporaryFile(prefix="guilds-strace-") as counts:
        child = subprocess.Popen([sys.executable, "-I", "-S", __file__, "--measure", "--calls", str(calls),
                                  "--only", only], env=SANDBOX_LIKE_ENV)
        while not _stopped(child.pid):
            if child.poll() is not None:
                raise SystemExit(f"the measuring process ended early ({child.returncode})")
        tracer = subprocess.Popen(["strace", "-c", "-o", counts.name, "-p", str(child.pid)],
                                  stderr=subprocess.DEVNULL)
        while "strace" not in _tracer_of(child.pid):
            pass
        os.kill(child.pid, signal.SIGCONT)
        child.wait()
        tracer.wait()
        total = re.search(rb"^100\.00\s+\S+\s+\S+\s+(\d+)", Path(counts.name).read_bytes(), re.M)
    if total is None:
        raise SystemExit("strace -c printed no total")
    return int(total.group(1)) / calls


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _tracer_of(pid: int) -> str:
    """The name of the process tracing pid, "" when none is."""
    tracer = re.search(r"^TracerPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    if tracer is None or tracer.group(1) == "0":
        return ""
    return Path(f"/proc/{tracer.group(1)}/comm").read_text().strip()


if __name__ == "__main__":
    main()
