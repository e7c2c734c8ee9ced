"""``/healthz`` and ``/readyz``: what an orchestrator's probes ask of ``guilds serve``.

    app = with_health(app, ready)       # ready: an async check, True when the server can serve

Both are answered before the endpoint lock (``guilds.web.endpoint_lock``): a probe
carries no token and names the pod's address as its Host, and neither answer says
anything but whether the server is up. ``GET /healthz``: 200 ``ok`` while the
server's loop answers at all (liveness). ``GET /readyz``: 200 ``ready`` when
``ready()`` says so within SERVE_READY_WAIT_SECONDS, else 503 naming why (readiness:
``guilds serve`` asks the run record, which every replica shares). Any other method
on them: 405. ``GET /healthz?owner=<id>``: 200 ``ok`` from the process whose run
record owner is ``id``, 404 from any other: how the other servers on the record ask
whether the process running a call still runs (``guilds.record.liveness``); an owner
id is a random one, and the answer says nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

from ..limits import SERVE_READY_WAIT_SECONDS
from ..record.liveness import OWNER_QUERY, PROBE_PATH

HEALTH_PATH = PROBE_PATH
READY_PATH = "/readyz"


async def _answer(send: Callable, status: int, text: str, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store"),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": text.encode() + b"\n"})


async def readiness(ready: Callable[[], Awaitable[bool]]) -> tuple[int, str]:
    """(status, text) of /readyz: ready() within SERVE_READY_WAIT_SECONDS, any failure named."""
    try:
        ok = await asyncio.wait_for(ready(), SERVE_READY_WAIT_SECONDS)
    except TimeoutError:
        return 503, f"not ready: no answer in {SERVE_READY_WAIT_SECONDS:g} s"
    except Exception as exc:  # noqa: BLE001 - whatever failed is the reason, said in one line
        return 503, f"not ready: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return (200, "ready") if ok else (503, "not ready")


def liveness(query: bytes, owner_id: str | None) -> tuple[int, str]:
    """(status, text) of /healthz: ok, unless the query names an owner this process is not."""
    asked = parse_qs(query.decode("latin-1")).get(OWNER_QUERY)
    if asked is not None and asked != [owner_id]:
        return 404, "not this process"
    return 200, "ok"


def with_health(app: Callable, ready: Callable[[], Awaitable[bool]], owner_id: str | None = None) -> Callable:
    """An ASGI app answering HEALTH_PATH and READY_PATH itself, everything else to app.
    owner_id: this process's run record owner (``?owner=``)."""
    async def health(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] not in (HEALTH_PATH, READY_PATH):
            await app(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _answer(send, 405, "GET only", [(b"allow", b"GET, HEAD")])
        elif scope["path"] == HEALTH_PATH:
            await _answer(send, *liveness(scope.get("query_string", b""), owner_id))
        else:
            await _answer(send, *await readiness(ready))

    return health
