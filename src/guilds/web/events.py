"""A run's new calls as they land: server-sent events, from polling the run record.

The record is the only channel: a call made by this process, by ``guilds
call`` or by an MCP client elsewhere all land in the same tables, so each open
stream asks the store every ``APP_EVENTS_POLL_SECONDS`` for the calls past the point it
has shown, and sends each call that is new or changed (a running call that
finished) as one ``call`` event whose data is the row's HTML.

Each event's id is the resume point (as ``flow.resume_after``): the seq up
to which every call the stream has sent is final. The browser's
EventSource sends it back as ``Last-Event-ID`` when it reconnects, and the new
stream starts there. A stream is bounded: it ends after ``APP_STREAM_MAX_SECONDS``
(the browser reconnects after ``APP_RETRY_MS``), or as soon as the client leaves
(Starlette's StreamingResponse listens for the disconnect and cancels it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from ..limits import APP_EVENTS_POLL_SECONDS, APP_STREAM_MAX_SECONDS
from ..record.values import CallRecord
from .flow import running

Fetch = Callable[[int], Awaitable[list[CallRecord]]]
"""The calls past a seq, in seq order: a page of at most ``page`` of them."""


def sse_message(event: str, data: str, id: int | None = None) -> str:
    """One server-sent event: every line of data on a ``data:`` line of its own."""
    lines = [f"event: {event}"] + ([f"id: {id}"] if id is not None else [])
    lines += [f"data: {line}" for line in data.split("\n")]
    return "\n".join(lines) + "\n\n"


def _signature(call: CallRecord) -> tuple:
    return (call.status, call.is_error, call.row)


async def _past(fetch: Fetch, after: int, page: int) -> list[CallRecord]:
    """Every call past ``after``, page by page."""
    calls: list[CallRecord] = []
    while True:
        more = await fetch(after)
        calls += more
        if len(more) < page:
            return calls
        after = more[-1].seq


async def call_updates(fetch: Fetch, after: int, *, page: int, poll: float = APP_EVENTS_POLL_SECONDS,
                       max_seconds: float = APP_STREAM_MAX_SECONDS) -> AsyncIterator[tuple[CallRecord, int]]:
    """(call, resume point) for each call past ``after`` that is new or changed, until
    ``max_seconds`` pass. The server cancels the stream when the client leaves."""
    sent: dict[int, tuple] = {}
    deadline = time.monotonic() + max_seconds
    while True:
        point, pinned = after, False
        for call in await _past(fetch, after, page):
            pinned = pinned or running(call)
            point = point if pinned else call.seq
            if sent.get(call.seq) != _signature(call):
                sent[call.seq] = _signature(call)
                yield call, point
        after = point
        sent = {seq: sig for seq, sig in sent.items() if seq > after}
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(poll)
