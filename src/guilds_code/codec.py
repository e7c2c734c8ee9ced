"""JSON and base64 for the wire, without importing json, base64 or re.

Importing json (which imports re, enum...) costs a shell call of ``true`` more
than all of its own work, so the helper calls the C accelerators that json and
base64 use themselves: ``_json``'s scanner and encoder, and ``binascii``.

The results are json's and base64's, byte for byte: ``dumps`` is what
``json.dumps(obj, ensure_ascii=False, separators=...)`` builds, ``loads``
what ``json.loads`` returns, ``b64decode`` is ``base64.b64decode(validate=True)``.
Whatever the fast path does not take (an error, an unusual value, an
interpreter without ``_json``) is handed to the json module itself, so even the
error messages are json's.
"""

import binascii
import sys

try:
    import _json
except ImportError:  # not CPython: json does it all
    _json = None  # type: ignore[assignment]

_WHITESPACE = " \t\n\r"
"""What json skips around a document."""
_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


class _Decoding:
    """The attributes _json's scanner reads from its json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    def __init__(self, parse_constant):
        self.parse_constant = parse_constant


def _not_serializable(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def loads(text: str, parse_constant=None):
    """json.loads(text, parse_constant=parse_constant)."""
    if _json is not None:
        try:
            start = len(text) - len(text.lstrip(_WHITESPACE))
            # json's own default maps NaN, Infinity and -Infinity as float() does
            scan = _json.make_scanner(_Decoding(parse_constant or float))  # type: ignore[arg-type]
            value, end = scan(text, start)
            if not text[end:].strip(_WHITESPACE):
                return value
        except Exception:  # noqa: BLE001, S110 - json redoes it and raises its own error
            # (3.9-3.11's scanner cannot even build its error before json.decoder is imported)
            pass
    import json

    return json.loads(text, parse_constant=parse_constant)


def dumps(obj, separators=(",", ":")) -> str:
    """json.dumps(obj, ensure_ascii=False, separators=separators)."""
    if _json is not None and not isinstance(obj, str):
        item, key = separators
        try:
            encode = _json.make_encoder(
                {}, _not_serializable, _json.encode_basestring, None, key, item, False, False, True
            )
            return "".join(encode(obj, 0))
        except Exception:  # noqa: BLE001, S110 - json redoes it and raises its own error
            pass
    import json

    return json.dumps(obj, ensure_ascii=False, separators=separators)


def b64encode(data: bytes) -> bytes:
    """base64.b64encode(data)."""
    return binascii.b2a_base64(data, newline=False)


def b64decode(data: bytes) -> bytes:
    """base64.b64decode(data, validate=True); binascii.Error when not base64."""
    if sys.version_info >= (3, 11):
        return binascii.a2b_base64(data, strict_mode=True)
    body = data.rstrip(b"=")
    if len(data) - len(body) > 2 or body.translate(None, _B64_ALPHABET):
        raise binascii.Error("Non-base64 digit found")
    return binascii.a2b_base64(data)
