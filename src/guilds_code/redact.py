"""Secret redaction, shared by the helper (before any clip) and the orchestrator.

Every secret value is replaced by ``[REDACTED]``, together with the encodings it
commonly travels in: URL-quoted, JSON-escaped, and base64 (standard and
URL-safe, unpadded). Values shorter than MIN_SECRET_CHARS are not redacted:
replacing every "1" or "ab" would destroy the output and protect nothing.

The helper redacts a stream before its head/tail cut, its line clips and its
byte cap, so no clip can leave a fragment of a secret; ``StreamRedactor`` holds
back the few bytes that could be the start of a secret split across reads.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Iterable, List, Optional

MARK = "[REDACTED]"
MIN_SECRET_CHARS = 4


def _variants(value: str) -> List[bytes]:
    # Imported here: a call without secrets never needs them (urllib.parse alone
    # pulls in ipaddress).
    import base64
    import json
    from urllib.parse import quote

    raw = value.encode("utf-8", "surrogateescape")
    forms = {
        raw,
        quote(value, safe="").encode("ascii"),
        json.dumps(value, ensure_ascii=True)[1:-1].encode("ascii"),
        json.dumps(value, ensure_ascii=False)[1:-1].encode("utf-8", "surrogateescape"),
        base64.b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
    }
    return [f for f in forms if len(f) >= MIN_SECRET_CHARS]


class Redactor:
    """Replaces a fixed set of secret values (and their encodings) by MARK."""

    def __init__(self, values: Iterable[str]):
        forms = set()
        for value in values:
            if isinstance(value, str) and len(value) >= MIN_SECRET_CHARS:
                forms.update(_variants(value))
        ordered = sorted(forms, key=len, reverse=True)
        self.longest = len(ordered[0]) if ordered else 0
        self._bytes_re: Optional[re.Pattern] = _alternation(ordered) if ordered else None

    def __bool__(self) -> bool:
        return self._bytes_re is not None

    def redact_bytes(self, data: bytes) -> bytes:
        if self._bytes_re is None:
            return data
        return self._bytes_re.sub(MARK.encode("ascii"), data)

    def redact(self, text: str) -> str:
        if self._bytes_re is None:
            return text
        data = text.encode("utf-8", "surrogateescape")
        return self.redact_bytes(data).decode("utf-8", "surrogateescape")

    def stream(self) -> "StreamRedactor":
        return StreamRedactor(self)


def _alternation(forms: List[bytes]) -> re.Pattern:
    import re  # only when there are secrets

    return re.compile(b"|".join(re.escape(f) for f in forms))


class StreamRedactor:
    """Redacts a byte stream fed in chunks; a secret split across chunks is caught.

    ``feed`` returns the bytes that are safe to pass on; it holds back at most
    ``longest - 1`` bytes. ``flush`` returns the rest at the end of the stream.
    """

    def __init__(self, redactor: Redactor):
        self._redactor = redactor
        self._carry = b""

    def feed(self, chunk: bytes) -> bytes:
        pattern = self._redactor._bytes_re
        if pattern is None:
            return chunk
        buf = self._carry + chunk
        safe_end = max(0, len(buf) - (self._redactor.longest - 1))
        out = []
        pos = 0
        for match in pattern.finditer(buf):
            if match.start() >= safe_end:
                break
            out.append(buf[pos : match.start()])
            out.append(MARK.encode("ascii"))
            pos = match.end()
        emit_to = max(pos, safe_end)
        out.append(buf[pos:emit_to])
        self._carry = buf[emit_to:]
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        return self._redactor.redact_bytes(rest)


def from_environment(names: Iterable[str], extra: Iterable[str] = ()) -> Redactor:
    """A Redactor over the values of these environment variables, plus extra values."""
    values = [os.environ.get(name, "") for name in names]
    values.extend(extra)
    return Redactor(values)
