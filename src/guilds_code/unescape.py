"""Escapes undone, with the way back to the escaped text.

Redaction (``redact``) looks for a secret in a text and in the text with its
escapes undone, so that a value found in any mix of escaped and plain
characters is found whole. Undone, wherever they stand:

- ``%XX`` in either hex case: that byte (URL quoting: ``quote`` with any
  ``safe``, ``quote_plus``, lower-case hex);
- ``\\uXXXX`` in either case, a surrogate pair as one character: JSON's (and
  JavaScript's) escape of a character;
- a backslash before a byte that is not an ASCII letter or digit: that byte
  (JSON's ``\\/``, ``\\"`` and ``\\\\``, ``re.escape``, Markdown's backslash
  escapes); ``\\b \\f \\n \\r \\t``: JSON's escapes of those controls.

Behind up to ESCAPE_DEPTH backslashes each: ``re.escape`` inside JSON writes
``.`` as ``\\\\.``, and JSON inside JSON ``é`` as ``\\\\u00e9``. A ``+`` stays a
``+`` (it is a space only in a query string): the redactor lets a secret's
space match it instead.

Only escapes of bytes that occur in some secret are undone (``Unescaper``): a
JSON text is full of ``\\"`` and ``\\n`` that could never be part of one.
"""

from __future__ import annotations

from bisect import bisect_right

from .limits import ESCAPE_DEPTH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Tuple

_CONTROLS = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t"}
_ALNUM = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
JOIN_GAP_BYTES = 1024
"""Searching a gap this long costs about what one more search call does."""
UNDONE_CACHE_MAX = 4096
"""What an escape stands for is kept for this many distinct escapes."""


class Unescaper:
    """Undoes the escapes that can stand for a byte of these secrets."""

    def __init__(self, secrets: Iterable[bytes]):
        import re

        wanted = set(b"".join(secrets))
        plain = bytes(b for b in sorted(wanted) if b not in _ALNUM)
        controls = bytes(letter[0] for letter, byte in _CONTROLS.items() if byte[0] in wanted)
        either = b"[" + re.escape(plain) + controls + b"]" if plain or controls else b"(?!)"
        slashes = rb"\\\\{0,%d}" % (ESCAPE_DEPTH - 1)  # one, then more: a literal first, to search fast
        self._token = re.compile(
            rb"(%[0-9A-Fa-f]{2}|" + slashes + rb"(?:u[dD][89abAB][0-9A-Fa-f]{2}" + slashes
            + rb"u[dD][c-fC-F][0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|" + either + b"))")
        self._undone: Dict[bytes, bytes] = {}

    def starts(self, data: bytes) -> bool:
        """Whether data could hold an escape at all."""
        return b"%" in data or b"\\" in data

    def layer(self, source: bytes) -> Layer:
        """source with its escapes undone."""
        parts = self._token.split(source)  # text, escape, text, ..., text
        escapes = parts[1::2]
        parts[1::2] = [self._undone.get(e) or self._remember(e) for e in escapes]
        return Layer(parts, escapes)

    def _remember(self, escape: bytes) -> bytes:
        undone = _undone(escape)
        if len(self._undone) < UNDONE_CACHE_MAX:
            self._undone[escape] = undone
        return undone


def _char_bytes(code: int) -> bytes:
    """A code point as UTF-8; a lone surrogate as the byte it stands for (surrogateescape) or as it is."""
    try:
        return chr(code).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return chr(code).encode("utf-8", "surrogatepass")


def _undone(escape: bytes) -> bytes:
    """What one escape stands for."""
    if escape[:1] == b"%":
        return bytes((int(escape[1:], 16),))
    codes = [int(unit, 16) for unit in escape.replace(b"\\", b"").split(b"u")[1:]]
    if len(codes) == 2:  # a surrogate pair
        return _char_bytes(0x10000 + ((codes[0] - 0xD800) << 10) + (codes[1] - 0xDC00))
    if codes:
        return _char_bytes(codes[0])
    last = escape[-1:]
    return _CONTROLS.get(last, last) if escape[-2:-1] == b"\\" else last


class Layer:
    """``text``: a text with its escapes undone; ``origin`` maps a span of it back to the text."""

    def __init__(self, parts: List[bytes], escapes: List[bytes]):
        from itertools import accumulate

        self.escapes = len(escapes)
        self.text = b"".join(parts)
        self._out = [0, *accumulate(map(len, parts))]  # where part k starts in text: _out[k]
        sources = parts[:]
        sources[1::2] = escapes
        self._src = [0, *accumulate(map(len, sources))]

    def near_escapes(self, margin: int) -> List[Tuple[int, int]]:
        """Stretches of text holding every byte within margin bytes of an undone
        escape, in order: those less than JOIN_GAP_BYTES apart joined, all of
        the text when the escapes stand that close."""
        if self.escapes * 2 * margin >= len(self.text):
            return [(0, len(self.text))] if self.escapes else []
        out: List[Tuple[int, int]] = []
        for k in range(1, len(self._out) - 1, 2):
            start, end = max(0, self._out[k] - margin), self._out[k + 1] + margin
            if out and start - out[-1][1] < JOIN_GAP_BYTES:
                out[-1] = (out[-1][0], end)
            else:
                out.append((start, end))
        return out

    def _source(self, offset: int, end: bool) -> int:
        """The text's offset of the byte at offset: where its escape starts, or ends (end=True)."""
        k = bisect_right(self._out, offset) - 1
        if k % 2:  # an escape
            return self._src[k + 1] if end else self._src[k]
        return self._src[k] + offset - self._out[k] + (1 if end else 0)

    def origin(self, start: int, end: int) -> Tuple[int, int]:
        """The span of the escaped text that text[start:end] comes from."""
        return self._source(start, False), self._source(end - 1, True)
