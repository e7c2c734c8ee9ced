"""``process.Process`` over Connect: Start, Connect, List, SendSignal, SendInput, CloseStdin.

Start runs the command through the sandbox's ``guilds-code envd`` and streams its
events (start, data, end; a keepalive when quiet for limits.E2B_KEEPALIVE_SECONDS).
The stream's deadline (``Connect-Timeout-Ms``, the SDKs' command ``timeout``) is
the command's: past it the command's group gets SIGTERM, then SIGKILL, inside
the sandbox, foreground or background alike (E2B only ends the stream). Connect
reattaches to a running command by pid or tag (a command that ended lately is
answered with its start and its end); the command runs on whatever happens to
a stream. An exit by signal N is ``exitCode`` -1, ``exited`` false, ``status``
``signal: ...``, as E2B's envd reports it.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ...errors import GuildsError
from ...limits import E2B_KEEPALIVE_SECONDS
from ...sandbox.base import keep_egress
from . import dropped
from .connect import STREAM_TYPE, ConnectError, end_stream, envelope
from .envd_channel import Command, EnvdChannel
from .recording import Recorder
from .sandboxes import E2BSandbox
from .shared_commands import SharedCommands

SIGNAL_NAMES = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}


def end_message(event: dict[str, Any]) -> dict[str, Any]:
    """A ProcessEvent.EndEvent from the service's end event."""
    signal = event.get("signal")
    if signal:
        end: dict[str, Any] = {"exitCode": -1, "exited": False,
                               "status": f"signal: {SIGNAL_NAMES.get(signal, signal)}"}
    else:
        end = {"exitCode": event["exit_code"], "exited": True, "status": f"exit status {event['exit_code']}"}
    if event.get("timed_out"):
        end["error"] = "the command's deadline passed: it was stopped (SIGTERM, then SIGKILL)"
    elif event.get("error"):
        end["error"] = event["error"]
    return end


def event_message(event: dict[str, Any]) -> dict[str, Any]:
    if event["ev"] == "data":
        return {"event": {"data": {event["fd"]: base64.b64encode(event["data"]).decode()}}}
    return {"event": {"end": end_message(event)}}


def deadline_of(request: Request) -> float | None:
    """The stream's deadline (monotonic), from Connect-Timeout-Ms; None without one."""
    value = request.headers.get("connect-timeout-ms")
    if value is None:
        return None
    if not value.isdigit() or len(value) > 10:
        raise ConnectError("invalid_argument", "Connect-Timeout-Ms: a whole number of milliseconds")
    return time.monotonic() + int(value) / 1000


class SandboxEnded(Exception):
    """The command's sandbox was killed or paused under its stream: the stream is dropped."""


async def stream(command: Command, deadline: float | None, envd: EnvdChannel) -> AsyncIterator[bytes]:
    """The events of command, from its start until its end or the deadline. When the end comes
    because its sandbox is being killed or paused (``envd.ending``), the stream is dropped
    (``SandboxEnded``) as E2B drops it: the SDKs then find the sandbox gone (/health)
    and say it was killed."""
    queue = command.attach()
    try:
        yield envelope({"event": {"start": {"pid": command.pid}}})
        while True:
            wait = E2B_KEEPALIVE_SECONDS if deadline is None else min(E2B_KEEPALIVE_SECONDS,
                                                                     deadline - time.monotonic())
            try:
                event = await asyncio.wait_for(queue.get(), max(wait, 0))
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    yield end_stream(ConnectError("deadline_exceeded", "the command's deadline passed"))
                    return
                yield envelope({"event": {"keepalive": {}}})
                continue
            if event["ev"] == "end" and envd.ending:
                raise SandboxEnded(command.pid)
            yield envelope(event_message(event))
            command.took(event)  # sent on: the client read it, or its socket holds it
            if event["ev"] == "end":
                yield end_stream()
                return
    finally:
        command.detach(queue)


class EventStream(StreamingResponse):
    """A command's stream, its connection reset on ``SandboxEnded`` (``dropped``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except SandboxEnded:
            dropped.reset(self.scope)


def streaming(body: AsyncIterator[bytes]) -> StreamingResponse:
    return EventStream(body, media_type=STREAM_TYPE)


def command_line(config: dict[str, Any]) -> str:
    """The command as its row shows it: bash -l -c's script, else the argv joined."""
    args = [a for a in config.get("args") or [] if isinstance(a, str)]
    if len(args) >= 2 and args[-2] in ("-c", "-lc") and config.get("cmd", "").endswith("bash"):
        return args[-1]
    return " ".join([str(config.get("cmd", ""))] + args)


def terminal_size(message: dict[str, Any]) -> dict[str, Any] | None:
    """A request's ``pty.size`` ({cols, rows}, checked in the sandbox); None without a pty."""
    pty = message.get("pty")
    if not isinstance(pty, dict):
        return None
    size = pty.get("size")
    return size if isinstance(size, dict) else {}


class ProcessApi:
    """shared: the commands of shared sandboxes, noted in the record (``shared_commands``)."""

    def __init__(self, shared: SharedCommands | None = None):
        self.shared = shared

    async def start(self, request: Request, box: E2BSandbox, message: dict[str, Any]) -> Response:
        config = message.get("process")
        if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
            raise ConnectError("invalid_argument", "process.cmd: the program to run is needed")
        pty = terminal_size(message)
        deadline = deadline_of(request)
        envd = _envd(box)
        timeout_ms = None if deadline is None else max(1, round((deadline - time.monotonic()) * 1000))

        async def start(call_id: str) -> Command:
            await _keep_egress(box)
            reply = await envd.call("start", cmd=config["cmd"], args=config.get("args") or [],
                                    envs=config.get("envs") or {}, cwd=config.get("cwd"), tag=message.get("tag"),
                                    stdin=message.get("stdin", True) is not False, timeout_ms=timeout_ms,
                                    base_env=box.env_vars, run_id=box.run_id, call_id=call_id, pty=pty)
            started = envd.command(reply["pid"])
            if self.shared is not None:  # the service's helper is this server's build: its reply holds config
                await self.shared.started(box.id, started, reply["config"], message.get("tag"))
            return started

        command = await _recorder(box).command({"command": command_line(config), "e2b": {
            "cmd": config["cmd"], "args": config.get("args") or [], "cwd": config.get("cwd"),
            "tag": message.get("tag"), "timeout_ms": timeout_ms, "pty": pty}}, start)
        return streaming(stream(command, deadline, envd))

    async def connect(self, request: Request, box: E2BSandbox, message: dict[str, Any]) -> Response:
        command = await _selected(box, message)
        return streaming(stream(command, deadline_of(request), _envd(box)))

    async def list(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        """The sandbox's commands: this server's service's, and those other servers run (shared)."""
        listed = await _envd(box).call("list")
        if self.shared is not None:
            listed["processes"] = [*listed["processes"], *await self.shared.others(box.id, listed["processes"])]
        return listed

    async def send_signal(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        return await _envd(box).call("signal", pid=command.pid, signal=message.get("signal"))

    async def send_input(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        given = message.get("input")
        data = given.get("stdin", given.get("pty")) if isinstance(given, dict) else None
        if not isinstance(data, str):
            raise ConnectError("invalid_argument", "input.stdin or input.pty: base64 bytes are needed")
        return await _envd(box).call("input", pid=command.pid, b64=data)

    async def update(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        """A terminal's new size (``pty.size``); nothing to change without one."""
        command = await _selected(box, message, running=True)
        size = terminal_size(message)
        if size is None:
            return {}
        return await _envd(box).call("resize", pid=command.pid, cols=size.get("cols"), rows=size.get("rows"))

    async def close_stdin(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        return await _envd(box).call("close_stdin", pid=command.pid)


async def _keep_egress(box: E2BSandbox) -> None:
    """Before each command: the sandbox's egress proxy running (agent.network a list), started
    again when it died, as before each tool call; its failure is the command's (unavailable)."""
    try:
        await keep_egress(box.sandbox)
    except GuildsError as exc:
        raise ConnectError("unavailable", f"the sandbox's egress proxy: {exc}") from None


def _envd(box: E2BSandbox) -> EnvdChannel:
    if box.envd is None:
        raise ConnectError("unavailable", f"sandbox '{box.id}' is paused: connect to it to resume it")
    return box.envd


def _recorder(box: E2BSandbox) -> Recorder:
    if box.recorder is None:
        raise ConnectError("internal", f"sandbox '{box.id}' has no run")
    return box.recorder


async def _selected(box: E2BSandbox, message: dict[str, Any], running: bool = False) -> Command:
    """The command a ProcessSelector ({pid} or {tag}) names; not_found when none."""
    envd = _envd(box)
    selector = message.get("process")
    pid = selector.get("pid") if isinstance(selector, dict) else None
    tag = selector.get("tag") if isinstance(selector, dict) else None
    if isinstance(tag, str):
        listed = (await envd.call("list"))["processes"]
        pid = next((p["pid"] for p in listed if p.get("tag") == tag), None)
        if pid is None:
            raise ConnectError("not_found", f"process with tag '{tag}' not found")
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ConnectError("invalid_argument", "process: a pid or a tag is needed")
    command = envd.commands.get(pid) or (None if running else envd.ended.get(pid))
    if command is None:
        raise ConnectError("not_found", f"process with pid {pid} not found")
    return command


def json_answer(answer: dict[str, Any]) -> JSONResponse:
    return JSONResponse(answer)
