"""``filesystem.Filesystem`` (Stat, ListDir, MakeDir, Remove, Move) and ``GET|POST /files``.

Paths are resolved inside the sandbox as ``file_read`` resolves them: ``~`` and
relative paths from the agent's home, absolute paths only inside it, links
followed only inside it; a path outside is ``permission_denied`` (403 on
/files). Files move in limits.ENVD_CHUNK_BYTES pieces: a large file is never
held whole in memory; a write keeps E2B_FILE_CHUNKS_IN_FLIGHT pieces on their way at
once (the service takes them in order), a read asks for the next piece while one goes
out. The ``username`` of a request is not used: everything runs as the agent.
"""

from __future__ import annotations

import asyncio
import base64
import zlib
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from guilds_code.limits import ENVD_CHUNK_BYTES

from ...limits import E2B_FILE_CHUNKS_IN_FLIGHT
from . import file_metadata
from .connect import ConnectError
from .envd_channel import EnvdChannel, EnvdFailed
from .multipart import form_files
from .process_api import _envd, _recorder
from .sandboxes import E2BSandbox

INSUFFICIENT_STORAGE = 507


def _path(message: dict[str, Any], name: str = "path") -> str:
    value = message.get(name)
    if not isinstance(value, str) or not value:
        raise ConnectError("invalid_argument", f"{name}: a path is needed")
    return value


class FilesystemApi:
    async def stat(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("stat", path=_path(message))

    async def list_dir(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        depth = message.get("depth") or 1
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConnectError("invalid_argument", "depth: a whole number from 1")
        return await _envd(box).call("list_dir", path=_path(message), depth=depth)

    async def make_dir(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("make_dir", path=_path(message))

    async def remove(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("remove", path=_path(message))

    async def move(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("move", source=_path(message, "source"),
                                     destination=_path(message, "destination"))


def file_error(exc: ConnectError) -> JSONResponse:
    """The /files endpoint's error: envd's ``{"code": <status>, "message": ...}``."""
    status = exc.status
    return JSONResponse({"code": status, "message": str(exc)}, status_code=status)


async def _chunks(envd: EnvdChannel, path: str, first: dict[str, Any]) -> AsyncIterator[bytes]:
    """The file's pieces as they are read, the next one asked for while this one goes out."""
    reply, offset = first, 0
    while True:
        data = base64.b64decode(reply["b64"])
        offset += len(data)
        ahead = None if reply["eof"] else asyncio.ensure_future(
            envd.call("read", path=path, offset=offset, size=ENVD_CHUNK_BYTES))
        try:
            yield data
        except GeneratorExit:  # the client went: the piece asked for ahead is not waited for
            _dropped([ahead] if ahead is not None else [])
            raise
        if ahead is None:
            return
        reply = await ahead


async def read_file(request: Request, box: E2BSandbox) -> Response:
    path = request.query_params.get("path")
    if not path:
        raise ConnectError("invalid_argument", "path: the file to read is needed")
    envd = _envd(box)
    first = await _recorder(box).one("e2b files.read", {"path": path},
                                     envd.call("read", path=path, offset=0, size=ENVD_CHUNK_BYTES))
    return StreamingResponse(_chunks(envd, path, first), media_type="application/octet-stream",
                             headers={"content-length": str(first["size"])})


async def _write(envd: EnvdChannel, path: str, pieces: AsyncIterator[bytes],
                 metadata: dict[str, str]) -> dict[str, Any]:
    try:
        reply = await envd.call("write", path=path, b64="", append=False, metadata=metadata)
    except EnvdFailed as exc:  # the file system has no room for the metadata: E2B's 507
        if exc.code == "resource_exhausted":
            raise ConnectError(exc.code, str(exc), status=INSUFFICIENT_STORAGE) from None
        raise
    in_flight: deque[asyncio.Future] = deque()
    try:
        async for piece in pieces:
            if len(in_flight) >= E2B_FILE_CHUNKS_IN_FLIGHT:
                reply = await in_flight.popleft()
            in_flight.append(asyncio.ensure_future(
                envd.call("write", path=path, b64=base64.b64encode(piece).decode(), append=True)))
        while in_flight:
            reply = await in_flight.popleft()
    finally:  # a failed piece, or the client gone: the ones after it are not waited for
        _dropped(in_flight)
    return reply["entry"]


def _dropped(calls: Iterable[asyncio.Future]) -> None:
    """Calls nobody will wait for: cancelled, or their outcome taken (no warning that it was not)."""
    for call in calls:
        if call.done():
            call.cancelled() or call.exception()
        else:
            call.cancel()


async def _rechunk(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    pending = bytearray()
    async for data in source:
        pending += data
        while len(pending) >= ENVD_CHUNK_BYTES:
            yield bytes(pending[:ENVD_CHUNK_BYTES])
            del pending[:ENVD_CHUNK_BYTES]
    if pending:
        yield bytes(pending)


async def _gunzip(source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip body (``Content-Encoding: gzip``) decompressed, at most a chunk at a time in memory."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        async for data in source:
            pending = data
            while pending:
                yield inflate.decompress(pending, ENVD_CHUNK_BYTES)
                pending = inflate.unconsumed_tail
        yield inflate.flush()
    except zlib.error as exc:
        raise ConnectError("invalid_argument", f"the gzip body is not valid: {exc}") from None


async def write_files(request: Request, box: E2BSandbox) -> Response:
    """The body is the file (application/octet-stream, gzip or not) or a multipart form of files, each
    written at ``path`` (one file) or at its part's file name, with the metadata of the request's
    headers (``file_metadata``); the answer lists them."""
    envd, path, metadata = _envd(box), request.query_params.get("path"), file_metadata.from_headers(request.headers)
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    written: list[dict[str, Any]] = []
    if kind == "multipart/form-data":
        async for name, data in form_files(request):
            if path and written:
                raise ConnectError("invalid_argument", "path: names one file; give each file's path as its "
                                                       "part's file name instead")
            target = path or name
            if not target:
                raise ConnectError("invalid_argument", "path: each file needs a path")
            written.append(await _recorder(box).one("e2b files.write", {"path": target},
                                                    _write(envd, target, _rechunk(data), metadata)))
    else:
        if not path:
            raise ConnectError("invalid_argument", "path: the file to write is needed")
        body: AsyncIterator[bytes] = request.stream()
        if request.headers.get("content-encoding", "").strip().lower() == "gzip":
            body = _gunzip(body)
        written.append(await _recorder(box).one("e2b files.write", {"path": path},
                                                _write(envd, path, _rechunk(body), metadata)))
    return JSONResponse([{"name": e["name"], "path": e["path"], "type": "file",
                          **({"metadata": e["metadata"]} if e.get("metadata") else {})} for e in written])
