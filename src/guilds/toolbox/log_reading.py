"""The app's Full output log, read through the agent's own sandbox.

``log_reading(toolbox)`` is what ``guilds serve`` hands the app: an async
``(agent_id, path) -> envelope`` that sends guilds-code a ``log_read`` request
(not a tool of the model; no call is recorded) through the same transport as
a tool call, so every backend (local, bwrap, docker, kubernetes) opens the log
where it lives, and the helper shapes and redacts it with the run's secrets.
A failure to reach the sandbox comes back as an error envelope, a sentence.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from guilds_code import limits

from ..errors import HelperFailed, SandboxError
from . import transport
from .toolbox import Toolbox

ReadLog = Callable[[str, str], Awaitable[dict[str, Any]]]
APP_RUN_ID = "app"
"""The run id of a log_read request: it belongs to no run of the agent."""


def log_request(toolbox: Toolbox, path: str) -> dict[str, Any]:
    """The helper request that reads the log at path (as the sandbox sees it)."""
    home = toolbox.sandbox.home
    return {"op": "log_read", "args": {"path": path}, "run_id": APP_RUN_ID, "agent_id": toolbox.settings.id,
            "call_id": "log-" + secrets.token_hex(6), "home": home, "cwd": home,
            "redact_env": sorted(toolbox.settings.secrets)}


async def read_log(toolbox: Toolbox, path: str) -> dict[str, Any]:
    """The helper's envelope for the log at path; an error envelope when the sandbox fails."""
    try:
        await toolbox._ensure_started()  # the sandbox may not have run a call since serve started
        return await transport.call_helper(toolbox.sandbox, log_request(toolbox, path),
                                           wait=float(limits.OP_WAIT_SECONDS))
    except (HelperFailed, SandboxError) as exc:
        return {"ok": False, "error": f"The log cannot be read: {exc}"}


def log_reading(toolbox: Toolbox) -> ReadLog:
    """The app's reader of this toolbox's agent's logs."""
    async def read(agent_id: str, path: str) -> dict[str, Any]:
        if agent_id != toolbox.settings.id:
            return {"ok": False, "error": f"The logs of agent {agent_id} are not served here."}
        return await read_log(toolbox, path)

    return read
