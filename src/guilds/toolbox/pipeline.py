"""The platform's result pipeline, run on every result, unchanged, in this order:

1. redaction: every secret value of the agent (its secret environment and its
   repository tokens, with their base64/URL/JSON encodings) -> ``[REDACTED]``,
   also where escape sequences or carriage returns inside the text (a log read
   back with file_read or found by code_search) split a value as it is shown
   (``guilds_code.redact``);
2. the 64 KiB cap (``PLATFORM_CAP_BYTES``): a longer text keeps its start, cut
   at a line where one is near, and ends with ``CUT_MARK``; the result is then
   "cut by the pipeline" and a file_read so cut is never pointed to later;
3. the ``remaining_tool_calls: N`` trailer, on a line of its own.

The helper has already redacted and shaped its text to ``max_bytes`` (it
redacts before it clips, from the ``redact_env`` names); this pass catches what
the helper could not know (a log read back with file_read holds the values
unredacted: the helper's redaction covers it, and this pass again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from guilds_code.limits import PLATFORM_CAP_BYTES
from guilds_code.redact import Redactor

CUT_MARK = "\n[cut by the platform at {cap} bytes: {left} bytes left out]"
TRAILER = "remaining_tool_calls: {n}"
LINE_SEARCH_BYTES = 2048
"""The cap backs up to the last newline within this many bytes, to end on a whole line."""


@dataclass(frozen=True)
class Shaped:
    text: str
    cut: bool


def cap(text: str, limit: int = PLATFORM_CAP_BYTES) -> Shaped:
    """At most `limit` bytes of UTF-8, the marker included; never splits a character."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return Shaped(text, False)
    room = limit - len(CUT_MARK.format(cap=limit, left=len(data)).encode())
    end = room
    while end > 0 and (data[end] & 0xC0) == 0x80:  # a UTF-8 continuation byte
        end -= 1
    newline = data.rfind(b"\n", max(0, end - LINE_SEARCH_BYTES), end)
    if newline > 0:
        end = newline
    head = data[:end].decode("utf-8", "surrogateescape")
    return Shaped(head + CUT_MARK.format(cap=limit, left=len(data) - end), True)


def with_trailer(text: str, remaining: int) -> str:
    sep = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{sep}{TRAILER.format(n=remaining)}"


def redact_meta(redactor: Redactor, value: Any) -> Any:
    """The metadata (or recorded arguments) with every string redacted, keys too:
    a secret used as an argument's name is a secret all the same."""
    if not redactor:
        return value
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, dict):
        return {redact_meta(redactor, k): redact_meta(redactor, v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_meta(redactor, v) for v in value]
    return value


def run_pipeline(redactor: Redactor, text: str, remaining: int) -> Shaped:
    """Redaction, the 64 KiB cap, then the trailer."""
    shaped = cap(redactor.redact(text))
    return Shaped(with_trailer(shaped.text, remaining), shaped.cut)
