"""A built template's start and ready commands, in each sandbox made of it.

E2B runs a template's start command (``set_start_cmd``) when its sandbox starts and holds the
sandbox back until its ready command (``set_ready_cmd``, ``wait_for_port(8000)``...) succeeds.
Here a sandbox keeps no memory of its build, so each create does that: the start command is
started in the background through the sandbox's process service (``bash -l -c``, tagged
``start_cmd``: ``commands.list()`` shows it, ``commands.connect`` reaches it), then the ready
command is run in the sandbox until it exits 0, at most ``E2B_TEMPLATE_READY_SECONDS``;
past it, the create fails and the sandbox is killed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ...limits import E2B_TEMPLATE_READY_AGAIN_SECONDS, E2B_TEMPLATE_READY_SECONDS
from .connect import ConnectError
from .sandboxes import E2BSandbox

START_TAG = "start_cmd"


async def started(box: E2BSandbox, built: dict[str, Any]) -> None:
    """box's start command started and its ready command succeeded (none: nothing to do)."""
    start, ready = built.get("start_cmd"), built.get("ready_cmd")
    if start:
        if box.envd is None:
            raise ConnectError("unavailable", "the sandbox's process service is not running")
        await box.envd.call("start", cmd="/bin/bash", args=["-l", "-c", start], envs={}, cwd=None, tag=START_TAG,
                            stdin=False, timeout_ms=None, base_env=box.env_vars, run_id=box.run_id,
                            call_id="start-cmd", pty=None)
    if not ready:
        return
    deadline = time.monotonic() + E2B_TEMPLATE_READY_SECONDS
    while True:
        left = deadline - time.monotonic()
        done = await box.sandbox.exec(["/bin/bash", "-l", "-c", ready], env=box.env_vars, timeout=max(left, 1))
        if done.exit_code == 0:
            return
        if time.monotonic() + E2B_TEMPLATE_READY_AGAIN_SECONDS >= deadline:
            raise ConnectError("unavailable", f"the template's ready command did not succeed within "
                                              f"{E2B_TEMPLATE_READY_SECONDS:g} s (E2B_TEMPLATE_READY_SECONDS): {ready}")
        await asyncio.sleep(E2B_TEMPLATE_READY_AGAIN_SECONDS)
