"""Secret redaction, shared by the helper (before any clip) and the orchestrator.

Every secret value is replaced by ``[REDACTED]``, together with the encodings it
commonly travels in: escaped, with any of its characters in any of the escapes
``guilds_code.unescape`` undoes (URL quoting in either hex case, a space as
``+``, JSON's ``\\uXXXX`` and ``\\/``, ``re.escape``, Markdown's backslash
escapes, behind up to ESCAPE_DEPTH backslashes), and base64 (standard and
URL-safe) at each of the three alignments a value can have inside a longer
encoded text (``user:$TOKEN | base64``, ``printf 'x%s' "$S" | base64``): the
characters that depend on the value's bits alone, and, preferred when present,
the same run through to a final partial group. The text is searched as it is
and with its escapes undone; a match in the latter covers the escapes it came
from. Values shorter than
MIN_SECRET_CHARS are not redacted: replacing every "1" or "ab" would destroy
the output and protect nothing.

Matches may overlap (one secret's tail is another's head, or one holds
another): every match is found, the longest at each position, and each run of
overlapping matches becomes one MARK, so no tail is left between them. A text
holding escape sequences or carriage returns is also looked at as displayed
(sequences and CRs removed), line by line: a line whose displayed form holds a
secret is replaced by that form, redacted.

Not caught (docs/toolbox.md): other encodings (hex, base32, reversed,
compressed, encrypted, escaped twice in other ways than backslashes: ``%2541``,
``%5Cu0041``), base64 wrapped across lines, a value split by the
command into pieces, or split by other control characters.

The helper redacts a stream before its head/tail cut, its line clips and its
byte cap, so no clip can leave a fragment of a secret; ``StreamRedactor`` holds
back the few bytes that could be the start of a secret split across reads.
"""

from __future__ import annotations

import os

from .limits import ESCAPE_DEPTH

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Dict, Iterable, List, Optional, Tuple

    from .unescape import Unescaper

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


def _forms(raw: bytes) -> List[bytes]:
    """The patterns that find a secret: raw (a space also as +, as quote_plus
    writes it), and base64 at each alignment, standard and URL-safe."""
    import re  # only when there are secrets

    spaced = re.escape(raw).replace(b"\\ ", b"[ +]")
    forms = [spaced, re.escape(b"+" + raw[1:]).replace(b"\\ ", b"[ +]")] if raw[:1] == b" " else [spaced]
    for form in base64_forms(raw):
        forms += [re.escape(v) for v in (form, form.translate(_URLSAFE)) if len(v) >= MIN_SECRET_CHARS]
    return forms


_URLSAFE = bytes.maketrans(b"+/", b"-_")


class Redactor:
    """Replaces a fixed set of secret values (and their encodings) by MARK."""

    def __init__(self, values: Iterable[str]):
        secrets = [v.encode("utf-8", "surrogateescape") for v in values
                   if isinstance(v, str) and len(v) >= MIN_SECRET_CHARS]
        patterns: Dict[bytes, Tuple[int, int]] = {}  # pattern -> (its secret's length, its own): longest first
        for raw in secrets:
            for form in _forms(raw):
                patterns.setdefault(form, (len(raw), len(form)))
        ordered = sorted(patterns, key=patterns.__getitem__, reverse=True)
        self._bytes_re: Optional[re.Pattern] = _alternation(ordered) if ordered else None
        self._unescaper = _unescaper(secrets) if secrets else None
        self._widest = max((len(f) for raw in secrets for f in [raw, *base64_forms(raw)]), default=0)
        """The most bytes a match takes in a text whose escapes are undone."""
        self.multiline = any(b"\n" in raw for raw in secrets)
        """Whether a match can hold a newline."""
        self.longest = (ESCAPE_DEPTH + len("u0000")) * max(map(len, secrets), default=0)
        """The most bytes a secret fills in any form found, every byte escaped (a stream holds back one less)."""

    def __bool__(self) -> bool:
        return self._bytes_re is not None

    def spans(self, data: bytes, start: int = 0, stop: Optional[int] = None) -> List[Tuple[int, int]]:
        """The runs of overlapping matches in data that begin in [start, stop), merged, in order."""
        stop = len(data) if stop is None else stop
        return [(s, e) for s, e in _merged(self._found(data)) if start <= s < stop]

    def _found(self, data: bytes) -> List[Tuple[int, int]]:
        """Every match in data, and in data with its escapes undone (mapped back to data's offsets)."""
        pattern, unescaper = self._bytes_re, self._unescaper
        if pattern is None or unescaper is None:
            return []
        found = _matches(pattern, data, 0, len(data))
        if unescaper.starts(data):
            layer = unescaper.layer(data)
            # a match with no undone escape in it is one in data, found already
            for low, high in layer.near_escapes(self._widest - 1):
                found += [layer.origin(s, e) for s, e in _matches(pattern, layer.text, low, high)]
        return found

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


def _matches(pattern: re.Pattern, data: bytes, low: int, high: int) -> List[Tuple[int, int]]:
    """Every match within data[low:high], the longest at each position."""
    found = []
    match = pattern.search(data, low, high)
    while match is not None:
        found.append(match.span())
        match = pattern.search(data, match.start() + 1, high)
    return found


def _merged(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Overlapping spans joined into runs, in order."""
    runs: List[Tuple[int, int]] = []
    for s, e in sorted(spans):
        if runs and s < runs[-1][1]:
            runs[-1] = (runs[-1][0], max(e, runs[-1][1]))
        else:
            runs.append((s, e))
    return runs


def _unescaper(secrets: List[bytes]) -> Unescaper:
    from .unescape import Unescaper  # only when there are secrets

    return Unescaper(secrets)


def _alternation(patterns: List[bytes]) -> re.Pattern:
    import re  # only when there are secrets

    return re.compile(b"|".join(patterns))


class StreamRedactor:
    """Redacts a byte stream fed in chunks; a secret split across chunks is caught.

    ``feed`` returns the bytes that are safe to pass on; it holds back at most
    ``longest - 1`` bytes, and nothing up to the last newline when no secret
    holds one (no match can span it). ``flush`` returns the rest at the end of
    the stream.
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
        safe_end = max(len(self._covered), len(buf) - (self._redactor.longest - 1))
        if not self._redactor.multiline:
            safe_end = max(safe_end, buf.rfind(b"\n") + 1)
        return self._emit(buf, safe_end)

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
