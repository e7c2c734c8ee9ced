"""A process in the sandbox that writes into the resident helper's stdout without a
newline (a command of the same uid, through /proc/<pid>/fd/1) ends that channel
with an error instead of growing the orchestrator's memory; the next call makes
the channel again. Real processes on the local backend; the orchestrator's memory
is its own process's peak RSS. (The E2B process service's reader drops such a
line instead: tests/test_e2b_bounds.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import pytest

from guilds.limits import CHANNEL_LINE_MAX_BYTES
from guilds.sandbox.process_channel import LineTooLong, LocalProcess, read_lines

FLOOD = "head -c 268435456 /dev/zero > /proc/{pid}/fd/1"
"""256 MiB without a newline into a process's stdout."""
GROWTH_MAX_KIB = 40 * 1024
"""The orchestrator's peak RSS may grow this much while the flood runs: the bound
(CHANNEL_LINE_MAX_BYTES, 8 MiB) and the reads around it, far below the 256 MiB."""


def lines_of(script: str, max_bytes: int) -> list[bytes]:
    process = LocalProcess(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd=None)
    try:
        return list(read_lines(process, max_bytes))
    finally:
        process.close()


def test_lines_come_whole_across_reads_up_to_the_bound():
    script = "printf 'a\\n\\nb'; head -c 1000 /dev/zero | tr '\\0' x; printf '\\nlast'"
    assert lines_of(script, 1001) == [b"a", b"", b"b" + b"x" * 1000]  # an unended last line is dropped


def test_a_line_one_byte_past_the_bound_closes_the_channel():
    assert lines_of("head -c 1000 /dev/zero | tr '\\0' x; echo", 1000) == [b"x" * 1000]
    with pytest.raises(LineTooLong, match="more than 999 bytes without a newline"):
        lines_of("head -c 1000 /dev/zero | tr '\\0' x; echo", 999)


def test_megabytes_without_a_newline_hold_no_more_than_the_bound():
    process = LocalProcess(["bash", "-c", "head -c 67108864 /dev/zero"], env={"PATH": "/usr/bin:/bin"}, cwd=None)
    tracemalloc.start()
    try:
        with pytest.raises(LineTooLong):
            list(read_lines(process, 1024 * 1024))
        _, peak = tracemalloc.get_traced_memory()
        writer_ended = process._proc.poll() is not None  # the channel closed: not read on
    finally:
        tracemalloc.stop()
        process.close()
    assert peak < 3 * 1024 * 1024
    assert writer_ended


ORCHESTRATOR = r"""
import asyncio, json, sys, tempfile
from pathlib import Path
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.toolbox import Toolbox

def peak_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

async def resident(toolbox, flood):
    await toolbox.call("r", "shell", {"command": "true"})
    pid = (await toolbox.transport.opened()).pid
    before = peak_kib()
    flooded = await toolbox.call("r", "shell", {"command": flood.format(pid=pid)})
    grew = peak_kib() - before
    after = await toolbox.call("r", "shell", {"command": "echo again"})
    return {"flood": flooded.text, "flood_error": flooded.is_error, "grew_kib": grew, "after": after.text}

async def main(flood):
    root = Path(tempfile.mkdtemp())
    (root / "home").mkdir()
    settings = parse_settings({"agent": {"id": "flood", "home": str(root / "home"), "sandbox": "local",
                                         "transport": "resident"}}, root, env={})
    async with Store(f"sqlite:///{root}/guilds.db") as store:
        toolbox = Toolbox(settings, get_sandbox(settings, root / "data"), store)
        try:
            print(json.dumps(await resident(toolbox, flood)))
        finally:
            await toolbox.close()

asyncio.run(main(sys.argv[1]))
"""


def orchestrate() -> dict:
    done = subprocess.run([sys.executable, "-c", ORCHESTRATOR, FLOOD], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_flood_into_the_resident_helpers_stdout_ends_its_channel_and_the_next_call_opens_one():
    seen = orchestrate()
    assert seen["flood_error"]
    assert f"a line of more than {CHANNEL_LINE_MAX_BYTES} bytes without a newline" in seen["flood"]
    assert seen["grew_kib"] < GROWTH_MAX_KIB, seen
    assert seen["after"].startswith("again\n")
