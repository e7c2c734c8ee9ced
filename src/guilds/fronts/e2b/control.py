"""The E2B control plane (``E2B_API_URL``): sandboxes created, listed, connected, paused, killed.

Every request carries ``X-API-KEY`` (``guilds.fronts.e2b.keys``); a wrong or
missing key is answered 401. Errors are E2B's body ``{"code": <HTTP status>,
"message": ...}`` with that status: 400 for a bad body, 404 for a sandbox
that does not exist or belongs to another key, 409 for pausing a paused one, 503
when the agent's sandbox cannot be started (the reason in the message).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import GuildsError
from ...limits import E2B_DEFAULT_TIMEOUT_SECONDS, E2B_MAX_TIMEOUT_SECONDS
from . import network_options
from .connect import STATUS, ConnectError
from .keys import Keys
from .sandboxes import PAUSED, RUNNING, Sandboxes

Handler = Callable[[Request, str], Awaitable[Response]]


class BadBody(ConnectError):
    def __init__(self, message: str):
        super().__init__("invalid_argument", message)


def e2b_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    data = await request.body()
    if not data.strip():
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        raise BadBody("the request body is not JSON") from None
    if not isinstance(value, dict):
        raise BadBody("the request body is not a JSON object")
    return value


def _timeout(value: Any, default: int = E2B_DEFAULT_TIMEOUT_SECONDS) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= E2B_MAX_TIMEOUT_SECONDS:
        raise BadBody(f"timeout: a whole number of seconds from 0 to {E2B_MAX_TIMEOUT_SECONDS}")
    return value


def _strings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadBody(f"{name}: an object of strings")
    return value


class ControlPlane:
    def __init__(self, sandboxes: Sandboxes, keys: Keys):
        self.sandboxes, self.keys = sandboxes, keys

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes", self._keyed(self.create), methods=["POST"]),
            Route("/v2/sandboxes", self._keyed(self.create), methods=["POST"]),
            Route("/sandboxes", self._keyed(self.list), methods=["GET"]),
            Route("/v2/sandboxes", self._keyed(self.list), methods=["GET"]),
            Route("/sandboxes/{id}", self._keyed(self.detail), methods=["GET"]),
            Route("/sandboxes/{id}", self._keyed(self.kill), methods=["DELETE"]),
            Route("/sandboxes/{id}/timeout", self._keyed(self.timeout), methods=["POST"]),
            Route("/sandboxes/{id}/pause", self._keyed(self.pause), methods=["POST"]),
            Route("/sandboxes/{id}/resume", self._keyed(self.resume), methods=["POST"]),
            Route("/sandboxes/{id}/connect", self._keyed(self.connect), methods=["POST"]),
            Route("/v2/sandboxes/{id}/connect", self._keyed(self.connect), methods=["POST"]),
        ]

    def _keyed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            key_name = self.keys.name_of(request.headers.get("x-api-key"))
            if key_name is None:
                return e2b_error(401, "Invalid API key: X-API-KEY must be a key this server printed")
            try:
                return await handler(request, key_name)
            except ConnectError as exc:
                return e2b_error(STATUS[exc.code], str(exc))
            except GuildsError as exc:  # the agent's sandbox failed to start: one line, no traceback
                return e2b_error(503, f"the sandbox could not be started: {exc}")

        return endpoint

    async def create(self, request: Request, key_name: str) -> Response:
        body = await _body(request)
        template = body.get("templateID", "base")
        if not isinstance(template, str):
            raise BadBody("templateID: a template name")
        box = await self.sandboxes.create(key_name, template, _timeout(body.get("timeout")),
                                          _strings(body.get("metadata"), "metadata"),
                                          _strings(body.get("envVars"), "envVars"),
                                          network_options.asked(body, self.sandboxes.toolbox.settings))
        return JSONResponse(box.created(self.sandboxes.client_id), status_code=201)

    async def list(self, request: Request, key_name: str) -> Response:
        query = dict(parse_qsl(request.url.query))
        states = set(query.get("state", f"{RUNNING},{PAUSED}").split(","))
        wanted = dict(parse_qsl(query.get("metadata", "")))
        found = [box.listed(self.sandboxes.client_id) for box in self.sandboxes.of_key(key_name)
                 if box.state in states and all(box.metadata.get(k) == v for k, v in wanted.items())]
        return JSONResponse(found)

    async def detail(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        return JSONResponse(box.listed(self.sandboxes.client_id))

    async def kill(self, request: Request, key_name: str) -> Response:
        await self.sandboxes.kill(self.sandboxes.get(key_name, request.path_params["id"]))
        return Response(status_code=204)

    async def timeout(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        seconds = _timeout((await _body(request)).get("timeout", -1))
        self.sandboxes.set_timeout(box, seconds)
        return Response(status_code=204)

    async def pause(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        if box.state == PAUSED:
            return e2b_error(409, f"sandbox '{box.id}' is already paused")
        await self.sandboxes.pause(box)
        return Response(status_code=204)

    async def resume(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        if box.state != PAUSED:
            return e2b_error(409, f"sandbox '{box.id}' is already running")
        await self.sandboxes.resume(box, _timeout((await _body(request)).get("timeout")))
        return JSONResponse(box.created(self.sandboxes.client_id), status_code=201)

    async def connect(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        resumed = await self.sandboxes.resume(box, _timeout((await _body(request)).get("timeout")))
        return JSONResponse(box.created(self.sandboxes.client_id), status_code=201 if resumed else 200)
