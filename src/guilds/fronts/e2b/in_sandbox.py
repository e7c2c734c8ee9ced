"""The in-sandbox API (``E2B_SANDBOX_URL``): every sandbox's, routed by ``E2b-Sandbox-Id``.

Each request names its sandbox (``E2b-Sandbox-Id``) and carries that sandbox's
access token (``X-Access-Token``, from the create answer's ``envdAccessToken``).
No sandbox id: 400 ``invalid_argument``; an unknown one: 404 ``not_found``; no
token or a wrong one (whatever its shape): 401 ``unauthenticated``; all in
Connect's JSON error shape, never a 500. A ``/files`` request may carry a signature
instead (a signed file URL, ``signed_urls``). ``GET /health`` answers 204 to a sandbox
that is running, 502 to one paused, killed or unknown (as E2B answers).

Every request other than /health is a call of the sandbox's run
(``guilds.fronts.e2b.recording``).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import GuildsError
from ...limits import E2B_MAX_MESSAGE_BYTES
from .connect import ENVELOPE_BYTES, ConnectError, bounded_body, error_response, stream_request, unary_request
from .files_api import FilesystemApi, file_error, read_file, write_files
from .process_api import ProcessApi, _recorder
from .sandboxes import PAUSED, E2BSandbox, Sandboxes
from .shared_commands import SELECTING, Forwarded, SharedCommands
from .signed_urls import signed_sandbox
from .watch_api import WatchApi

Unary = Callable[[E2BSandbox, dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]
Streaming = Callable[[Request, E2BSandbox, dict[str, Any]], Awaitable[Response]]


class InSandboxApi:
    def __init__(self, sandboxes: Sandboxes):
        self.sandboxes = sandboxes
        self.shared = None if sandboxes.shared is None else SharedCommands(sandboxes.shared.store)
        process, files, watches = ProcessApi(self.shared), FilesystemApi(), WatchApi()
        self.unary: dict[str, Unary] = {
            "process.Process/List": process.list, "process.Process/SendSignal": process.send_signal,
            "process.Process/SendInput": process.send_input, "process.Process/CloseStdin": process.close_stdin,
            "filesystem.Filesystem/Stat": files.stat, "filesystem.Filesystem/ListDir": files.list_dir,
            "filesystem.Filesystem/MakeDir": files.make_dir, "filesystem.Filesystem/Remove": files.remove,
            "filesystem.Filesystem/Move": files.move, "process.Process/Update": process.update,
            "filesystem.Filesystem/CreateWatcher": watches.create_watcher,
            "filesystem.Filesystem/GetWatcherEvents": watches.get_watcher_events,
            "filesystem.Filesystem/RemoveWatcher": watches.remove_watcher,
        }
        self.streaming: dict[str, Streaming] = {
            "process.Process/Start": process.start, "process.Process/Connect": process.connect,
            "filesystem.Filesystem/WatchDir": watches.watch_dir,
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

    def file_sandbox(self, request: Request) -> E2BSandbox:
        """A /files request's sandbox: by its headers, or, with a ``signature`` and no access
        token, by its signature (``signed_urls``)."""
        if "signature" not in request.query_params or request.headers.get("x-access-token"):
            return self.sandbox(request)
        named = request.headers.get("e2b-sandbox-id")
        return signed_sandbox(request, [self.sandboxes.get(None, named)] if named else self.sandboxes.every())

    async def health(self, request: Request) -> Response:
        """204 while the sandbox runs; 502 (E2B's body) while it is paused, or when it is gone
        (killed, timed out) or never was: E2B's answer, which the SDKs read as not running."""
        try:
            box = self.sandbox(request)
        except ConnectError as exc:
            if exc.code != "not_found":
                return error_response(exc)
            sandbox_id = request.headers.get("e2b-sandbox-id")
            return JSONResponse({"code": 502, "message": f"The sandbox {sandbox_id} was not found: it was killed, "
                                                         "reached its end of life, or never was"}, status_code=502)
        except GuildsError as exc:  # the sandbox's process service could not be reached
            return error_response(ConnectError("unavailable", str(exc)))
        return Response(status_code=502 if box.state == PAUSED else 204)

    async def files(self, request: Request) -> Response:
        try:
            box = self.file_sandbox(request)
            await self.sandboxes.awake(box)
            if request.method == "GET":
                return await read_file(request, box)
            return await write_files(request, box)
        except ConnectError as exc:
            return file_error(exc)

    async def rpc(self, request: Request) -> Response:
        name = request.url.path.lstrip("/")
        try:
            box = self.sandbox(request)
            await self.sandboxes.awake(box)
            body = await bounded_body(request, E2B_MAX_MESSAGE_BYTES + ENVELOPE_BYTES)
            kind = request.headers.get("content-type", "")
            if name not in self.streaming and name not in self.unary:
                raise ConnectError("unimplemented", f"{name} is not served")
            message = stream_request(kind, body) if name in self.streaming else unary_request(kind, body)
            if self.shared is not None and name in SELECTING:
                own = box.envd.commands if box.envd is not None else ()
                address = await self.shared.elsewhere(request.scope["headers"], box.id, message, own)
                if address is not None:
                    return Forwarded(address, body, self.shared.own_address)
            if name in self.streaming:
                return await self.streaming[name](request, box, message)
            handler = self.unary[name]
            answer = await _recorder(box).one(f"e2b {name.replace('/', '.')}", message, handler(box, message))
            return JSONResponse(answer)
        except ConnectError as exc:
            return error_response(exc)
        except GuildsError as exc:  # the sandbox's process service could not be reached
            return error_response(ConnectError("unavailable", str(exc)))
