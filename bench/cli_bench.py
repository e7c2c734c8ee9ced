"""A warm `guilds call shell '{"command": "true"}'` as a process, against its floor.

Run: .venv/bin/python bench/cli_bench.py [--rounds N]

The floor is ``python -c "import sqlalchemy.ext.asyncio"`` with the same
interpreter: the run record's own library, what any process that records a
call must load. One warm-up call first (it builds the helpers into the data
folder, once per installed version, makes the record, and caches the bytecode
of an editable install as pip does for an installed one); then rounds of one
of each, the order turning, so a shared machine's load falls on both alike.
Reported: the median wall time of each, and the median of the per-round
ratio call / floor. `guilds call` ends with ``os._exit`` once its output is
flushed (no interpreter teardown); the floor does not, so the ratio is also
given against the floor ending the same way. The sandbox is ``local``: the
figure is guilds' own cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON = sys.executable
GUILDS = str(Path(PYTHON).with_name("guilds"))
AIM = 1.3


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def measure(rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "agent.toml")
        config.write_text('[agent]\nhome = "home"\nsandbox = "local"\nmax_tool_calls = 100000\n')
        env = {**os.environ, "GUILDS_DATA": f"{tmp}/data"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached, as an installed package has it
        argvs = {
            "guilds call": [GUILDS, "call", "shell", '{"command": "true"}', "--config", str(config), "--run", "b"],
            "floor": [PYTHON, "-c", "import sqlalchemy.ext.asyncio"],
            "floor, no teardown": [PYTHON, "-c", "import sqlalchemy.ext.asyncio, os; os._exit(0)"],
        }
        timed(argvs["guilds call"], env)
        times: dict[str, list[float]] = {name: [] for name in argvs}
        for i in range(rounds):
            names = list(argvs)
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                times[name].append(timed(argvs[name], env))
        return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    times = measure(args.rounds)
    for name, walls in times.items():
        print(f"{name:20} median {statistics.median(walls):6.0f} ms")
    for floor in ("floor", "floor, no teardown"):
        ratio = statistics.median(c / f for c, f in zip(times["guilds call"], times[floor], strict=True))
        print(f"ratio call / {floor}: median {ratio:.2f} (aim <= {AIM}), rounds {args.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
