"""The Connect protocol as the E2B SDKs speak it to the in-sandbox API, JSON codec only.

Unary calls: ``POST /<service>/<Method>`` with ``Content-Type: application/json``,
the message as protobuf's JSON mapping; the answer the same, or an error: the
code's HTTP status with ``{"code": "<connect code>", "message": ...}``.

Server streams: ``Content-Type: application/connect+json``; the request body and
every response message are envelopes (one flag byte, a 4-byte big-endian length,
the JSON); the stream ends with an end-stream envelope (flag 0x02) holding ``{}``
or ``{"error": {...}}``. The binary codec (``application/proto``) is answered
415 with a Connect error: the SDKs use JSON.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from starlette.responses import JSONResponse

from ...limits import E2B_MAX_MESSAGE_BYTES

STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
    "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
    "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}
"""Each Connect error code's HTTP status (the Connect protocol's own table)."""
UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02


class ConnectError(Exception):
    """An error answered in Connect's shape: ``code`` one of STATUS's keys, one line."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code if code in STATUS else "unknown"


def error_body(exc: ConnectError) -> dict[str, Any]:
    return {"code": exc.code, "message": str(exc)}


def error_response(exc: ConnectError) -> JSONResponse:
    """The answer to a failed unary call, or to a stream refused before it began."""
    return JSONResponse(error_body(exc), status_code=STATUS[exc.code])


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(exc: ConnectError | None = None) -> bytes:
    return envelope({} if exc is None else {"error": error_body(exc)}, END_STREAM)


def _object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data.strip() else {}
    except ValueError:
        raise ConnectError("invalid_argument", "the request is not a valid JSON message") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the request is not a JSON object")
    return value


def _check_type(content_type: str, wanted: str) -> None:
    given = content_type.split(";", 1)[0].strip().lower()
    if given != wanted:
        raise ConnectError("invalid_argument" if given.endswith("json") else "unimplemented",
                           f"content type {given or 'none'!r}: only {wanted} is served")


def unary_request(content_type: str, body: bytes) -> dict[str, Any]:
    """The message of a unary call."""
    _check_type(content_type, UNARY_TYPE)
    if len(body) > E2B_MAX_MESSAGE_BYTES:
        raise ConnectError("resource_exhausted", f"the request is over {E2B_MAX_MESSAGE_BYTES} bytes")
    return _object(body)


def stream_request(content_type: str, body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's enveloped request body."""
    _check_type(content_type, STREAM_TYPE)
    if len(body) < 5:
        raise ConnectError("invalid_argument", "the request holds no envelope")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed messages are not served")
    if size != len(body) - 5 or size > E2B_MAX_MESSAGE_BYTES:
        raise ConnectError("invalid_argument", "the envelope's length does not match the request body")
    return _object(body[5:])
