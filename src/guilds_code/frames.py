"""The resident helper's frames, defined once for both sides (``guilds-code serve``).

A frame is one line of UTF-8 JSON ending in ``\\n`` (JSON escapes every
newline inside a string, so a line is a frame). Every frame carries
``"v": VERSION``.

Orchestrator -> helper (stdin):

    {"v": 1, "id": ID, "request": {...}}   a request, the one-shot request object
    {"v": 1, "id": ID, "cancel": true}     stop request ID (its command's whole group)
    {"v": 1, "direct": TOKEN}              the token of the TCP channel offered (``direct``)
    (a bare newline)                       a keepalive: the orchestrator lives (``--orphan-exit``)

Helper -> orchestrator (stdout), in any order:

    {"v": 1, "hello": "guilds-code", "max_in_flight": N, "max_frame_bytes": M, "pid": P}
                                           first, once, when the helper is ready; with
                                           ``"direct": PORT`` where ``serve --direct 1``
                                           offers the channel over TCP, and again on that
                                           socket once it is the channel (``direct``)
    {"v": 1, "id": ID, "envelope": E}      the answer to request ID, once; E is the
                                           one-shot envelope line (base64 JSON)

ID is a name ([A-Za-z0-9._-], at most 128, no ``..``). A frame that cannot be
read (too long, not JSON, another version, no usable id) is answered with an
error envelope under its id when one can be found at its start, else under
``"id": null``; the channel keeps working either way.
"""

from __future__ import annotations

from . import codec

VERSION = 1
"""Bumped on any change an older peer would misread: both sides refuse another."""
HELLO = "guilds-code"
MAX_IN_FLIGHT_DEFAULT = 64
"""Requests one server runs at once; the next is refused at once, not queued."""
KEEPALIVE = b"\n"
"""An empty line: no frame, only word that the orchestrator still holds the channel."""
FRAME_SLACK_BYTES = 4096
"""Room around the request object for the frame's own fields."""


def max_frame_bytes(request_max: int) -> int:
    """The longest frame read: the largest request plus the frame's own fields."""
    return request_max + FRAME_SLACK_BYTES


def request_frame(frame_id: str, request_json: bytes) -> bytes:
    """A request frame around the request object's UTF-8 JSON."""
    return b'{"v":%d,"id":"%s","request":%s}\n' % (VERSION, frame_id.encode(), request_json)


def cancel_frame(frame_id: str) -> bytes:
    return b'{"v":%d,"id":"%s","cancel":true}\n' % (VERSION, frame_id.encode())


def answer_frame(frame_id: "str | None", envelope_line: bytes) -> bytes:
    """The answer frame around an envelope line (its newline dropped)."""
    quoted = b"null" if frame_id is None else b'"%s"' % frame_id.encode()
    return b'{"v":%d,"id":%s,"envelope":"%s"}\n' % (VERSION, quoted, envelope_line.strip())


def hello_frame(max_in_flight: int, max_frame: int, pid: int, **offered: int) -> bytes:
    """The hello; offered: ``direct=PORT`` where the channel is offered over TCP (``direct``)."""
    body = {"v": VERSION, "hello": HELLO, "max_in_flight": max_in_flight,
            "max_frame_bytes": max_frame, "pid": pid, **offered}
    return codec.dumps(body).encode() + b"\n"


def leading_id(line: bytes) -> "str | None":
    """The id of a frame that could not be parsed, when it opens the frame as
    the orchestrator writes it (``{"v": 1, "id": "...``, spaces optional); else None."""
    import re  # only for a frame gone wrong

    found = re.match(rb'\{\s*"v"\s*:\s*%d\s*,\s*"id"\s*:\s*"([A-Za-z0-9._-]{1,128})"' % VERSION, line[:300])
    return found.group(1).decode("ascii") if found else None
