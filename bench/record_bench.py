"""What knowing each running call's process costs the run record, per call.

Run: .venv/bin/python bench/record_bench.py [--calls N] [--url URL]

One run, one SQLite file (or $GUILDS_DATABASE_URL / --url): a call's two
transactions as ``Store.begin_call`` and ``Store.finish_call`` make them (the
call's ``owner`` set at its start, cleared at its end), against the floor: the
same statements without the owner (the run's seq, the call's insert, its
finish), run the same way (``Store._in_transaction``). The two take turns call by call, so a change in
the machine's load falls on both alike. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from guilds.record.statements import FINISH_CALL as _FINISH_CALL, INSERT_CALL as _INSERT_CALL  # noqa: E402
from guilds.record.store import Store


async def with_owner(store: Store, run: str) -> None:
    now = datetime.now(UTC)
    slot = await store.begin_call(run_id=run, agent_id="a", tool="shell", args={"command": "true"},
                                  call_id="c", started_at=now, budget=10**9)
    await store.finish_call(run_id=run, seq=slot.seq, text="ok", is_error=False, meta={}, cut=False,
                            finished_at=now, duration_ms=1, row="Run true")


async def floor(store: Store, run: str) -> None:
    """The same two transactions without the owner, run the way the Store runs its own."""
    now = datetime.now(UTC)

    def begin(conn):
        allocated = conn.execute(store._allocate, {"run_id": run, "agent_id": "a", "now": now, "budget": 10**9})
        _, seq, _, _ = allocated.one()
        conn.execute(_INSERT_CALL, {"run_id": run, "seq": seq, "call_id": "c", "tool": "shell",
                                    "args": {"command": "true"}, "counted": True, "status": "running",
                                    "started_at": now, "is_error": False, "cut": False})
        return seq

    seq = await store._in_transaction("a call's start", begin)
    await store._in_transaction("a call's end", lambda conn: conn.execute(_FINISH_CALL, {
        "k_run_id": run, "k_seq": seq, "text": "ok", "is_error": False, "meta": {}, "cut": False,
        "status": "done", "finished_at": now, "duration_ms": 1, "row": "Run true"}))


async def main(calls: int, url: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with Store(url or f"sqlite:///{tmp}/guilds.db") as store:
            times: dict[str, list[float]] = {"with owner": [], "floor": []}
            for i in range(calls):
                order = [("with owner", with_owner), ("floor", floor)][:: 1 if i % 2 else -1]
                for name, make in order:
                    t0 = time.perf_counter()
                    await make(store, f"bench-{name.replace(' ', '-')}")
                    times[name].append(time.perf_counter() - t0)
    mid = {name: statistics.median(t) * 1000 for name, t in times.items()}
    load = os.getloadavg()[0]
    print(f"{calls} calls each, taking turns; load average {load:.1f} on {os.cpu_count()} CPUs\n")
    print("| a call's record | median |\n| --- | --- |")
    for name, ms in mid.items():
        print(f"| {name} | {ms:.2f} ms |")
    print(f"\nwith owner / floor: **{mid['with owner'] / mid['floor']:.2f}x**")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--url", help="a database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.url or os.environ.get("GUILDS_DATABASE_URL")))
