"""``filesystem.Filesystem`` folder watches: WatchDir (a stream), CreateWatcher, GetWatcherEvents,
RemoveWatcher, served by the sandbox's ``guilds-code envd`` (``guilds_code.envd_watch``).

CreateWatcher answers a ``watcherId`` whose events GetWatcherEvents takes (those since
its last call); RemoveWatcher stops it. WatchDir streams a start, then each event as
it comes, a keepalive when quiet for limits.E2B_KEEPALIVE_SECONDS, until the client
goes, the stream's deadline (``Connect-Timeout-Ms``) passes, or the watcher fails;
its watcher is removed when the stream ends, however it ends.

Memory stays bounded at both ends: the service keeps at most its limit of events a
watcher has not handed over (past it the watcher fails, as E2B's does when the
kernel's queue overflows), and a stream takes them only when it has sent the last
ones on: a client that does not read holds them in the sandbox, not here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ...limits import E2B_KEEPALIVE_SECONDS
from .connect import STREAM_TYPE, ConnectError, end_stream, envelope
from .envd_channel import EnvdChannel
from .process_api import _envd, deadline_of
from .sandboxes import E2BSandbox


def _field(message: dict[str, Any], name: str, json_name: str) -> Any:
    """A field by its JSON name or its proto name (protobuf's JSON mapping takes both)."""
    return message.get(json_name, message.get(name))


def _path(message: dict[str, Any]) -> str:
    value = message.get("path")
    if not isinstance(value, str) or not value:
        raise ConnectError("invalid_argument", "path: the folder to watch is needed")
    return value


def _watcher_id(message: dict[str, Any]) -> str:
    value = _field(message, "watcher_id", "watcherId")
    if not isinstance(value, str) or not value:
        raise ConnectError("invalid_argument", "watcherId: a watcher's id is needed")
    return value


async def _create(envd: EnvdChannel, message: dict[str, Any], notify: bool) -> str:
    reply = await envd.call(
        "watch_create", path=_path(message), recursive=bool(message.get("recursive")),
        include_entry=bool(_field(message, "include_entry", "includeEntry")),
        allow_network_mounts=bool(_field(message, "allow_network_mounts", "allowNetworkMounts")), notify=notify)
    return reply["watcher"]


class WatchApi:
    async def create_watcher(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return {"watcherId": await _create(_envd(box), message, notify=False)}

    async def get_watcher_events(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("watch_events", watcher=_watcher_id(message))

    async def remove_watcher(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("watch_remove", watcher=_watcher_id(message))

    async def watch_dir(self, request: Request, box: E2BSandbox, message: dict[str, Any]) -> Response:
        deadline = deadline_of(request)
        envd = _envd(box)
        watcher = await _create(envd, message, notify=True)
        ready = envd.watches[watcher] = asyncio.Event()
        ready.set()  # events may have come before its id was known here
        return WatchStream(envd, watcher, watch_stream(envd, watcher, ready, deadline))


def release(envd: EnvdChannel, watcher: str) -> None:
    """A streamed watcher removed (once, whoever asks first)."""
    if envd.watches.pop(watcher, None) is not None:
        envd.notify("watch_remove", watcher=watcher)


class WatchStream(StreamingResponse):
    """WatchDir's answer: its watcher removed when it ends, also when its body never began
    (the client gone before its first message)."""

    def __init__(self, envd: EnvdChannel, watcher: str, body: AsyncIterator[bytes]):
        super().__init__(body, media_type=STREAM_TYPE)
        self.envd, self.watcher = envd, watcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release(self.envd, self.watcher)


async def watch_stream(envd: EnvdChannel, watcher: str, ready: asyncio.Event,
                       deadline: float | None) -> AsyncIterator[bytes]:
    """WatchDir's messages (the module docstring); the watcher removed at its end."""
    try:
        yield envelope({"start": {}})
        while True:
            wait = E2B_KEEPALIVE_SECONDS if deadline is None else min(E2B_KEEPALIVE_SECONDS,
                                                                     deadline - time.monotonic())
            try:
                await asyncio.wait_for(ready.wait(), max(wait, 0))
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    yield end_stream(ConnectError("deadline_exceeded", "the watch's deadline passed"))
                    return
                yield envelope({"keepalive": {}})
                continue
            ready.clear()  # before the take: what comes after it is announced again
            try:
                reply = await envd.call("watch_events", watcher=watcher)
            except ConnectError as exc:
                yield end_stream(exc)
                return
            for event in reply["events"]:
                yield envelope({"filesystem": event})
    finally:
        release(envd, watcher)
