"""The in-sandbox API (``E2B_SANDBOX_URL``): every sandbox's, routed by ``E2b-Sandbox-Id``.

Each request names its sandbox (``E2b-Sandbox-Id``) and carries that sandbox's
access token (``X-Access-Token``, from the create answer's ``envdAccessToken``).
No sandbox id: 400 ``invalid_argument``; an unknown one: 404 ``not_found``; no
token or a wrong one (whatever its shape): 401 ``unauthenticated``; all in
Connect's JSON error shape, never a 500. ``GET /health`` answers 204 to a sandbox
that is running.

Every request other than /health is a call of the sandbox's run
(``guilds.fronts.e2b.recording``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import GuildsError
from .connect import ConnectError, error_response, stream_request, unary_request
from .files_api import FilesystemApi, file_error, read_file, write_files
from .process_api import ProcessApi, _recorder
from .sandboxes import PAUSED, E2BSandbox, Sandboxes

Unary = Callable[[E2BSandbox, dict[str, Any]], Awaitable[dict[str, Any]]]
Streaming = Callable[[Request, E2BSandbox, dict[str, Any]], Awaitable[Response]]


class InSandboxApi:
    def __init__(self, sandboxes: Sandboxes):
        self.sandboxes = sandboxes
        process, files = ProcessApi(), FilesystemApi()
        self.unary: dict[str, Unary] = {
            "process.Process/List": process.list, "process.Process/SendSignal": process.send_signal,
            "process.Process/SendInput": process.send_input, "process.Process/CloseStdin": process.close_stdin,
            "filesystem.Filesystem/Stat": files.stat, "filesystem.Filesystem/ListDir": files.list_dir,
            "filesystem.Filesystem/MakeDir": files.make_dir, "filesystem.Filesystem/Remove": files.remove,
            "filesystem.Filesystem/Move": files.move,
        }
        self.streaming: dict[str, Streaming] = {
            "process.Process/Start": process.start, "process.Process/Connect": process.connect,
        }

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/files", self.files, methods=["GET", "POST"]),
            Route("/process.Process/{method}", self.rpc, methods=["POST"]),
            Route("/filesystem.Filesystem/{method}", self.rpc, methods=["POST"]),
        ]

    def sandbox(self, request: Request) -> E2BSandbox:
        """The request's sandbox, its access token checked (the module docstring's errors)."""
        sandbox_id = request.headers.get("e2b-sandbox-id")
        if not sandbox_id:
            raise ConnectError("invalid_argument", "the E2b-Sandbox-Id header is needed")
        box = self.sandboxes.get(None, sandbox_id)
        token = request.headers.get("x-access-token", "")
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), box.access_token.encode()):
            raise ConnectError("unauthenticated", "X-Access-Token: not this sandbox's access token")
        return box

    async def health(self, request: Request) -> Response:
        try:
            box = self.sandbox(request)
        except ConnectError as exc:
            return error_response(exc)
        except GuildsError as exc:  # the sandbox's process service could not be reached
            return error_response(ConnectError("unavailable", str(exc)))
        return Response(status_code=502 if box.state == PAUSED else 204)

    async def files(self, request: Request) -> Response:
        try:
            box = self.sandbox(request)
            if request.method == "GET":
                return await read_file(request, box)
            return await write_files(request, box)
        except ConnectError as exc:
            return file_error(exc)

    async def rpc(self, request: Request) -> Response:
        name = request.url.path.lstrip("/")
        try:
            box = self.sandbox(request)
            body = await request.body()
            kind = request.headers.get("content-type", "")
            if name in self.streaming:
                return await self.streaming[name](request, box, stream_request(kind, body))
            handler = self.unary.get(name)
            if handler is None:
                raise ConnectError("unimplemented", f"{name} is not served")
            message = unary_request(kind, body)
            answer = await _recorder(box).one(f"e2b {name.replace('/', '.')}", message, handler(box, message))
            return JSONResponse(answer)
        except ConnectError as exc:
            return error_response(exc)
        except GuildsError as exc:  # the sandbox's process service could not be reached
            return error_response(ConnectError("unavailable", str(exc)))
