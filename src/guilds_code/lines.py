"""One line of text read in pieces: its start kept, its length counted, its clip.

file_read and code_search show lines of any length (a minified file, a 2 GB
line) with bounded memory: a ``LineHead`` keeps only the bytes a clip can show
(``keep_bytes``) and counts the characters past them; ``clip_counted`` then
clips as ``shaping.clip_line`` would have clipped the whole line.
"""

from __future__ import annotations

from .shaping import clip_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple, Union

    from .redact import Redactor

_CONTINUATION = bytes(range(0x80, 0xC0))


def char_count(data: Union[bytes, bytearray]) -> int:
    """Characters of UTF-8 bytes (every byte that does not continue a character)."""
    return len(data.translate(None, _CONTINUATION))


def _complete_end(data: bytes) -> int:
    """Where a UTF-8 sequence cut off at the end of data starts (len(data) if none)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:
            need = 2 if byte >= 0xC0 else 1
            need += (byte >= 0xE0) + (byte >= 0xF0)
            return len(data) - back if need > back else len(data)
    return len(data)


class LineHead:
    """One line fed in pieces: redacted as a stream, its start kept, the rest counted.

    Keeps the first `keep` bytes of the redacted line and counts the characters
    past them, so a line of any length costs `keep` bytes. ``text()`` gives the
    kept start (cut at a character boundary) and the line's total characters.
    """

    def __init__(self, keep: int, redactor: Optional[Redactor]):
        self._keep = keep
        self._stream = redactor.stream() if redactor else None
        self._head = bytearray()
        self._extra = 0
        self.last_byte = -1

    def add(self, piece: Union[bytes, bytearray]) -> None:
        if self._stream is not None:
            piece = self._stream.feed(bytes(piece))
        self._take(piece)

    def _take(self, piece: Union[bytes, bytearray]) -> None:
        if not piece:
            return
        self.last_byte = piece[-1]
        room = self._keep - len(self._head)
        if room > 0:
            self._head += piece[:room]
            piece = piece[room:]
        if piece:
            self._extra += char_count(piece)

    def text(self, strip_cr: bool = False) -> Tuple[str, int]:
        """(start of the line as text, total characters of the line)."""
        if self._stream is not None:
            self._take(self._stream.flush())
            self._stream = None
        head = bytes(self._head)
        extra = self._extra
        if extra:
            cut = _complete_end(head)
            extra += 1 if cut < len(head) else 0
            head = head[:cut]
        text = head.decode("utf-8", "replace")
        if strip_cr and self.last_byte == 0x0D:
            if extra:
                extra -= 1
            else:
                text = text[:-1]
        return text, len(text) + extra


def clip_counted(text: str, total: int, max_chars: int) -> str:
    """text (the start of a line of `total` characters) clipped like shaping.clip_line."""
    if total == len(text):
        return clip_line(text, max_chars)
    shown = text[:max_chars]
    return f"{shown}… [+{total - len(shown)} chars]"


def keep_bytes(max_chars: int) -> int:
    """Bytes of a line to keep: enough for max_chars + 1 characters of any width."""
    return 4 * (max_chars + 1)
