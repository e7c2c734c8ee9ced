"""A replica's death, measured: runs calling through the Service of 3 replicas of
``guilds serve`` on the test cluster while one replica's serve process is SIGKILLed
every --every seconds (tests/failover_kit.py, the code of tests/test_failover.py at
full size: 20 runs x 50 calls, one in ten a long command, one in ten a background one).

    python bench/failover_bench.py [--runs 20] [--calls 50] [--every 10]

Needs the test cluster and its record (``eval "$(bash scripts/kube-test-env.sh)"``,
``GUILDS_TEST_POSTGRES_URL``), run as the one who may read /proc of its containers.
Prints the counts (calls made, answered, lost errors, other errors, run twice) and the
failover time (a call's first broken attempt to its answer from another replica), with
the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import deploy_kit  # noqa: E402 - the tests' kit, beside this bench
import failover_kit  # noqa: E402


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} CPUs"


async def measure(deployment: deploy_kit.Deployment, args: argparse.Namespace) -> list[str]:
    calls, killer, seconds = await failover_kit.storm(deployment, args.runs, args.calls, args.every)
    counts = await failover_kit.check(deployment, calls, killer)
    head = (f"{args.runs} runs x {args.calls} calls through the Service of 3 replicas, one SIGKILLed every "
            f"{args.every:g} s: {seconds:.0f} s")
    lines = [head, *counts.lines(), *[f"  other error: {e}" for e in counts.errors[:10]]]
    lines += [f"  run twice: {t}" for t in counts.ran_twice[:10]]
    lines += [f"  answered, not run: {t}" for t in counts.not_run[:10]]
    lines += [f"  recorded otherwise: {t}" for t in counts.wrong_status[:10]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--sandbox-cpu", default="200m", help="the sandbox's CPU (requests and limits)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, \
            deploy_kit.deployed(Path(tmp), replicas=3, sandbox_cpu=args.sandbox_cpu) as deployment:
        deployment.scale(3)
        before = load()
        lines = asyncio.run(measure(deployment, args))
        after = load()
    sys.stdout.write("\n".join([*lines, f"before: {before}; after: {after}"]) + "\n")


if __name__ == "__main__":
    main()
