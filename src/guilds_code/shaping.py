"""Output shaping: pure functions and bounded buffers, applied once per layer.

A command's output goes through one ``Shaper`` (UTF-8 decode with
replacement, ANSI strip, carriage-return redraw, secret redaction), into one
``Capture`` (a bounded start and tail of the shaped stream), and out through
``render`` (whole when it fits, else head + elision marker + tail, then the
trailers). Every stage is a stream transform with bounded state, so a command
printing gigabytes, or one line of gigabytes, keeps the helper's memory small.
Redaction runs before any cut, so no cut can leave a fragment of a secret.
"""

from __future__ import annotations

import codecs

from . import limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Callable, List, Optional, Tuple

    from .redact import Redactor

NO_OUTPUT = "(no output)"

# Complete escape sequences: CSI (7- and 8-bit), OSC, DCS/SOS/PM/APC strings,
# nF (intermediates then a final), and the two-character Fp/Fe/Fs forms.
_ANSI = (
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[ -/]+[0-~]"
    r"|\x1b[0-OQ-WYZ\\`-~]"
)
# A sequence begun but not finished when the text ends: held back for more.
_OPEN_ANSI = r"(?:\x1b(?:\[[0-?]*[ -/]*|[\]PX^_][^\x07\x1b]*\x1b?|[ -/]*)|\x9b[0-?]*[ -/]*)\Z"
_patterns: List[re.Pattern] = []


def _ansi_patterns() -> List[re.Pattern]:
    """[complete sequence, open sequence at the end], compiled at the first ESC:
    output without one never imports re."""
    if not _patterns:
        import re

        _patterns.extend([re.compile(_ANSI), re.compile(_OPEN_ANSI)])
    return _patterns


def clip_line(line: str, max_chars: int) -> str:
    """A line longer than max_chars keeps its first max_chars, then '… [+N chars]'."""
    if len(line) <= max_chars:
        return line
    return f"{line[:max_chars]}… [+{len(line) - max_chars} chars]"


def utf8_len(text: str) -> int:
    """Bytes of text in UTF-8 (what the byte caps count)."""
    return len(text.encode("utf-8", "surrogateescape"))


# --- pure transforms -------------------------------------------------------
def strip_ansi(text: str) -> str:
    """Remove complete escape sequences, then any stray ESC / CSI character."""
    if "\x1b" not in text and "\x9b" not in text:
        return text
    return _ansi_patterns()[0].sub("", text).replace("\x1b", "").replace("\x9b", "")


def redraw(text: str) -> str:
    """Each line keeps the state after its last carriage return.

    ``a\\rb`` -> ``b``. CRs just before a newline or at the end (CRLF line ends,
    a final ``100%\\r``) are line ends, not redraws, and are dropped.
    """
    if "\r" not in text:
        return text
    text = text.replace("\r\n", "\n")
    if "\r" not in text:
        return text
    return "\n".join(_last_state(line) if "\r" in line else line for line in text.split("\n"))


def _last_state(line: str) -> str:
    line = line.rstrip("\r")
    return line[line.rfind("\r") + 1 :]


def elapsed(seconds: float) -> str:
    """Short human form: 12s, 3m04s, 1h02m, 2d03h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# --- stream transforms -----------------------------------------------------
class AnsiStripper:
    """strip_ansi over a stream: holds back a sequence split across chunks.

    A sequence still open after limits.ANSI_SEQUENCE_MAX characters is text.
    """

    def __init__(self) -> None:
        self._carry = ""

    def feed(self, text: str) -> str:
        buf = self._carry + text
        cut = len(buf)
        window = max(0, cut - limits.ANSI_SEQUENCE_MAX)
        if "\x1b" in buf[window:] or "\x9b" in buf[window:]:
            match = _ansi_patterns()[1].search(buf, window)
            if match:
                cut = match.start()
        self._carry = buf[cut:]
        return strip_ansi(buf[:cut])

    def flush(self) -> str:
        rest, self._carry = self._carry, ""
        return strip_ansi(rest)


class Redrawer:
    """redraw over a stream: holds the current line until its newline.

    The held line is bounded: what a carriage return already overwrote is
    dropped at once, and a line longer than limits.REDRAW_PENDING_MAX with no
    redraw is passed on (a later CR then redraws only what followed).
    """

    def __init__(self) -> None:
        self._line = ""

    def feed(self, text: str) -> str:
        end = text.rfind("\n")
        if end < 0:
            self._line += text
            out = ""
        else:
            out = redraw(self._line + text[: end + 1])
            self._line = text[end + 1 :]
        self._line = _drop_overwritten(self._line)
        if len(self._line) > limits.REDRAW_PENDING_MAX:
            body = self._line.rstrip("\r")
            out += body
            self._line = self._line[len(body) :]
        return out

    def flush(self) -> str:
        rest, self._line = self._line, ""
        return redraw(rest)


def _drop_overwritten(line: str) -> str:
    if "\r" not in line:
        return line
    last = line.rstrip("\r").rfind("\r")
    return line[last + 1 :] if last >= 0 else line


class Shaper:
    """Raw output bytes -> shaped bytes (valid UTF-8), chunk by chunk.

    Order: decode UTF-8 with replacement, strip ANSI, redraw CR lines, redact
    secrets. A secret split by an escape sequence or across chunks is caught.
    """

    def __init__(self, redactor: Optional[Redactor] = None):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._ansi = AnsiStripper()
        self._lines = Redrawer()
        self._redact = redactor.stream() if redactor else None

    def feed(self, data: bytes) -> bytes:
        text = self._lines.feed(self._ansi.feed(self._decoder.decode(data)))
        out = text.encode("utf-8")
        return self._redact.feed(out) if self._redact else out

    def flush(self) -> bytes:
        text = self._ansi.feed(self._decoder.decode(b"", final=True)) + self._ansi.flush()
        out = (self._lines.feed(text) + self._lines.flush()).encode("utf-8")
        if self._redact:
            out = self._redact.feed(out) + self._redact.flush()
        return out


def shape_bytes(data: bytes, redactor: Optional[Redactor] = None) -> bytes:
    """Shape a whole (bounded) byte string at once."""
    shaper = Shaper(redactor)
    return shaper.feed(data) + shaper.flush()


# --- the bounded picture and its rendering -----------------------------------
class Capture:
    """A bounded picture of a shaped stream: its start, its tail, its size.

    Keeps the first ``start_max`` bytes (all of it when it fits) and the last
    limits.TAIL_BYTES + 1 bytes in a ring; memory stays bounded by both.
    """

    def __init__(self, start_max: int):
        self.total = 0
        self.newlines = 0
        self._start_max = start_max
        self._start = bytearray()
        self._tail = bytearray()
        self._tail_max = limits.TAIL_BYTES + 1

    def add(self, data: bytes) -> None:
        if not data:
            return
        self.total += len(data)
        self.newlines += data.count(b"\n")
        room = self._start_max - len(self._start)
        if room > 0:
            self._start += data[:room]
        self._tail += data[-2 * self._tail_max :]
        if len(self._tail) > 2 * self._tail_max:
            del self._tail[: len(self._tail) - self._tail_max]

    @property
    def complete(self) -> bool:
        """True when start holds the whole stream."""
        return self.total == len(self._start)

    def start(self) -> bytes:
        return bytes(self._start)

    def tail(self, size: int) -> bytes:
        """The last size bytes, plus the byte before them when known."""
        return bytes(self._tail[-(size + 1) :]) if size > 0 else b""


def elision_marker(elided: int, log_path: str) -> str:
    return f"[… {elided} bytes elided; full output: {log_path} …]"


class Rendered:
    """A rendered result: its text, whether (and how many bytes) it elided, and
    the error lines (log line numbers) it listed from the elided part."""

    __slots__ = ("text", "elided", "elided_bytes", "error_lines")

    def __init__(self, text: str, elided_bytes: int = 0, error_lines: Optional[List[int]] = None):
        self.text, self.elided_bytes = text, elided_bytes
        self.elided = elided_bytes > 0 or error_lines is not None
        self.error_lines = error_lines or []


def render(
    capture: Capture,
    max_bytes: int,
    log_path: str,
    trailers: List[str],
    head_max: Optional[int] = None,
) -> Tuple[str, bool]:
    """The result text and whether output was elided; never over max_bytes (see render_full)."""
    out = render_full(capture, max_bytes, log_path, trailers, head_max)
    return out.text, out.elided


def render_full(
    capture: Capture,
    max_bytes: int,
    log_path: str,
    trailers: List[str],
    head_max: Optional[int] = None,
    find_errors: Optional[Callable[[int], List[Tuple[int, str, int]]]] = None,
) -> Rendered:
    """The result, never over max_bytes.

    Fits: the whole output (or NO_OUTPUT), then the trailer lines. Otherwise
    the head (at most head_max, default min(HEAD_BYTES, max_bytes // 4), cut at
    a line end when one is in its second half), the elision marker with the
    exact count of shaped bytes between head and tail, the error lines of the
    elided part when find_errors is given, the tail (the rest of the budget, at
    most TAIL_BYTES, starting at a line when one starts early), then the
    trailers. find_errors(first_line) gives the error lines from the line
    after the head on (errorlines.scan: line, text, rank); of those before
    the tail's first line, the first of the lowest ranks are listed (at most
    limits.ERROR_LINES_MAX, in at most half the room the tail had), by line
    number, and the tail gives way to them.
    """
    trailer = "".join("\n" + line for line in trailers)
    if capture.complete:
        body = capture.start().decode("utf-8", "replace").rstrip("\n") or NO_OUTPUT
        if utf8_len(body + trailer) <= max_bytes:
            return Rendered(body + trailer)
    if head_max is None:
        head_max = min(limits.HEAD_BYTES, max_bytes // 4)
    head = _cut_head(capture.start()[:head_max])
    head_lines = head.count(b"\n")
    found = find_errors(head_lines + 1) if find_errors else []
    fixed = utf8_len(elision_marker(capture.total, log_path) + trailer) + 2
    block_room = (max_bytes - len(head) - fixed) // 2
    listed: List[Tuple[int, str]] = []
    while True:
        block = "".join("\n" + line for line in _error_block(listed))
        room = max_bytes - len(head) - fixed - utf8_len(block)
        tail = _cut_tail(capture.tail(min(limits.TAIL_BYTES, room)))
        first_tail_line = _line_count(capture) - _line_count_of(tail) + 1
        now = _fitting(by_priority([e for e in found if head_lines < e[0] < first_tail_line]), block_room)
        if len(now) <= len(listed):
            break
        listed = now
    marker = elision_marker(capture.total - len(head) - len(tail), log_path)
    head_text = head.decode("utf-8", "replace")
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    text = head_text + marker + block + "\n" + tail.decode("utf-8", "replace").rstrip("\n") + trailer
    return Rendered(cap_text(text, max_bytes), capture.total - len(head) - len(tail), [e[0] for e in listed])


def by_priority(found: List[Tuple[int, str, int]]) -> List[Tuple[int, str]]:
    """Error lines (line, text, rank: errorlines.scan) as (line, text), rank 0
    first, then 1, then 2, each the first first."""
    return [(line, text) for line, text, _ in sorted(found, key=lambda f: (f[2], f[0]))]


def _fitting(errors: List[Tuple[int, str]], room: int) -> List[Tuple[int, str]]:
    """The first errors (at most ERROR_LINES_MAX) whose block fits in room bytes,
    by line number: the block takes at most half of what the tail would have."""
    kept: List[Tuple[int, str]] = []
    for error in errors[: limits.ERROR_LINES_MAX]:
        if utf8_len("".join("\n" + line for line in _error_block(kept + [error]))) > room:
            break
        kept.append(error)
    return sorted(kept)


def _error_block(listed: List[Tuple[int, str]]) -> List[str]:
    if not listed:
        return []
    return [ERRORS_HEADER] + [f"{line}: {text}" for line, text in listed]


ERRORS_HEADER = "[error lines in the elided part, by line number in the log:]"


def _line_count(capture: Capture) -> int:
    """Lines of the whole shaped stream (a last line without newline counts)."""
    last = capture.tail(1)[-1:]
    return capture.newlines + (1 if last and last != b"\n" else 0)


def _line_count_of(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _cut_head(data: bytes) -> bytes:
    end = data.rfind(b"\n") + 1
    if end > 0 and end * 2 >= len(data):
        return data[:end]
    return _complete_prefix(data)


def _cut_tail(data: bytes) -> bytes:
    """data is the tail window with the byte before it first (when known)."""
    if len(data) < 2:
        return b""
    before, data = data[:1], data[1:]
    if before == b"\n":
        return data
    first = data.find(b"\n")
    if 0 <= first < len(data) // 4:
        return data[first + 1 :]
    start = 0
    while start < len(data) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


def _complete_prefix(data: bytes) -> bytes:
    """data without a character cut in two at its end."""
    decoded = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
    return data[: len(decoded.encode("utf-8"))]


def cap_text(text: str, max_bytes: int) -> str:
    """text cut to at most max_bytes of UTF-8, on a character boundary."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", "ignore")
