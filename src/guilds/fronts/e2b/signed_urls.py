"""Signed file URLs (``download_url``, ``upload_url``): a ``/files`` request that carries a
signature instead of the sandbox's headers, as E2B's envd checks it.

The signature is ``v1_`` then the SHA-256, base64 without padding, of
``<path>:<operation>:<username>:<access token>`` (``:<expiration>`` after it when the URL
has ``signature_expiration``, a Unix time in seconds): ``path`` and ``username`` as the
query gives them (none: empty), ``operation`` ``read`` for GET and ``write`` for POST, the
access token the sandbox's own (its create answer's ``envdAccessToken``). Such a URL names
no sandbox (E2B tells its sandboxes apart by host name; here one URL serves them all): the
sandbox is the one whose access token makes that signature (the one the
``E2b-Sandbox-Id`` header names, when it is sent), compared in constant time. None: 401
``invalid signature``; its expiration past: 401 ``signature is already expired``; E2B's
body, ``{"code": 401, "message": ...}``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterable

from starlette.requests import Request

from .connect import ConnectError
from .sandboxes import E2BSandbox

READ, WRITE = "read", "write"


def signature(path: str, operation: str, username: str, access_token: str, expiration: int | None) -> str:
    """E2B's v1 signature of a file URL."""
    signed = ":".join([path, operation, username, access_token, *([] if expiration is None else [str(expiration)])])
    digest = hashlib.sha256(signed.encode("utf-8", "surrogateescape")).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def _expiration(request: Request) -> int | None:
    value = request.query_params.get("signature_expiration")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConnectError("invalid_argument", f"signature_expiration: a Unix time in seconds, "
                                               f"not {value[:32]!r}") from None


def signed_sandbox(request: Request, candidates: Iterable[E2BSandbox]) -> E2BSandbox:
    """The sandbox the request's signature was made with (the module docstring's rules)."""
    given = request.query_params.get("signature", "").encode("utf-8", "surrogateescape")
    expiration = _expiration(request)
    operation = READ if request.method == "GET" else WRITE
    path, username = request.query_params.get("path", ""), request.query_params.get("username", "")
    found = None
    for box in candidates:  # every one compared, so the time taken says nothing of which matched
        expected = signature(path, operation, username, box.access_token, expiration).encode()
        if hmac.compare_digest(expected, given):
            found = box
    if found is None:
        raise ConnectError("unauthenticated", "invalid signature")
    if expiration is not None and expiration < time.time():
        raise ConnectError("unauthenticated", "signature is already expired")
    return found
