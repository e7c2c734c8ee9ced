"""The app's Full output log, read through the agent's own sandbox.

``log_reading(toolbox)`` is what ``guilds serve`` hands the app: an async
``(agent_id, path) -> envelope`` that sends guilds-code a ``log_read`` request
(not a tool of the model; no call is recorded) through the toolbox's one door
(``Toolbox.request``/``Toolbox.send``, the resident channel when it is open), so
every backend (local, bwrap, docker, kubernetes) opens the log where it lives,
and the helper shapes and redacts it with the run's secrets. A failure to
reach the sandbox comes back as an error envelope, a sentence.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from guilds_code import limits

from ..errors import BadInput, NoAnswer
from .toolbox import Toolbox

ReadLog = Callable[[str, str], Awaitable[dict[str, Any]]]
LOG_READ = "log_read"
"""The helper's op that reads a log: no tool of the model."""
APP_RUN_ID = "app"
"""The run id of a log_read request: it belongs to no run of the agent."""


def log_request(toolbox: Toolbox, path: str) -> dict[str, Any]:
    """The helper request that reads the log at path (as the sandbox sees it)."""
    return toolbox.request(LOG_READ, {"path": path}, run_id=APP_RUN_ID, call_id="log-" + secrets.token_hex(6))


async def read_log(toolbox: Toolbox, path: str) -> dict[str, Any]:
    """The helper's envelope for the log at path; an error envelope when the sandbox fails."""
    try:  # a read changes nothing: it may run again on a new resident channel
        return await toolbox.send(log_request(toolbox, path), wait=float(limits.OP_WAIT_SECONDS), rerunnable=True)
    except NoAnswer as exc:
        return {"ok": False, "error": f"The log cannot be read: {exc.reason}"}


def log_reading(toolbox: Toolbox, toolbox_of: Callable[[str], Awaitable[Toolbox]] | None = None) -> ReadLog:
    """The app's reader of this toolbox's agent's logs, and, with ``toolbox_of`` (a live agent
    made on demand's toolbox by its id; BadInput for one not live), those of the agents made on demand."""
    async def read(agent_id: str, path: str) -> dict[str, Any]:
        if agent_id == toolbox.settings.id:
            return await read_log(toolbox, path)
        if toolbox_of is not None:
            try:
                return await read_log(await toolbox_of(agent_id), path)
            except BadInput:
                pass
        return {"ok": False, "error": f"The logs of agent {agent_id} are not served here."}

    return read
