"""The platform's result pipeline, run on every result, unchanged, in this order:

1. redaction: every secret value of the agent (its secret environment and its
   repository tokens, escaped in any mix (URL, JSON, re.escape) or in base64)
   -> ``[REDACTED]``,
   also where escape sequences or carriage returns inside the text (a log read
   back with file_read or found by code_search) split a value as it is shown
   (``guilds_code.redact``);
2. the 64 KiB cap (``PLATFORM_CAP_BYTES``): a longer text keeps its start, cut
   at a line where one is near, and ends with ``CUT_MARK``; the result is then
   "cut by the pipeline" and a file_read so cut is never pointed to later;
3. the ``remaining_tool_calls: N`` trailer, on a line of its own
   (``guilds.record.values.with_trailer``: the record keeps the body apart).

It returns the parts apart (``Shaped``: the body, whether it was cut, the
trailer's count): the run record keeps them apart, and the answer joins them.

The helper has already redacted and shaped its text to ``max_bytes`` (it
redacts before it clips, from the ``redact_env`` names); this pass catches what
the helper could not know (a log read back with file_read holds the values
unredacted: the helper's redaction covers it, and this pass again).
"""

from __future__ import annotations

from dataclasses import dataclass

from guilds_code.limits import PLATFORM_CAP_BYTES
from guilds_code.redact import Redactor

from ..record.values import with_trailer

CUT_MARK = "\n[cut by the platform at {cap} bytes: {left} bytes left out]"
LINE_SEARCH_BYTES = 2048
"""The cap backs up to the last newline within this many bytes, to end on a whole line."""


@dataclass(frozen=True)
class Capped:
    text: str
    cut: bool


@dataclass(frozen=True)
class Shaped:
    """A result in its parts: the body (redacted, capped, with the cut mark when cut),
    ``cut``, and ``remaining``, the trailer's count."""

    body: str
    cut: bool
    remaining: int

    @property
    def text(self) -> str:
        """The answer: the body, then the trailer on a line of its own."""
        return with_trailer(self.body, self.remaining)


def cap(text: str, limit: int = PLATFORM_CAP_BYTES) -> Capped:
    """At most `limit` bytes of UTF-8, the marker included; never splits a character."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return Capped(text, False)
    room = limit - len(CUT_MARK.format(cap=limit, left=len(data)).encode())
    end = room
    while end > 0 and (data[end] & 0xC0) == 0x80:  # a UTF-8 continuation byte
        end -= 1
    newline = data.rfind(b"\n", max(0, end - LINE_SEARCH_BYTES), end)
    if newline > 0:
        end = newline
    head = data[:end].decode("utf-8", "surrogateescape")
    return Capped(head + CUT_MARK.format(cap=limit, left=len(data) - end), True)


def run_pipeline(redactor: Redactor, text: str, remaining: int) -> Shaped:
    """Redaction, the 64 KiB cap, then the trailer (kept apart)."""
    capped = cap(redactor.redact(text))
    return Shaped(capped.text, capped.cut, remaining)
