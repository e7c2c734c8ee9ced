"""Each in-sandbox request of an E2B sandbox, recorded as a call of its run.

Every request goes through the toolbox's own path (``Toolbox.call_outside``): its
slot in the agent's ``max_tool_calls``, the pipeline (redaction, the cap, the
trailer), the record with its savings (``secrets_redacted``), a cancellation or
failure recorded as any call's. Past the budget a request is refused with
``resource_exhausted`` and the toolbox's own text (``BUDGET_REFUSED``), and runs
nothing.

A command is a ``shell`` call (``{"command": ..., "e2b": {...}}``; its row
``Run <command>``, ``exit N`` or ``timed out`` as a shell call's), recorded when
it ends with its output (the head of stdout, then of stderr). Every other
request is a call of its own tool name (``e2b filesystem.Stat``, ``e2b
files.write``...) with its arguments. Behind the egress proxy, a command's
connections are recorded under its call when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ...errors import GuildsError
from ...limits import E2B_RECORD_OUTPUT_BYTES
from ...toolbox import Toolbox
from ...toolbox.toolbox import BUDGET_REFUSED, Outcome
from ...toolbox.tools import SHELL
from .connect import ConnectError
from .envd_channel import Command

Start = Callable[[str], Awaitable[Command]]
"""Starts a command given its call id (its connections are recorded under it)."""


class Output:
    """What a command's record keeps: the head of its stdout, then of its stderr."""

    def __init__(self) -> None:
        self.parts: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def __call__(self, event: dict[str, Any]) -> None:
        if event["ev"] == "data":
            part = self.parts["stderr" if event["fd"] == "stderr" else "stdout"]  # a terminal's: stdout
            room = E2B_RECORD_OUTPUT_BYTES - len(part)
            if room > 0:
                part += event["data"][:room]

    def text(self) -> str:
        out, err = (bytes(p).decode("utf-8", "replace") for p in self.parts.values())
        return out + (f"\n[stderr]\n{err}" if err else "")


def end_meta(event: dict[str, Any], pid: int) -> dict[str, Any]:
    """A command's metadata from its end event, as a shell call's exit."""
    meta: dict[str, Any] = {"exit_code": -1 if event.get("signal") else event["exit_code"],
                            "timed_out": bool(event.get("timed_out")), "pid": pid}
    if event.get("signal"):
        meta["signal"] = event["signal"]
    return meta


async def ended(command: Command) -> Outcome:
    """The command's outcome when it ends: its output's head and its exit."""
    output, end = Output(), asyncio.get_running_loop().create_future()
    for event in command.early:
        output(event)

    def watch(event: dict[str, Any]) -> None:
        output(event)
        if event["ev"] == "end" and not end.done():
            end.set_result(event)

    command.watchers.append(watch)
    if command.end is not None:
        watch(command.end)
    meta = end_meta(await end, command.pid)
    return Outcome(output.text(), False, meta)


def _failed(exc: ConnectError) -> Outcome:
    return Outcome(str(exc), True, {"code": exc.code})


class Recorder:
    """The calls of one E2B sandbox's run, made through its agent's toolbox."""

    def __init__(self, toolbox: Toolbox, run_id: str):
        self.toolbox, self.run_id = toolbox, run_id

    def refused(self) -> ConnectError:
        return ConnectError("resource_exhausted", BUDGET_REFUSED.format(n=self.toolbox.settings.max_tool_calls))

    async def one(self, tool: str, args: Any, result: Coroutine[Any, Any, Any]) -> Any:
        """Record one request around awaiting ``result``: its answer, or its error; past the
        budget ``result`` is never awaited."""
        ran: list[Any] = []

        async def run(call_id: str) -> Outcome:
            try:
                ran.append(await result)
            except ConnectError as exc:
                ran.append(exc)
                return _failed(exc)
            except GuildsError as exc:  # the sandbox's process service could not be reached
                ran.append(ConnectError("unavailable", str(exc)))
                return _failed(ran[-1])
            return Outcome("ok", False)

        await self.toolbox.call_outside(self.run_id, tool, args, run)
        if not ran:
            result.close()
            raise self.refused()
        if isinstance(ran[0], ConnectError):
            raise ran[0]
        return ran[0]

    async def command(self, args: Any, start: Start) -> Command:
        """Record a command from its start to its end: the started command, once it runs (its
        record is written when it ends, whatever happens to its streams); start's error, or
        ``resource_exhausted`` past the budget."""
        started: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        started.add_done_callback(lambda f: f.cancelled() or f.exception())  # a caller gone: no warning

        async def run(call_id: str) -> Outcome:
            try:
                command = await start(call_id)
            except ConnectError as exc:
                started.set_exception(exc)
                return _failed(exc)
            started.set_result(command)
            return await ended(command)

        task = asyncio.get_running_loop().create_task(self.toolbox.call_outside(self.run_id, SHELL.name, args, run))
        _PENDING.add(task)
        task.add_done_callback(_done)
        first: set[asyncio.Future[Any]] = {started, task}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # the record's own failure, if it failed
            raise self.refused()
        return started.result()


_PENDING: set[asyncio.Task] = set()


def _done(task: asyncio.Task) -> None:
    _PENDING.discard(task)
    if not task.cancelled():
        task.exception()  # recorded as the call's failure already: no second report


async def recorded(timeout: float) -> None:
    """Wait up to timeout for the records of the commands that have ended (a server stopping)."""
    if _PENDING:
        await asyncio.wait(set(_PENDING), timeout=timeout)
