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

from ...errors import GuildsError
from ...limits import E2B_KEEPALIVE_SECONDS, E2B_RECORD_OUTPUT_BYTES
from ...sandbox.base import Sandbox
from ...toolbox.tools import SHELL
from .connect import STREAM_TYPE, ConnectError, end_stream, envelope
from .envd_channel import Command, EnvdChannel
from .recording import Open, Recorder
from .sandboxes import E2BSandbox

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


async def stream(command: Command, deadline: float | None) -> AsyncIterator[bytes]:
    """The events of command, from its start until its end or the deadline."""
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
            yield envelope(event_message(event))
            if event["ev"] == "end":
                yield end_stream()
                return
    finally:
        command.queues.discard(queue)


def streaming(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type=STREAM_TYPE)


class Output:
    """What a command's record keeps: the head of its stdout, then of its stderr."""

    def __init__(self) -> None:
        self.parts: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def __call__(self, event: dict[str, Any]) -> None:
        if event["ev"] == "data":
            part = self.parts[event["fd"]]
            room = E2B_RECORD_OUTPUT_BYTES - len(part)
            if room > 0:
                part += event["data"][:room]

    def text(self) -> str:
        out, err = (bytes(p).decode("utf-8", "replace") for p in self.parts.values())
        return out + (f"\n[stderr]\n{err}" if err else "")


def command_line(config: dict[str, Any]) -> str:
    """The command as its row shows it: bash -l -c's script, else the argv joined."""
    args = [a for a in config.get("args") or [] if isinstance(a, str)]
    if len(args) >= 2 and args[-2] in ("-c", "-lc") and config.get("cmd", "").endswith("bash"):
        return args[-1]
    return " ".join([str(config.get("cmd", ""))] + args)


class ProcessApi:
    async def start(self, request: Request, box: E2BSandbox, message: dict[str, Any]) -> Response:
        config = message.get("process")
        if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
            raise ConnectError("invalid_argument", "process.cmd: the program to run is needed")
        if message.get("pty"):
            raise ConnectError("unimplemented", "pty: terminals are not served; run the command without one")
        deadline = deadline_of(request)
        envd, recorder = _envd(box), _recorder(box)
        timeout_ms = None if deadline is None else max(1, round((deadline - time.monotonic()) * 1000))
        call = await recorder.begin(SHELL.name, {"command": command_line(config), "e2b": {
            "cmd": config["cmd"], "args": config.get("args") or [], "cwd": config.get("cwd"),
            "tag": message.get("tag"), "timeout_ms": timeout_ms}})
        try:
            await _keep_egress(box)
            reply = await envd.call("start", cmd=config["cmd"], args=config.get("args") or [],
                                    envs=config.get("envs") or {}, cwd=config.get("cwd"), tag=message.get("tag"),
                                    stdin=message.get("stdin", True) is not False, timeout_ms=timeout_ms,
                                    base_env=box.env_vars, run_id=box.run_id, call_id=call.call_id)
        except ConnectError as exc:
            await recorder.finish(call, str(exc), is_error=True, meta={"code": exc.code})
            raise
        command = envd.command(reply["pid"])
        _record_when_ended(command, recorder, call, box.sandbox)
        return streaming(stream(command, deadline))

    async def connect(self, request: Request, box: E2BSandbox, message: dict[str, Any]) -> Response:
        command = await _selected(box, message)
        return streaming(stream(command, deadline_of(request)))

    async def list(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        return await _envd(box).call("list")

    async def send_signal(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        return await _envd(box).call("signal", pid=command.pid, signal=message.get("signal"))

    async def send_input(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        given = message.get("input")
        data = given.get("stdin") if isinstance(given, dict) else None
        if not isinstance(data, str):
            raise ConnectError("invalid_argument", "input.stdin: base64 bytes are needed")
        return await _envd(box).call("input", pid=command.pid, b64=data)

    async def close_stdin(self, box: E2BSandbox, message: dict[str, Any]) -> dict[str, Any]:
        command = await _selected(box, message, running=True)
        return await _envd(box).call("close_stdin", pid=command.pid)


def _record_when_ended(command: Command, recorder: Recorder, call: Open, sandbox: Sandbox) -> None:
    output = Output()
    for event in command.early:
        output(event)

    def watch(event: dict[str, Any]) -> None:
        output(event)
        if event["ev"] == "end":
            code = event["exit_code"] if not event.get("signal") else -1
            meta = {"exit_code": code, "timed_out": bool(event.get("timed_out")), "pid": command.pid}
            if event.get("signal"):
                meta["signal"] = event["signal"]
            task = asyncio.get_running_loop().create_task(_finish(recorder, call, output.text(), meta, sandbox))
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    command.watchers.append(watch)
    if command.end is not None:
        watch(command.end)


async def _finish(recorder: Recorder, call: Open, text: str, meta: dict[str, Any], sandbox: Sandbox) -> None:
    await recorder.finish(call, text, is_error=False, meta=meta)  # as a shell call's exit
    await recorder.egress(call, sandbox)


_PENDING: set[asyncio.Task] = set()


async def recorded(timeout: float) -> None:
    """Wait up to timeout for the records of the commands that have ended (a server stopping)."""
    if _PENDING:
        await asyncio.wait(set(_PENDING), timeout=timeout)


async def _keep_egress(box: E2BSandbox) -> None:
    """Before each command: the sandbox's egress proxy running (agent.network a list), started
    again when it died, as before each tool call; its failure is the command's (unavailable)."""
    keep = getattr(box.sandbox, "keep_egress", None)
    if keep is None:
        return
    try:
        await keep()
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
