"""The MCP front's rewind: ``guilds/rewind``, a request of our own (an extension,
``dev.guilds/checkpoints``) for a client that rewinds its model's context and
wants the agent's files to follow.

    {"method": "guilds/rewind", "params": {"run": "<run id>", "seq": N}}
    -> {"checkpoint": "<id>", "changed": n, "stopped": ["b1", ...], "text": "rewound run ..."}

``run`` is the run id a result's ``_meta["guilds/meta"]["run"]`` names, ``seq``
the call's number there: the files go back to what they were before that call
(``guilds.toolbox.checkpointing``). The run must be the caller's (the principal
that made it, as for a call) and this agent's. A rewind that cannot be done (no
checkpoint before that call, a backend without them, a full disk) is a -32602
error whose message is its one line. It is not a tool: the model never sees it.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Field

from ..errors import GuildsError
from ..toolbox import Toolbox
from .mcp_quick import CHECKPOINTS_EXTENSION
from .mcp_runs import principal_of

REWIND_METHOD = "guilds/rewind"


class RewindParams(BaseModel):
    run: str
    seq: int = Field(ge=1)


class CheckpointsExtension(Extension):
    """``guilds/rewind``: the agent's files as before a call of one of the caller's runs."""

    identifier = CHECKPOINTS_EXTENSION

    def __init__(self, toolbox: Toolbox):
        self.toolbox = toolbox

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding(REWIND_METHOD, RewindParams, self._rewind)]

    async def _rewind(self, ctx: ServerRequestContext, params: RewindParams) -> dict[str, Any]:
        try:
            return await self._rewound(principal_of(ctx), params)
        except GuildsError as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=str(exc)) from None

    async def _rewound(self, principal: str, params: RewindParams) -> dict[str, Any]:
        from ..errors import BadInput
        from ..toolbox.toolbox import check_run_id

        run_id = check_run_id(params.run)
        if await self.toolbox.store.get_run(run_id) is None:
            raise BadInput(f"no run {run_id!r}")
        if await self.toolbox.store.claim_run(run_id, principal, self.toolbox.settings.id) != principal:
            raise BadInput(f"run {run_id!r} is not yours")
        if self.toolbox.checkpoints is None:
            raise BadInput(f"checkpoints: not served on {self.toolbox.settings.sandbox}")
        done = await self.toolbox.checkpoints.rewind(run_id, params.seq)
        return {"checkpoint": done.checkpoint, "changed": done.changed, "stopped": list(done.stopped),
                "text": done.line(run_id, params.seq)}
