"""A background command's state, read or stopped outside the model's calls.

``background_state(toolbox, run_id, bid, started_by, stop=False)`` sends
guilds-code a ``shell_status`` request for one background command (``stop``:
end it first), named by its id and the id of the call that started it
(``started_by``), through the agent's sandbox as a tool call goes, but
records no call and uses none of the run's budget: the MCP front's tasks
(guilds/fronts/mcp_tasks.py) follow a command so. A bid the sandbox holds for
another command (a replaced sandbox begins again at b1), or does not hold at
all, reads ``ended`` and is never read nor signalled. The text is the
helper's (state, elapsed time, log path, the log's last lines), redacted with
the agent's secrets as every result is. A failure to reach the sandbox comes
back as an error envelope, a sentence, marked ``"unreachable": true`` (the
helper's own refusal is not).
"""

from __future__ import annotations

import secrets
from typing import Any

from guilds_code import limits
from guilds_code.redact import Redactor

from ..errors import HelperFailed, SandboxError
from . import transport
from .toolbox import Toolbox


def status_request(toolbox: Toolbox, run_id: str, bid: str, started_by: str, stop: bool) -> dict[str, Any]:
    home = toolbox.sandbox.home
    args: dict[str, Any] = {"id": bid, "stop": True} if stop else {"id": bid}
    return {"op": "shell_status", "args": args, "started_by": started_by, "run_id": run_id,
            "agent_id": toolbox.settings.id,
            "call_id": "task-" + secrets.token_hex(6), "home": home, "cwd": toolbox.default_cwd(),
            "max_bytes": toolbox.settings.result_max_bytes, "seq": 0,
            "redact_env": sorted(toolbox.settings.secrets)}


async def background_state(toolbox: Toolbox, run_id: str, bid: str, started_by: str, *,
                           stop: bool = False) -> dict[str, Any]:
    """The helper's envelope for background command bid that call started_by started:
    {ok, text, meta} or {ok: false, error}."""
    request = status_request(toolbox, run_id, bid, started_by, stop)
    try:
        await toolbox._ensure_started()  # the sandbox may not have run a call since the server started
        envelope = await transport.call_helper(toolbox.sandbox, request,
                                               wait=float(limits.OP_WAIT_SECONDS))
    except (HelperFailed, SandboxError) as exc:
        return {"ok": False, "error": f"the command's state cannot be read now: {exc}", "unreachable": True}
    if envelope.get("ok"):
        envelope["text"] = Redactor(toolbox.settings.secret_values()).redact(envelope["text"])
    return envelope
