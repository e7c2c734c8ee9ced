"""The Connect protocol as the E2B SDKs speak it to the in-sandbox API, JSON codec only.

Unary calls: ``POST /<service>/<Method>`` with ``Content-Type: application/json``,
the message as protobuf's JSON mapping; the answer the same, or an error: the
code's HTTP status with ``{"code": "<connect code>", "message": ...}``.

Server streams: ``Content-Type: application/connect+json``; the request body and
every response message are envelopes (one flag byte, a 4-byte big-endian length,
the JSON); the stream ends with an end-stream envelope (flag 0x02) holding ``{}``
or ``{"error": {...}}``. The binary codec (``application/proto``) is answered
415 (``Accept-Post`` naming JSON) with a Connect error: the SDKs use JSON.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from ...limits import E2B_DRAIN_BYTES, E2B_MAX_JSON_DEPTH, E2B_MAX_MESSAGE_BYTES

STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
    "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
    "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}
"""Each Connect error code's HTTP status (the Connect protocol's own table)."""
UNSUPPORTED_TYPE = 415
"""The HTTP status of a request in a codec not served (Connect's answer to one)."""
UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
ENVELOPE_BYTES = 5
"""A stream envelope's head: the flag byte and the 4-byte length."""


class ConnectError(Exception):
    """An error answered in Connect's shape: ``code`` one of STATUS's keys, one line;
    ``status`` its HTTP status (the code's, unless given)."""

    def __init__(self, code: str, message: str, status: int | None = None):
        super().__init__(message)
        self.code = code if code in STATUS else "unknown"
        self.status = status or STATUS[self.code]


def error_body(exc: ConnectError) -> dict[str, Any]:
    return {"code": exc.code, "message": str(exc)}


def error_response(exc: ConnectError) -> JSONResponse:
    """The answer to a failed unary call, or to a stream refused before it began."""
    headers = {"Accept-Post": UNARY_TYPE} if exc.status == UNSUPPORTED_TYPE else None
    return JSONResponse(error_body(exc), status_code=exc.status, headers=headers)


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(exc: ConnectError | None = None) -> bytes:
    return envelope({} if exc is None else {"error": error_body(exc)}, END_STREAM)


def json_object(data: bytes) -> dict[str, Any]:
    """The JSON object a body holds (empty: ``{}``); ``invalid_argument`` for anything else,
    also for an object nested deeper than E2B_MAX_JSON_DEPTH."""
    too_deep = ConnectError("invalid_argument", f"the request nests deeper than {E2B_MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(data) if data.strip() else {}
    except RecursionError:
        raise too_deep from None
    except ValueError:
        raise ConnectError("invalid_argument", "the request is not a valid JSON message") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the request is not a JSON object")
    if _deeper_than(value, E2B_MAX_JSON_DEPTH):
        raise too_deep
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether value's lists and objects nest more than limit levels (value itself the first)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        inner = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in inner if isinstance(child, (dict, list)))
    return False


async def bounded_body(request: Request, limit: int, status: int | None = None) -> bytes:
    """The request's body, never more than limit bytes of it held: past it ``resource_exhausted``
    (``status``: its HTTP status, the code's by default), after up to E2B_DRAIN_BYTES more were
    read and dropped so that the client reads the answer."""
    declared = request.headers.get("content-length", "")
    chunks, data = request.stream(), bytearray()
    if not (declared.isdigit() and int(declared) > limit):
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                break
        else:
            return bytes(data)
    data.clear()
    dropped = 0
    async for chunk in chunks:
        dropped += len(chunk)
        if dropped > E2B_DRAIN_BYTES:
            break
    raise ConnectError("resource_exhausted", f"the request body is over {limit} bytes", status=status)


def _check_type(content_type: str, wanted: str) -> None:
    """A JSON type of the other kind (unary for stream): invalid_argument; any other codec
    (``application/proto``): HTTP 415, as Connect answers a content type it does not serve."""
    given = content_type.split(";", 1)[0].strip().lower()
    if given == wanted:
        return
    message = f"content type {given or 'none'!r}: only {wanted} is served"
    if given.endswith("json"):
        raise ConnectError("invalid_argument", message)
    raise ConnectError("unimplemented", message, status=UNSUPPORTED_TYPE)


def unary_request(content_type: str, body: bytes) -> dict[str, Any]:
    """The message of a unary call."""
    _check_type(content_type, UNARY_TYPE)
    if len(body) > E2B_MAX_MESSAGE_BYTES:
        raise ConnectError("resource_exhausted", f"the request is over {E2B_MAX_MESSAGE_BYTES} bytes")
    return json_object(body)


def stream_request(content_type: str, body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's enveloped request body."""
    _check_type(content_type, STREAM_TYPE)
    if len(body) < ENVELOPE_BYTES:
        raise ConnectError("invalid_argument", "the request holds no envelope")
    flags, size = struct.unpack(">BI", body[:ENVELOPE_BYTES])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed messages are not served")
    if size != len(body) - ENVELOPE_BYTES or size > E2B_MAX_MESSAGE_BYTES:
        raise ConnectError("invalid_argument", "the envelope's length does not match the request body")
    return json_object(body[ENVELOPE_BYTES:])
