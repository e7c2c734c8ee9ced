"""A call cancelled while asyncio still connects its process's pipes: the whole group stops.

asyncio's own answer to a cancel in that window is a SIGKILL to the leader alone and a wait
for the pipes its children hold, as long as they run. The test holds the loop right after the
fork, so the pipes cannot connect before the cancel comes.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

from guilds.sandbox._spawn import run_process


def _children_running(name: bytes) -> list[int]:
    """Pids of this process's children whose program is name."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit():
                continue
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
            if ppid == os.getpid() and Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0] == name:
                found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def _running(argv: list[str]) -> list[int]:
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                found.append(int(entry))
        except OSError:
            pass
    return found


async def test_a_cancel_while_the_pipes_connect_stops_the_whole_group(tmp_path):
    length = f"9{secrets.randbelow(10**6)}.5"  # this run's own sleeps, told apart from any other
    bye = tmp_path / "bye"
    script = f'trap "echo bye > {bye}; exit 0" TERM; sleep {length} & sleep {length} & wait'
    task = asyncio.create_task(run_process(["bash", "-c", script], env=dict(os.environ), timeout=30))
    for _ in range(10_000):  # step the loop only until the fork, then hold it
        await asyncio.sleep(0)
        if _children_running(b"bash"):
            break
    deadline = time.monotonic() + 10
    while len(_running(["sleep", length])) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251 - blocking on purpose: the pipes must not connect meanwhile
    assert len(_running(["sleep", length])) == 2
    task.cancel()
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=10)
    except asyncio.CancelledError:
        pass
    assert task.cancelled()
    deadline = time.monotonic() + 5
    while _running(["sleep", length]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _running(["sleep", length])
    assert bye.read_text() == "bye\n"  # SIGTERM first, to the group
