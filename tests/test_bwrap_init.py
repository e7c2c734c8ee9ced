"""The bwrap sandbox's init (pid 1 inside, the egress relay in it): undumpable, so the
agent's processes of its uid cannot ptrace it nor read its memory or environment, and
no bigger than a bare interpreter's by much, since it imports only built-in modules.
Real bwrap as root (the agent's uid is then not the orchestrator's)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from guilds.config.settings import AgentSettings
from guilds.sandbox.bwrap.bwrap_argv import sandbox_python, unavailable
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox

NO_BWRAP = unavailable()
pytestmark = [pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None or os.geteuid() != 0,
                                                    reason=f"needs root and bwrap ({NO_BWRAP})")]


@pytest.fixture
async def box(tmp_path):
    settings = AgentSettings(id="init1", home=tmp_path / "home", sandbox="bwrap", network=False,
                             egress=("example.test",))
    sandbox = BwrapSandbox(settings, tmp_path / "data")
    await sandbox.start()
    yield sandbox
    await sandbox.stop()


def init_pid(tmp_path: Path) -> int:
    return json.loads((tmp_path / "data" / "sandboxes" / "init1.json").read_text())["pid"]


def private_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return sum(int(m) for m in re.findall(r"^Private_(?:Clean|Dirty):\s+(\d+)", text, re.M))


async def test_the_init_is_undumpable_to_the_agents_uid(box, tmp_path):
    pid = init_pid(tmp_path)
    uid = int(re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))
    assert uid == box.uid != 0
    assert os.stat(f"/proc/{pid}/environ").st_uid == 0  # the kernel's mark of an undumpable process
    result = await box.exec(["bash", "-c", "cat /proc/1/environ >/dev/null; echo $?; head -c1 /proc/1/mem; echo $?"],
                            timeout=20)
    assert result.stdout.decode().split() == ["1", "1"], result
    assert "Permission denied" in result.stderr.decode()


async def test_the_init_with_its_relay_costs_little_more_than_a_bare_interpreter(box, tmp_path):
    bare = subprocess.Popen([sandbox_python() or "python3", "-I", "-S", "-c", "import time\ntime.sleep(30)"])
    try:
        await asyncio.sleep(1.0)
        floor = private_kib(bare.pid)
    finally:
        bare.kill()
        bare.wait()
    assert private_kib(init_pid(tmp_path)) < floor * 1.4, floor
