"""Run the guilds-code helper in a sandbox: a request in, its envelope out.

Two transports: ``call_helper`` runs one helper process per call (below);
``Transport`` picks between it and the resident helper (``channel``).

The argv is ``[sandbox.python, "-I", "-S", sandbox.helper_path("guilds-code"), ARG]``.
ARG is the request as base64 JSON when that is at most REQUEST_ARGV_MAX
characters; a longer one is written through the sandbox file API to
``<state root>/requests/<run id>-<call id>.json`` and ARG is that path (the
helper reads and deletes the file).

The helper must print exactly one envelope line. Otherwise the call fails with
``HelperFailed``: "code helper failed" and the last STDERR_TAIL_LINES lines of
its stderr; a helper still running after ``wait`` seconds is killed and
reported as "code helper failed: no answer within N s".
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from guilds_code import limits
from guilds_code.protocol import decode_envelope, encode_request

from ..config.checks import is_safe_name
from ..config.settings import TRANSPORTS
from ..errors import BadInput, HelperFailed, SandboxError
from ..limits import (
    AUTO_OPEN_WAIT_SECONDS,
    CHANNEL_REOPEN_AFTER_SECONDS,
    RESIDENT_IDLE_EXIT_SECONDS_DEFAULT,
    RESIDENT_KEEPALIVE_SECONDS,
    RESIDENT_ORPHAN_EXIT_SECONDS,
)
from ..sandbox.base import ExecResult, Sandbox
from ..sandbox.helpers import CODE_HELPER

if TYPE_CHECKING:
    from .resident_channel import ResidentChannel

HELPER = CODE_HELPER
FAILED = "code helper failed"


async def call_helper(sandbox: Sandbox, request: dict[str, Any], *, wait: float,
                      helper: str = HELPER) -> dict[str, Any]:
    """Run one request through a helper (guilds-code or guilds-harness); return its decoded envelope.

    Raises HelperFailed when no envelope comes back, BadInput when the request's
    run_id or call_id cannot name its request file, SandboxError from the sandbox.
    """
    arg = await _argument(sandbox, request)
    argv = [sandbox.python, "-I", "-S", sandbox.helper_path(helper), arg]
    result = await sandbox.exec(argv, timeout=wait)
    if result.timed_out:
        raise HelperFailed(_failure(f"{FAILED}: no answer within {wait:g} s", result))
    envelope = _envelope(result.stdout)
    if envelope is None:
        raise HelperFailed(_failure(FAILED, result))
    return envelope


async def _argument(sandbox: Sandbox, request: dict[str, Any]) -> str:
    encoded = encode_request(request)
    if len(encoded) <= limits.REQUEST_ARGV_MAX:
        return encoded
    names = [request.get("run_id"), request.get("call_id")]
    if not all(isinstance(n, str) and is_safe_name(n) for n in names):
        raise BadInput(f"run_id and call_id must be safe file names, got {names!r}")
    path = f"{sandbox.state_dir}/requests/{names[0]}-{names[1]}.json"
    await sandbox.write_file(path, json.dumps(request, ensure_ascii=False).encode())
    return path


def _envelope(stdout: bytes) -> dict[str, Any] | None:
    lines = stdout.splitlines()
    if len(lines) != 1:
        return None
    try:
        return decode_envelope(lines[0])
    except ValueError:  # binascii.Error, JSONDecodeError and UnicodeDecodeError included
        return None


def _failure(headline: str, result: ExecResult) -> str:
    """The headline, then the last STDERR_TAIL_LINES non-blank lines of stderr."""
    lines = [ln for ln in result.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    tail = lines[-limits.STDERR_TAIL_LINES:]
    if not tail and result.exit_code not in (0, None):
        tail = [f"(exit {result.exit_code}, nothing on stderr)"]
    return "\n".join([headline, *tail])


# --- the resident transport ---------------------------------------------------


def serve_argv(sandbox: Sandbox, max_in_flight: int, *, warm_first: bool = False) -> list[str]:
    """How the resident helper is started inside the sandbox (with ``--orphan-exit`` where the
    sandbox's channel is kept alive: ``keepalive_of``; ``--warm-first 1`` for one opened ahead
    of its calls, which imports every op before its hello)."""
    idle = getattr(sandbox, "idle_seconds", None) or RESIDENT_IDLE_EXIT_SECONDS_DEFAULT
    orphan = ["--orphan-exit", str(RESIDENT_ORPHAN_EXIT_SECONDS)] if keepalive_of(sandbox) else []
    warm = ["--warm-first", "1"] if warm_first else []
    return [sandbox.python, "-I", "-S", sandbox.helper_path(HELPER), "serve",
            "--max-in-flight", str(max_in_flight), "--idle-exit", str(max(1, round(idle))), *orphan, *warm]


def keepalive_of(sandbox: Sandbox) -> float | None:
    """The seconds between a channel's keepalives: RESIDENT_KEEPALIVE_SECONDS on a sandbox whose
    ``resident_keepalive`` says its channel's end may not reach the server; None elsewhere."""
    return RESIDENT_KEEPALIVE_SECONDS if getattr(sandbox, "resident_keepalive", False) else None


class Transport:
    """How one agent's requests reach guilds-code: ``exec`` (a process per call),
    ``resident`` (the channel; an error when it cannot open), or ``auto`` (the
    channel once it is open, else exec). guilds-harness always goes by exec.

    ``resident`` opens the channel in the first call that needs it, which waits
    for it. ``auto`` makes a call wait for it only where the sandbox forks its
    helpers warm (``forks_helpers``: bwrap under a root orchestrator), whose
    opening costs less than one exec, and then for at most AUTO_OPEN_WAIT_SECONDS
    (the opening goes on); a call whose wait ran out, or whose opening failed,
    goes by exec. Elsewhere the call that finds no channel starts opening one in
    the background and goes by exec, as do the calls made while it opens. After
    a failed opening, calls go by exec for CHANNEL_REOPEN_AFTER_SECONDS before
    the next try. A dead channel is replaced the same way. A call in flight
    when its channel died is run once more (on a new channel, or by exec under
    ``auto``) if the caller says it is ``rerunnable``
    (the tool's rule: it changes nothing); otherwise it fails with HelperFailed
    saying so.
    """

    def __init__(self, sandbox: Sandbox, mode: str = "auto", *, max_in_flight: int = 64):
        if mode not in TRANSPORTS:
            raise ValueError(f"transport: must be one of {', '.join(TRANSPORTS)}, got {mode!r}")
        self.sandbox, self.mode, self.max_in_flight = sandbox, mode, max_in_flight
        self._channel: ResidentChannel | None = None
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None
        self._finalizer: weakref.finalize | None = None
        self._opening: asyncio.Future[ResidentChannel | None] | None = None

    @property
    def channel(self) -> ResidentChannel | None:
        """The open channel, or None."""
        return self._channel

    async def opened(self) -> ResidentChannel | None:
        """Wait for the channel being opened in the background (auto), if any; the live channel or None."""
        if self._opening is not None:
            await asyncio.wait({self._opening})
        return self._live()

    async def warm(self) -> ResidentChannel | None:
        """Open the channel now and wait for it, its server warm before its hello
        (``--warm-first``); None under ``exec``, or under auto when it could not open (calls
        then go by exec, as the class docstring says)."""
        if self.mode == "exec":
            return None
        return await self._open(warm_first=True)

    async def call(self, request: dict[str, Any], *, wait: float, helper: str = HELPER,
                   rerunnable: bool = False) -> dict[str, Any]:
        if helper != HELPER or self.mode == "exec":
            return await call_helper(self.sandbox, request, wait=wait, helper=helper)
        from .resident_channel import ChannelDied

        for attempt in (1, 2):
            channel = await self._channel_for_call()
            if channel is None:
                return await call_helper(self.sandbox, request, wait=wait)
            try:
                return await channel.call(request, wait)
            except ChannelDied as exc:
                if attempt == 2 or not rerunnable:
                    raise HelperFailed(f"{FAILED}: the resident helper ended while the call ran "
                                       f"({exc.message}); the call may have run in part") from None
        raise AssertionError("unreachable")

    def _live(self) -> ResidentChannel | None:
        channel = self._channel
        return channel if channel is not None and not channel.dead else None

    async def _channel_for_call(self) -> ResidentChannel | None:
        """The live channel for this call; None: it goes by exec (see the class docstring)."""
        channel = self._live()
        if channel is not None:
            return channel
        if self.mode == "resident":
            return await self._open()
        backing_off = self._failed_at is not None and time.monotonic() - self._failed_at < CHANNEL_REOPEN_AFTER_SECONDS
        if self._opening is None and not backing_off:
            self._opening = asyncio.ensure_future(self._open())
            self._opening.add_done_callback(self._opened)
        if self._opening is not None and getattr(self.sandbox, "forks_helpers", False):
            return await self._opened_soon(self._opening)
        return None

    @staticmethod
    async def _opened_soon(opening: asyncio.Future[ResidentChannel | None]) -> ResidentChannel | None:
        """The channel being opened, once open within AUTO_OPEN_WAIT_SECONDS; None (the call
        goes by exec) when it is not by then, or failed. Neither the wait's end nor a cancelled
        call stops the opening."""
        done, _ = await asyncio.wait({opening}, timeout=AUTO_OPEN_WAIT_SECONDS)
        if not done or opening.cancelled() or opening.exception() is not None:
            return None
        opened = opening.result()
        return opened if opened is not None and not opened.dead else None

    def _opened(self, task: asyncio.Future[ResidentChannel | None]) -> None:
        self._opening = None
        if not task.cancelled() and task.exception() is not None:  # retrieved: auto goes by exec
            self._failed_at = time.monotonic()

    async def _open(self, *, warm_first: bool = False) -> ResidentChannel | None:
        """Open the channel unless one is live; None when auto falls back to exec."""
        from .resident_channel import ChannelDied, ResidentChannel

        async with self._lock:
            if self._live() is not None:
                return self._channel
            await self.close()
            try:
                self._channel = await ResidentChannel.open(
                    self.sandbox, serve_argv(self.sandbox, self.max_in_flight, warm_first=warm_first),
                    keepalive=keepalive_of(self.sandbox))
            except (ChannelDied, SandboxError) as exc:
                if self.mode == "resident":
                    raise SandboxError(f"cannot open the resident helper: {exc}") from exc
                self._failed_at = time.monotonic()
                return None
            self._failed_at = None
            # A toolbox dropped without close(): its server is ended when the transport is collected.
            self._finalizer = weakref.finalize(self, _close_in_background, self._channel)
            return self._channel

    async def close(self) -> None:
        """End the channel, if one is open (the next call opens another)."""
        channel, self._channel = self._channel, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if channel is not None:
            await channel.close()


def _close_in_background(channel: ResidentChannel) -> None:
    """End a channel whose transport is gone, from a thread (closing may wait)."""
    threading.Thread(target=channel.abandon, daemon=True, name="guilds-resident-close").start()
