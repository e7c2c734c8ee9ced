"""A file's metadata from an upload's ``X-Metadata-<key>: <value>`` headers, as E2B's envd reads them.

Each key is the header's name after ``X-Metadata-``, lower case (an empty one is skipped;
a header sent twice counts once, its first value). Keys and values are printable ASCII
(0x20 to 0x7E), a key at most E2B_FILE_METADATA_KEY_BYTES, all of them together (each key
with ``user.e2b.`` before it, and its value) at most E2B_FILE_METADATA_BYTES: else the
upload is refused whole (400) before anything is written. Every file of the upload gets
the same metadata, kept as the file's ``user.e2b.<key>`` extended attributes; an upload
without any replaces the file's metadata with none.
"""

from __future__ import annotations

from starlette.datastructures import Headers

from ...limits import E2B_FILE_METADATA_BYTES, E2B_FILE_METADATA_KEY_BYTES
from .connect import ConnectError

HEADER_PREFIX = "x-metadata-"
ATTRIBUTE_PREFIX = "user.e2b."


def _printable(text: str, what: str) -> None:
    for offset, char in enumerate(text):
        if not " " <= char <= "~":
            raise ConnectError("invalid_argument", f"invalid metadata: {what} has the character {char!r} at "
                                                   f"offset {offset}: only printable ASCII is kept")


def from_headers(headers: Headers) -> dict[str, str]:
    """The metadata an upload's headers give (the module docstring's rules; invalid_argument)."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        key = name[len(HEADER_PREFIX):] if name.startswith(HEADER_PREFIX) else ""
        if key and key not in found:
            found[key] = value
    total = 0
    for key, value in found.items():
        if len(key) > E2B_FILE_METADATA_KEY_BYTES:
            raise ConnectError("invalid_argument", f"invalid metadata: the key {key[:40]!r}... is over "
                                                   f"{E2B_FILE_METADATA_KEY_BYTES} bytes")
        _printable(key, f"the key {key!r}")
        _printable(value, f"the value of {key!r}")
        total += len(ATTRIBUTE_PREFIX) + len(key) + len(value)
    if total > E2B_FILE_METADATA_BYTES:
        raise ConnectError("invalid_argument", f"invalid metadata: {total} bytes of keys and values, over "
                                               f"{E2B_FILE_METADATA_BYTES}")
    return found
