"""Error lines in the part of a log a result leaves out.

When a result elides part of a command's output, the first lines of that part
that look like errors (ERROR_PATTERN) are listed with their line numbers in the
log, so ``file_read`` of the log can open them. The log is read back from disk,
only when something was elided, so a command whose output fits costs nothing.

The log holds the raw output; shaping keeps its lines one for one (ANSI
sequences hold no newline, a carriage-return redraw keeps the line, a CRLF is
one line end), so a log's line number is the shaped output's. A line is
matched with its ANSI sequences removed (a red ``error`` is still an error),
and shown shaped like the output: redraws applied, secrets redacted, clipped
to limits.ERROR_LINE_MAX_CHARS.

What counts as an error line, case as written:

    error  ERROR  <Name>Error  FAILED  FAIL  Traceback (most recent call last)
    panic  fatal  FATAL  <Name>Exception  npm ERR!  Segmentation fault
    Aborted  a pytest failure line (``E   `` at the line's start)

as words (``-Werror``, ``errors`` and ``error_count`` are not), which covers a
compiler's ``file:line:col: error:``, ``make: *** [...] Error 1``, Python's
``ValueError:`` and Go's ``--- FAIL:``.

Distinct errors first: a failing test's traceback or a compiler's repeated
message must not fill every slot. Each error line gets a rank (``classify``):

    0  it states an error: ``<Name>Error: message`` (``java.lang.XException:``,
       ``error: ...``, ``error[E0308]: ...``, ``FAIL: ...``, ``fatal: ...``),
       a line that begins with FAILED, ERROR, error, panic, npm ERR!,
       Segmentation fault or Aborted (after a ``file:line:`` location), or a
       pytest ``E   `` line
    1  it only names one (``raise ValueError(...)``, ``src/app.py:10: ValueError``,
       ``Traceback (most recent call last)``, ``make: *** [all] Error 1``)
    2  it repeats one already seen: the same message (rank 0) or the same name
       (rank 1), or a pytest ``E   `` line right under another (one failure's
       message over many lines)

and ``shaping.by_priority`` lists rank 0 first, then 1, then 2, each the first first;
the listing shows those it keeps by line number. A scan reads at most
limits.ERROR_SCAN_MAX_BYTES of the log, for at most limits.ERROR_SCAN_SECONDS,
and stops once it holds limits.ERROR_LINES_MAX lines of rank 0 (it keeps at
most that many of each rank).
"""

from __future__ import annotations

import os
import re
import time

from . import limits, runstate, shaping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Set, Tuple

    from .redact import Redactor

    Found = Tuple[int, str, int]
    """An error line: its number in the log, its text as shown, its rank."""

ERROR_PATTERN = re.compile(
    rb"(?<![\w-])error(?![\w-])|(?<!\w)ERROR(?!\w)|Error(?!\w)|(?<!\w)FAILED(?!\w)|(?<!\w)FAIL(?!\w)"
    rb"|Traceback \(most recent call last\)|(?<!\w)panic|(?<!\w)fatal(?!\w)|(?<!\w)FATAL(?!\w)"
    rb"|Exception(?!\w)|npm ERR!|Segmentation fault|(?<!\w)Aborted(?!\w)|^E {3}",
    re.MULTILINE,
)
KEYS = (b"rror", b"RROR", b"FAIL", b"Traceback", b"panic", b"fatal", b"FATAL", b"Exception",
        b"npm ERR", b"Segmentation fault", b"Aborted", b"E   ")
"""Every ERROR_PATTERN match holds one of these: a line without any is not matched."""
# Seven-bit escape sequences only (0x9B is a UTF-8 continuation byte here), and
# never across a newline, so stripping them keeps the line count.
_ANSI_BYTES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)|\x1b[ -/]+[0-~]|\x1b[0-OQ-WYZ\\`-~]"
)

# What classify reads in a shown error line (str, ANSI already removed).
_PYTEST_E = re.compile(r"E(?: {3,}|\Z)")  # shown stripped: a blank E line is "E"
_LOCATION = re.compile(r"[>\s]*(?:[^\s:]+:\d+(?::\d+)?:\s*)?")
_STATED = re.compile(
    r"([\w.]*(?:Error|Exception)|(?<![\w-])(?:error|ERROR|FAILED|FAIL|fatal|FATAL|panic))(?!\w)(?:\[[^\]]*\])?:\s*(\S.*)"
)
_LEADING = re.compile(
    r"(?:--- )?(FAILED|FAIL|ERROR|error|fatal|FATAL|panic|npm ERR!|Segmentation fault|Aborted)(?!\w)(.*)"
)
_NAME = re.compile(r"[\w.]*(?:Error|Exception)(?!\w)|Traceback|panic|npm ERR!|Segmentation fault|Aborted"
                   r"|(?<![\w-])(?:error|ERROR|FAILED|FAIL|fatal|FATAL|E)(?!\w)")


def classify(text: str) -> Tuple[int, str]:
    """(rank 0 or 1, key) of an error line as shown: rank 0 keyed by its name and
    message, rank 1 by the name it holds (see the module docstring)."""
    pytest_e = _PYTEST_E.match(text)
    body = text[pytest_e.end():] if pytest_e else text
    body = body[_LOCATION.match(body).end():]  # type: ignore[union-attr]  # the pattern matches ""
    stated = _STATED.search(body) or _LEADING.match(body)
    if stated:
        return 0, " ".join(f"{stated.group(1)}: {stated.group(2)}".split())
    if pytest_e:
        return 0, " ".join(body.split())
    name = _NAME.search(body)
    return 1, name.group(0) if name else body


def scan(path: str, first_line: int, redactor: Optional[Redactor], stop_offset: Optional[int] = None,
         want: int = limits.ERROR_LINES_MAX, seconds: float = limits.ERROR_SCAN_SECONDS) -> List[Found]:
    """The error lines of the log from line first_line (1-based) on, before byte
    stop_offset when given, found within `seconds`, in log order: the first
    `want` of each rank, up to the `want`-th of rank 0; [] when the log cannot
    be read."""
    fd = runstate.open_regular(path)
    if fd is None:
        return []
    try:
        return _Scanner(first_line, redactor, want).run(fd, _read_limit(fd, stop_offset), seconds)
    except OSError:
        return []
    finally:
        os.close(fd)


def _read_limit(fd: int, stop_offset: Optional[int]) -> int:
    size = os.fstat(fd).st_size if stop_offset is None else stop_offset
    return min(size, limits.ERROR_SCAN_MAX_BYTES)


class _Scanner:
    """Reads a log in chunks, counting lines, matching the lines from first_line on."""

    def __init__(self, first_line: int, redactor: Optional[Redactor], want: int):
        self.first_line, self.redactor, self.want = first_line, redactor, want
        self.line = 1  # the number of the line the pending bytes start
        self.found: List[Found] = []
        self.ranks = [0, 0, 0]
        self.keys: Set[str] = set()
        self.last_pytest_e = -1

    def full(self) -> bool:
        return self.ranks[0] >= self.want

    def run(self, fd: int, limit: int, seconds: float) -> List[Found]:
        carry, offset = b"", 0
        deadline = time.monotonic() + seconds
        while offset < limit and not self.full() and time.monotonic() < deadline:
            chunk = os.pread(fd, min(limits.READ_CHUNK, limit - offset), offset)
            if not chunk:
                break
            offset += len(chunk)
            data = carry + chunk
            end = data.rfind(b"\n") + 1
            if end == 0 and len(data) > limits.ERROR_LINE_SCAN_BYTES:
                end = len(data)  # one long line: match what was read of it, in pieces
            self._lines(data[:end])
            carry = data[end:]
        if carry and not self.full():
            self._lines(carry)
        return self.found

    def _lines(self, block: bytes) -> None:
        """Match the lines of block, which starts at self.line."""
        newlines = block.count(b"\n")
        start = self._skip_to_first(block, newlines)
        if start is not None:
            self._match(block, start)
        self.line += newlines

    def _skip_to_first(self, block: bytes, newlines: int) -> Optional[int]:
        """Where first_line starts in block, or None when block ends before it."""
        if self.line >= self.first_line:
            return 0
        if self.line + newlines < self.first_line:
            return None
        pos = 0
        for _ in range(self.first_line - self.line):
            pos = block.index(b"\n", pos) + 1
        return pos

    def _match(self, block: bytes, start: int) -> None:
        """Each line holding a KEYS literal is checked against ERROR_PATTERN: the
        literals are found at memchr speed, the pattern runs on those lines only."""
        line = self.line + block.count(b"\n", 0, start)
        text = block[start:]
        if b"\x1b" in text:
            text = _ANSI_BYTES.sub(b"", text)
        ahead = {key: text.find(key) for key in KEYS}
        counted = 0
        while not self.full():
            hits = [at for at in ahead.values() if at >= 0]
            if not hits:
                return
            begin = text.rfind(b"\n", 0, min(hits)) + 1
            end = text.find(b"\n", begin)
            end = len(text) if end < 0 else end
            if ERROR_PATTERN.search(text, begin, end):
                line += text.count(b"\n", counted, begin)
                counted = begin
                self._keep(line, self._shown(text[begin:end]))
            for key, at in ahead.items():
                if 0 <= at <= end:
                    ahead[key] = text.find(key, end + 1)

    def _keep(self, line: int, shown: str) -> None:
        """Keep an error line with its rank, unless that rank already has `want`."""
        rank, key = classify(shown)
        pytest_e = _PYTEST_E.match(shown) is not None
        if key in self.keys or (pytest_e and line == self.last_pytest_e + 1):
            rank = 2
        if pytest_e:
            self.last_pytest_e = line
        if self.ranks[rank] < self.want:
            self.keys.add(key)
            self.ranks[rank] += 1
            self.found.append((line, shown, rank))

    def _shown(self, raw: bytes) -> str:
        text = shaping.shape_bytes(raw, self.redactor).decode("utf-8", "replace").strip()
        return shaping.clip_line(text, limits.ERROR_LINE_MAX_CHARS)


def block_lines(found: List[Tuple[int, str]], header: str) -> List[str]:
    """The lines that list error lines under a header ([] when there are none)."""
    if not found:
        return []
    return [header] + [f"{line}: {text}" for line, text in found]

