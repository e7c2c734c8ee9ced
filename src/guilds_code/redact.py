"""Secret redaction, shared by the helper (before any clip) and the orchestrator.

Every secret value is replaced by ``[REDACTED]``, together with the encodings it
commonly travels in: URL-quoted, JSON-escaped, and base64 (standard and
URL-safe) at each of the three alignments a value can have inside a longer
encoded text (``user:$TOKEN | base64``, ``printf 'x%s' "$S" | base64``): the
characters that depend on the value's bits alone, and, preferred when present,
the same run through to a final partial group. Values shorter than
MIN_SECRET_CHARS are not redacted: replacing every "1" or "ab" would destroy
the output and protect nothing.

Matches may overlap (one secret's tail is another's head, or one holds
another): every match is found, the longest at each position, and each run of
overlapping matches becomes one MARK, so no tail is left between them. A text
holding escape sequences or carriage returns is also looked at as displayed
(sequences and CRs removed), line by line: a line whose displayed form holds a
secret is replaced by that form, redacted.

Not caught (docs/toolbox.md): other encodings (hex, base32, reversed,
compressed, encrypted), base64 wrapped across lines, a value split by the
command into pieces, or split by other control characters.

The helper redacts a stream before its head/tail cut, its line clips and its
byte cap, so no clip can leave a fragment of a secret; ``StreamRedactor`` holds
back the few bytes that could be the start of a secret split across reads.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Iterable, List, Optional, Tuple

MARK = "[REDACTED]"
MIN_SECRET_CHARS = 4
_MARK_BYTES = MARK.encode("ascii")
_DISPLAY_CONTROLS = (b"\x1b", b"\x9b", b"\r")
"""Bytes after which a text may display otherwise than it reads."""


def base64_forms(raw: bytes) -> List[bytes]:
    """raw's base64 (standard alphabet) at each alignment k = 0, 1, 2 bytes into
    a longer text: the characters fixed by raw's bits alone, and those through
    to the end when raw ends the text (its last group padded with zero bits)."""
    import base64

    forms = []
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + raw).rstrip(b"=")
        first = -(-8 * k // 6)  # the first character with none of the k bytes' bits
        last = 8 * (k + len(raw)) // 6  # past the last one fixed by raw alone
        forms += [encoded[first:last], encoded[first:]]
    return forms


def _variants(value: str) -> List[bytes]:
    # Imported here: a call without secrets never needs them (urllib.parse alone
    # pulls in ipaddress).
    import json
    from urllib.parse import quote

    raw = value.encode("utf-8", "surrogateescape")
    forms = {
        raw,
        quote(value, safe="").encode("ascii"),
        json.dumps(value, ensure_ascii=True)[1:-1].encode("ascii"),
        json.dumps(value, ensure_ascii=False)[1:-1].encode("utf-8", "surrogateescape"),
    }
    for form in base64_forms(raw):
        forms.update((form, form.translate(_URLSAFE)))
    return [f for f in forms if len(f) >= MIN_SECRET_CHARS]


_URLSAFE = bytes.maketrans(b"+/", b"-_")


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

    def spans(self, data: bytes, start: int = 0, stop: Optional[int] = None) -> List[Tuple[int, int]]:
        """The runs of overlapping matches in data that begin in [start, stop), merged, in order."""
        pattern, stop = self._bytes_re, len(data) if stop is None else stop
        merged: List[Tuple[int, int]] = []
        if pattern is None:
            return merged
        match = pattern.search(data, start)
        while match is not None and match.start() < stop:
            s, e = match.span()
            if merged and s < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
            else:
                merged.append((s, e))
            match = pattern.search(data, s + 1)
        return merged

    def redact_bytes(self, data: bytes) -> bytes:
        if self._bytes_re is None:
            return data
        out = _replace(data, self.spans(data))
        if any(c in out for c in _DISPLAY_CONTROLS):
            out = b"\n".join(self._as_displayed(line) for line in out.split(b"\n"))
        return out

    def _as_displayed(self, line: bytes) -> bytes:
        """line, or its displayed form redacted when that form holds a secret."""
        if not any(c in line for c in _DISPLAY_CONTROLS):
            return line
        from .shaping import strip_ansi

        text = line.decode("utf-8", "surrogateescape")
        shown = strip_ansi(text).replace("\r", "").encode("utf-8", "surrogateescape")
        found = self.spans(shown)
        return _replace(shown, found) if found else line

    def redact(self, text: str) -> str:
        if self._bytes_re is None:
            return text
        data = text.encode("utf-8", "surrogateescape")
        return self.redact_bytes(data).decode("utf-8", "surrogateescape")

    def stream(self) -> "StreamRedactor":
        return StreamRedactor(self)


def _replace(data: bytes, spans: List[Tuple[int, int]]) -> bytes:
    out, pos = [], 0
    for s, e in spans:
        out += [data[pos:s], _MARK_BYTES]
        pos = e
    out.append(data[pos:])
    return b"".join(out)


def _alternation(forms: List[bytes]) -> re.Pattern:
    import re  # only when there are secrets

    return re.compile(b"|".join(re.escape(f) for f in forms))


class StreamRedactor:
    """Redacts a byte stream fed in chunks; a secret split across chunks is caught.

    ``feed`` returns the bytes that are safe to pass on; it holds back at most
    ``longest - 1`` bytes. ``flush`` returns the rest at the end of the stream.
    The output is what ``redact_bytes`` gives for the whole stream (but for the
    escape-sequence pass, which the helper's shaping makes needless): a match
    that begins inside bytes already passed on as MARK extends that MARK.
    """

    def __init__(self, redactor: Redactor):
        self._redactor = redactor
        self._covered = b""  # passed on as (the end of) a MARK, kept to find matches overlapping it
        self._carry = b""

    def feed(self, chunk: bytes) -> bytes:
        if self._redactor._bytes_re is None:
            return chunk
        buf = self._covered + self._carry + chunk
        return self._emit(buf, max(len(self._covered), len(buf) - (self._redactor.longest - 1)))

    def flush(self) -> bytes:
        buf = self._covered + self._carry
        out = self._emit(buf, len(buf)) if self._redactor._bytes_re is not None else buf
        self._covered = self._carry = b""
        return out

    def _emit(self, buf: bytes, safe_end: int) -> bytes:
        """Pass on buf (after the covered part) up to safe_end, or past it to a MARK's end."""
        pos = len(self._covered)
        out = []
        for s, e in self._redactor.spans(buf, 0, safe_end):
            if e <= pos:
                continue
            if s >= pos:
                out += [buf[pos:s], _MARK_BYTES]
            pos = e  # a match begun in the covered part extends the MARK already passed on
        emit_to = max(pos, safe_end)
        out.append(buf[pos:emit_to])
        self._covered = buf[safe_end:pos] if pos > safe_end else b""
        self._carry = buf[emit_to:]
        return b"".join(out)


def from_environment(names: Iterable[str], extra: Iterable[str] = ()) -> Redactor:
    """A Redactor over the values of these environment variables, plus extra values."""
    values = [os.environ.get(name, "") for name in names]
    values.extend(extra)
    return Redactor(values)
