"""The helper's own CPU for a shell call of `true`, against a bare spawn of the same bash.

Run: .venv/bin/python bench/shell_op_cpu_bench.py [--calls N] [--rounds R]

The shell op runs in this process, as a resident worker runs it (the shared
watchdog started, the request parsed, the envelope made), in a small
environment like a sandbox's; the floor is ``os.posix_spawn`` of `bash -c true`
and its ``waitpid``. What is timed is this process's CPU (``getrusage``, user and
system), not its wall time: bash's own CPU is its child's and counted in
neither, so the figure is what the helper adds around bash, and the machine's
load moves it far less than it moves a wall time. The two take turns, a block
of calls each, R rounds; medians of the rounds.

The script times the tree it sits in: copied into another checkout's bench/,
it times that tree, so a before and an after run one right after the other.
"""

from __future__ import annotations

import argparse
import os
import resource
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


def measure(calls: int, rounds: int) -> None:
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
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure:
        measure(opts.calls, opts.rounds)
        return
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| tree | shell op, µs of CPU a call | bare spawn | added by the helper |")
    print("| --- | ---: | ---: | ---: |")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-I", "-S", __file__, "--measure", "--calls", str(opts.calls),
                    "--rounds", str(opts.rounds)], env=SANDBOX_LIKE_ENV, check=True)


if __name__ == "__main__":
    main()
