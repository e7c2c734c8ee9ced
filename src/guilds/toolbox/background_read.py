"""A background command's state, read or stopped outside the model's calls.

``background_state(toolbox, run_id, bid, started_by, stop=False)`` sends
guilds-code a ``shell_status`` request for one background command (``stop``:
end it first), named by its id and the id of the call that started it
(``started_by``), through the toolbox's one door as a tool call goes
(``Toolbox.request``/``Toolbox.send``: the resident channel when it is open, and
shell_status's wait and re-run rule), but records no call and uses none of the run's budget: the MCP front's tasks
(guilds/fronts/mcp_tasks.py) follow a command so. A bid the sandbox holds for
another command (a replaced sandbox begins again at b1), or does not hold at
all, reads ``ended`` and is never read nor signalled. The text is the
helper's (state, elapsed time, log path, the log's last lines), redacted with
the agent's secrets (the toolbox's redactor) as every result is. A failure to reach the sandbox comes
back as an error envelope, a sentence, marked ``"unreachable": true`` (the
helper's own refusal is not).
"""

from __future__ import annotations

import secrets
from typing import Any

from ..errors import NoAnswer
from .toolbox import Toolbox
from .tools import SHELL_STATUS


async def background_state(toolbox: Toolbox, run_id: str, bid: str, started_by: str, *,
                           stop: bool = False) -> dict[str, Any]:
    """The helper's envelope for background command bid that call started_by started:
    {ok, text, meta} or {ok: false, error}."""
    args: dict[str, Any] = {"id": bid, "stop": True} if stop else {"id": bid}
    request = toolbox.request(SHELL_STATUS.name, args, run_id=run_id, call_id="task-" + secrets.token_hex(6),
                              cwd=toolbox.default_cwd(), max_bytes=toolbox.settings.result_max_bytes,
                              started_by=started_by)
    try:
        envelope = await toolbox.send(request, wait=SHELL_STATUS.wait(args), rerunnable=SHELL_STATUS.rerunnable(args))
    except NoAnswer as exc:
        return {"ok": False, "error": f"the command's state cannot be read now: {exc.reason}", "unreachable": True}
    if envelope.get("ok"):
        envelope["text"] = toolbox.redactor.redact(envelope["text"])
    return envelope
