"""The call gate of one agent's sandbox: calls share it, a rewind holds it alone.

Two flock'd files in the agent's checkpoint folder, so the gate holds across
every process serving the agent (an MCP server, ``guilds call``, the Python
API): a call takes ``turn.lock`` shared for a moment, then ``calls.lock``
shared while it runs; a rewind takes ``turn.lock`` alone (no new call starts),
then ``calls.lock`` alone (the running calls have ended). Waiting polls without
blocking (``limits.CHECKPOINT_GATE_POLL_SECONDS``), so a waiter can be cancelled at any moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path
from typing import AsyncIterator

from ..limits import CHECKPOINT_GATE_POLL_SECONDS


async def _flock(fd: int, mode: int) -> None:
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(CHECKPOINT_GATE_POLL_SECONDS)


class CallGate:
    def __init__(self, folder: Path):
        self.folder = folder

    def _open(self, name: str) -> int:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(self.folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Held (shared) while one call runs."""
        turn, calls = self._open("turn.lock"), self._open("calls.lock")
        try:
            await _flock(turn, fcntl.LOCK_SH)
            await _flock(calls, fcntl.LOCK_SH)
            os.close(turn)
            turn = -1
            yield
        finally:
            for fd in (turn, calls):
                if fd >= 0:
                    os.close(fd)

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Held by one rewind, once no call runs; calls wait until it is let go."""
        turn, calls = self._open("turn.lock"), self._open("calls.lock")
        try:
            await _flock(turn, fcntl.LOCK_EX)
            await _flock(calls, fcntl.LOCK_EX)
            yield
        finally:
            os.close(calls)
            os.close(turn)
