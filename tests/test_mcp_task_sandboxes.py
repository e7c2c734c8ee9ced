"""A command's task across a replaced sandbox, on each backend: ids begin again at b1 in the
new sandbox (or the records outlive it, as a pod's claim keeps them), and the task names its
command by the call that started it. Real sandboxes, real SQLite, a real server on a loopback
port, raw 2026-07-28 requests."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import kube_kit
import mcp_kit as kit
from guilds.fronts.mcp_runs import RUN_KEY
from guilds.fronts.mcp_server import META_KEY, streamable_http_app
from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.toolbox import Toolbox
from mcp_raw import RawClient
from test_mcp_http import serving
from test_mcp_tasks import until_status
from test_sandbox import settings_for

ENDED_STATES = {"completed", "failed", "cancelled"}
ENDED = "{bid} ended: it ran in an earlier sandbox (this sandbox's {bid}, if any, is another command)"


async def _call(raw: RawClient, tool: str, arguments: dict[str, Any], run: str) -> dict:
    answer = await raw.post("tools/call", {"name": tool, "arguments": arguments, "_meta": {RUN_KEY: run}}, name=tool)
    assert "result" in answer, answer
    return answer["result"]


async def _remove_once_quiet(records: Path, quiet: float = 0.5, timeout: float = 10) -> None:
    """Remove the records once the killed commands' wrappers have written their exit records
    (a record being renamed while the folder is removed is written again): gone, and still
    gone ``quiet`` seconds later."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        shutil.rmtree(records, ignore_errors=True)
        await asyncio.sleep(quiet)
        if not records.exists() or asyncio.get_running_loop().time() > deadline:
            assert not records.exists(), sorted(p.name for p in records.iterdir())
            return


async def _replace(toolbox: Toolbox, old_arg: str) -> None:
    """A new sandbox in place of the old one. `local` has none to replace: its commands are
    ended and its records removed, as a new container's empty state root would have it."""
    box = toolbox.sandbox
    if box.name == "local":
        for pid in kit.processes("sleep", old_arg):
            os.kill(pid, signal.SIGKILL)
        await _remove_once_quiet(Path(box.state_dir) / toolbox.settings.id / "background")
        return
    await box.stop()
    await box.start()


async def _fresh_home(toolbox: Toolbox) -> None:
    """kubernetes: the agent's pod, claim and secret removed, as the others' tmp_path goes."""
    if toolbox.sandbox.name == "kubernetes":
        await asyncio.to_thread(kube_kit.remove_agent, toolbox.sandbox.pod)  # type: ignore[attr-defined]


async def test_a_task_of_a_replaced_sandbox_reads_ended_and_never_touches_the_new_commands(backend, tmp_path):
    # an agent of its own: no claim of another test's agent1 holds its records, ids begin at b1
    settings = replace(settings_for(tmp_path, backend), id=f"agent-{os.urandom(4).hex()}")
    old_sleep, old_arg = kit.sleep_command()
    new_sleep, new_arg = kit.sleep_command()
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        toolbox = Toolbox(settings, get_sandbox(settings, tmp_path / "data"), store)
        try:
            async with serving(streamable_http_app(toolbox)) as url:
                raw = RawClient(url)
                followed = await _call(raw, "shell", {"command": f"echo old-output; {old_sleep}",
                                                      "background": True}, "r-old")
                cancelled = await _call(raw, "shell", {"command": old_sleep, "background": True}, "r-old")
                assert followed["statusMessage"].startswith("started b1 ")
                assert cancelled["statusMessage"].startswith("started b2 ")
                await _replace(toolbox, old_arg)
                new_ids = []
                for n in (1, 2):
                    started = await _call(raw, "shell", {"command": f"echo new-output-{n}; {new_sleep}",
                                                         "background": True}, "r-new")
                    new_ids.append(started["_meta"][META_KEY]["background_id"])
                # each task's follower looks at its command in turn: both end once they have looked
                got = await until_status(raw, followed["taskId"], ENDED_STATES)
                await until_status(raw, cancelled["taskId"], ENDED_STATES)
                ack = await raw.task("tasks/cancel", cancelled["taskId"])
                after = (await raw.task("tasks/get", cancelled["taskId"]))["result"]
                states = [(await _call(raw, "shell_status", {"id": bid}, "r-new"))["_meta"][META_KEY]["state"]
                          for bid in new_ids]
        finally:
            await toolbox.close()
            await toolbox.sandbox.stop()
            await _fresh_home(toolbox)
            for pid in kit.processes("sleep", old_arg) + kit.processes("sleep", new_arg):
                os.kill(pid, signal.SIGKILL)
    assert states == ["running", "running"]  # the new sandbox's commands were never signalled
    assert got["status"] == "completed", got
    text = got["result"]["content"][0]["text"]
    assert got["result"]["_meta"][META_KEY]["state"] == "ended" and "new-output" not in text
    if backend in ("local", "docker", "bwrap"):  # the records went with the sandbox; ids began again
        assert new_ids == ["b1", "b2"] and text == ENDED.format(bid="b1")
    assert "error" not in ack and after["status"] == "completed", after  # ended, so nothing to cancel
    assert after["result"]["_meta"][META_KEY]["state"] == "ended"
