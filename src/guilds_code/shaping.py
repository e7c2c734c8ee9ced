"""Output shaping: pure functions and bounded buffers, applied once per layer.

ANSI strip, carriage-return redraw, line clip, head/tail elision, byte cap.
"""

from __future__ import annotations


def clip_line(line: str, max_chars: int) -> str:
    """A line longer than max_chars keeps its first max_chars, then '… [+N chars]'."""
    if len(line) <= max_chars:
        return line
    return f"{line[:max_chars]}… [+{len(line) - max_chars} chars]"


def utf8_len(text: str) -> int:
    """Bytes of text in UTF-8 (what the byte caps count)."""
    return len(text.encode("utf-8", "surrogateescape"))
