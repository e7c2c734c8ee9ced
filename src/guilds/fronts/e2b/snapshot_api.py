"""The control plane's snapshot and fork requests (``guilds.fronts.e2b.forks``), keyed as the
others are (``X-API-KEY``; another key's sandbox or snapshot is not found).

    POST   /sandboxes/{id}/snapshots  {name?}             201 SnapshotInfo
    POST   /sandboxes/{id}/fork       {timeout?, count?}  201 [{sandbox} | {error}], one per fork
    GET    /snapshots?sandboxID=&name=&limit=&nextToken=  200 [SnapshotInfo], X-Next-Token
    DELETE /templates/{snapshot id}                       204; 404 when no such snapshot

A sandbox is made from a snapshot by ``POST /sandboxes`` with the snapshot's id (or name) as
``templateID`` (``control``). ``DELETE /templates/{id}`` of a template served here is E2B's
template delete: answered 501, as template builds are (``unserved``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...agents.fork import checked_count
from ...errors import BadInput
from ...limits import E2B_FORK_DEFAULT_TIMEOUT_SECONDS, E2B_SNAPSHOTS_PAGE, FORK_MAX_CHILDREN
from . import unserved
from .connect import ConnectError
from .control import BadBody, ControlPlane, _body, _timeout, e2b_error
from .forks import Forks
from .snapshots import Snapshot, checked_name


class SnapshotApi:
    def __init__(self, control: ControlPlane, forks: Forks):
        self.control, self.forks = control, forks
        self.sandboxes, self.snapshots = forks.sandboxes, forks.snapshots

    def routes(self) -> list[Route]:
        keyed = self.control._keyed
        return [
            Route("/sandboxes/{id}/snapshots", keyed(self.snapshot), methods=["POST"]),
            Route("/sandboxes/{id}/fork", keyed(self.fork), methods=["POST"]),
            Route("/snapshots", keyed(self.list), methods=["GET"]),
            Route("/templates/{id:path}", keyed(self.delete), methods=["DELETE"]),
        ]

    async def snapshot(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        name = checked_name((await _body(request)).get("name"), self.sandboxes.templates())
        made = await self.forks.snapshot(box, name)
        return JSONResponse(made.info(), status_code=201)

    async def fork(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        body = await _body(request)
        try:
            count = checked_count(body.get("count", 1))
        except BadInput:
            raise BadBody(f"count: the number of sandboxes to fork, 1 to {FORK_MAX_CHILDREN}") from None
        timeout = _timeout(body.get("timeout"), E2B_FORK_DEFAULT_TIMEOUT_SECONDS)
        ends = await self.forks.fork(box, count, timeout)
        client, domain = self.sandboxes.client_id, self.sandboxes.domain
        return JSONResponse([{"error": {"code": end.status, "message": str(end)}} if isinstance(end, ConnectError)
                             else {"sandbox": end.created(client, domain)} for end in ends], status_code=201)

    async def list(self, request: Request, key_name: str) -> Response:
        query = dict(parse_qsl(request.url.query))
        found = [s for s in self.snapshots.of_key(key_name)
                 if query.get("sandboxID") in (None, s.sandbox_id) and (not query.get("name")
                                                                       or s.named_by(query["name"]))]
        page, after = _page(found, _limit(query.get("limit")), query.get("nextToken"))
        headers = {} if after is None else {"X-Next-Token": after}
        return JSONResponse([s.info() for s in page], headers=headers)

    async def delete(self, request: Request, key_name: str) -> Response:
        ref = request.path_params["id"]
        snapshot = self.snapshots.find(key_name, ref)
        if snapshot is not None:
            await self.snapshots.remove(snapshot)
            return Response(status_code=204)
        if ref in self.sandboxes.templates():
            return await unserved.unserved(request)
        return e2b_error(404, f"snapshot '{ref}' not found")


def _limit(value: Any) -> int:
    if value is None:
        return E2B_SNAPSHOTS_PAGE
    if not value.isdigit() or not 1 <= int(value) <= E2B_SNAPSHOTS_PAGE:
        raise BadBody(f"limit: a whole number from 1 to {E2B_SNAPSHOTS_PAGE}")
    return int(value)


def _page(found: list[Snapshot], limit: int, token: str | None) -> tuple[list[Snapshot], str | None]:
    """The page from token on (the next page's first snapshot, as the last answer named it;
    one deleted meanwhile: the page starts where it stood), and the next page's token."""
    if token:
        if not _TOKEN.fullmatch(token):
            raise BadBody("nextToken: a token a list of snapshots answered")
        found = [s for s in found if s.order >= token]
    page, rest = found[:limit], found[limit:]
    return page, (rest[0].order if rest else None)


_TOKEN = re.compile(r"\d{20}\.[0-9a-f]{20}")
"""A next token: a snapshot's ``order``."""
