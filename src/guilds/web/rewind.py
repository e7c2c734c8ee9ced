"""The Rewind button of a call row: ``POST /runs/{run}/calls/{seq}/rewind``.

A row whose call has a checkpoint taken before it (agent.checkpoints) carries a
Rewind button when the server hands the app a rewind (``guilds serve`` does:
``guilds.toolbox.app_rewind``). The button asks to confirm, then posts with the
header ``X-Guilds-Rewind: 1`` (``REWIND_HEADER``): a form of another page cannot
set a header, and a script of another origin cannot send one without a CORS
preflight, which the app never answers; the request also passes the endpoint's
lock (Host, Origin, the token or a login session: ``guilds.web.endpoint_lock``).
The answer is JSON: ``{"text": "rewound run ... paths restored"}``, or
``{"error": "<one line>"}`` with 400 (no checkpoint before that call, a backend
without checkpoints, an agent not served here), 404 (no such run or call), 403
(no header) or 405 (not a POST).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import GuildsError
from ..record.store import Store
from .flow import seq_in_range

Rewind = Callable[[str, int], Awaitable[str]]
REWIND_HEADER = "x-guilds-rewind"
NO_HEADER = "A rewind needs the header X-Guilds-Rewind: 1 (the Rewind button of a call row sends it)."


def rewind_route(store: Store, rewind: Rewind) -> Route:
    """The route of the rewind of module docstring, over ``rewind(run_id, seq) -> line``."""
    async def rewind_call(request: Request) -> JSONResponse:
        if request.headers.get(REWIND_HEADER) != "1":
            return JSONResponse({"error": NO_HEADER}, 403)
        run_id, seq = request.path_params["run_id"], request.path_params["seq"]
        if not seq_in_range(seq) or await store.call(run_id, seq) is None:
            return JSONResponse({"error": f"no call {seq} in run {run_id!r}"}, 404)
        try:
            return JSONResponse({"text": await rewind(run_id, seq)})
        except GuildsError as exc:
            return JSONResponse({"error": str(exc)}, 400)

    return Route("/runs/{run_id}/calls/{seq:int}/rewind", rewind_call, methods=["POST"], name="rewind")
