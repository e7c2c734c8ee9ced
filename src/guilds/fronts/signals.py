"""A front's stop signals: SIGTERM, SIGINT or SIGHUP turned into a cancellation, once.

A cancelled toolbox call stops its helper (SIGTERM, then SIGKILL to the
helper's group; the helper stops its command's group) and records the call
``cancelled``; ``until_stopped`` turns a stop signal into that cancellation,
and raises ``Stopped`` once what it awaited has ended.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TypeVar

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
T = TypeVar("T")


class Stopped(Exception):
    """A stop signal arrived; what ran was cancelled (and its call recorded so)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name


async def until_stopped(awaitable: Awaitable[T]) -> T:
    """Await it; the first SIGTERM, SIGINT or SIGHUP cancels it once (later ones are
    ignored: the stop is under way) and, once it has ended, raises Stopped."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(awaitable)
    got: list[int] = []

    def stop(signum: int) -> None:
        if not got:
            got.append(signum)
            task.cancel()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise Stopped(got[0]) from None
        raise
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)
