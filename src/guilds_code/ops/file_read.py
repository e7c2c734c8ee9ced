"""file_read: numbered lines of one range of a regular file inside the home.

Result text (exact)::

    <path> lines a–b of n          header (en dash), then one row per line:
    <number>  <text>               the number right-aligned to the widest shown,
                                   two spaces, the line without its newline
    [stopped at line N to stay under M bytes; continue with offset N+1]
                                   when the result's byte cap stops the range:
                                   N is the last line shown

    <path> is empty                an empty file (meta lines 0, no range)
    <path> has n lines; offset X is past the end
    <path> is a binary file (S bytes); not shown
                                   a NUL in the first 8000 bytes (meta: path and
                                   content_hash only; no lines, no range)
    <path> lines a–b: unchanged since step N; read that result.
                                   a repeated read (see below)

<path> is the resolved file relative to the run's working directory when it lies
under it, else ``~/<path under the home>`` (paths.display): either can be passed
back to file_read as it is.

Lines are what rg and ``wc -l`` count: split only on ``\\n`` (a form feed or
U+2028 inside a line does not split it). n is the number of ``\\n`` plus one when
the file does not end with one (``wc -l`` + 1 for a last line without newline;
a trailing newline does not start an empty line). A ``\\r`` before the ``\\n``
(CRLF) is not shown. Text is UTF-8, an invalid byte shown as U+FFFD. Secrets are
redacted from each line before it is clipped to 400 characters (``… [+N chars]``).

Repeated reads: when request.reads holds an earlier read of the same resolved
path with the same content_hash whose range covers the lines this read shows,
the result is the pointer line, naming the latest such read's seq.

The whole file is hashed (SHA-256, meta content_hash) in one streaming pass that
also counts lines (from limits.READ_COUNT_CHILD_MIN_BYTES on, GNU ``wc -l``
counts them in a child beside the pass, at a tenth of Python's cost; without
it, Python counts). Memory stays bounded whatever the file: one 64 KiB buffer,
and a long line is kept only up to what its clip shows, and counted past that.

meta: path (resolved, absolute), range [a, b] (1-based, inclusive, the lines
shown), content_hash, lines (n); repeat_of on a pointer.
"""

from __future__ import annotations

import io
import os
import sys

from .. import limits, paths, proc, protocol, runstate
from ..lines import LineHead, clip_counted, keep_bytes
from ..shaping import utf8_len

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    from ..redact import Redactor



class _Collector:
    """Gathers the lines first..last of a byte stream fed in chunks."""

    def __init__(self, first: int, last: int, redactor: Redactor):
        self.first, self.last = first, last
        self.lineno = 1
        self.rows: List[tuple] = []
        self._redactor = redactor or None
        self._keep = keep_bytes(limits.READ_LINE_MAX_CHARS)
        self._line: Optional[LineHead] = None

    def feed(self, buf: bytearray, size: int, newlines: int) -> None:
        start, self.lineno = self.lineno, self.lineno + newlines
        if self.lineno < self.first or start > self.last:
            return
        pos, line = 0, start
        while line < self.first:
            pos = buf.find(b"\n", pos, size) + 1
            line += 1
        while line <= self.last:
            nl = buf.find(b"\n", pos, size)
            end = size if nl < 0 else nl
            if end > pos or nl >= 0:
                self._current().add(buf[pos:end])
            if nl < 0:
                return
            self.finish()
            line, pos = line + 1, nl + 1

    def _current(self) -> LineHead:
        if self._line is None:
            self._line = LineHead(self._keep, self._redactor)
        return self._line

    def finish(self) -> None:
        """End the current line (at a newline, or at the end of the file)."""
        if self._line is not None:
            self.rows.append(self._line.text(strip_cr=True))
            self._line = None


# --- counting lines in a child ---------------------------------------------------
def _wc_program() -> Optional[str]:
    """GNU wc at a fixed place, or None (busybox's is slower than counting here)."""
    for folder in ("/usr/bin", "/bin"):
        path = os.path.join(folder, "wc")
        if os.access(path, os.X_OK) and os.path.basename(os.path.realpath(path)) == "wc":
            return path
    return None


class _LineCounter:
    """``wc -l`` over a second descriptor of the file, in a child, beside the hashing pass.

    Counting newlines in Python costs as much CPU as SHA-256 itself; wc counts
    a GiB in a tenth of that. Only for large files (limits.READ_COUNT_CHILD_MIN_BYTES).
    """

    def __init__(self, program: str, fd: int):
        self._child = proc.spawn([program, "-l"], {"LC_ALL": "C"}, stdin=fd)

    @staticmethod
    def start(fd: Optional[int]) -> Optional["_LineCounter"]:
        """A counter over fd, or None (no fd, no GNU wc, or it cannot run)."""
        program = _wc_program() if fd is not None else None
        if program is None or fd is None:
            return None
        try:
            return _LineCounter(program, fd)
        except OSError:
            return None

    def newlines(self) -> Optional[int]:
        """wc's count, or None when it failed."""
        out = proc.read_end(self._child.stdout)
        chunks: List[bytes] = []
        while True:
            chunk = os.read(out, 4096)
            if not chunk or sum(map(len, chunks)) > 4096:
                break
            chunks.append(chunk)
        os.close(out)
        text = b"".join(chunks).strip()
        return int(text) if self._child.wait() == 0 and text.isdigit() else None


def _count_newlines(fd: int) -> int:
    """Newlines of the whole file, read again with pread (when wc failed)."""
    buf, total, offset = bytearray(limits.READ_FILE_CHUNK), 0, 0
    while True:
        size = os.preadv(fd, [buf], offset)
        if not size:
            return total
        total += buf.count(b"\n", 0, size)
        offset += size


class Scan:
    """One pass over a file: its hash, size, binary or not, newlines, the wanted lines."""

    def __init__(self) -> None:
        self.digest = ""
        self.size = 0
        self.binary = False
        self.newlines = 0
        self.last_byte = 0x0A
        self.rows: List[tuple] = []

    @property
    def lines(self) -> int:
        """Lines as rg counts them: newlines, plus a last line without one."""
        return self.newlines + (1 if self.last_byte != 0x0A else 0)

    def sniff(self, buf: bytearray, size: int) -> None:
        if self.size < limits.BINARY_SNIFF_BYTES and not self.binary:
            end = min(size, limits.BINARY_SNIFF_BYTES - self.size)
            self.binary = buf.find(b"\0", 0, end) >= 0


def _sha256(size: int):
    """A SHA-256 hash object for a file of about size bytes (see
    limits.READ_BUILTIN_SHA_MAX_BYTES): the interpreter's own for a small file,
    OpenSSL's (hashlib) for a larger one or where the interpreter has none."""
    if size < limits.READ_BUILTIN_SHA_MAX_BYTES:
        try:
            return __import__("_sha2" if sys.version_info >= (3, 12) else "_sha256").sha256()
        except ImportError:  # an interpreter built without it
            pass
    import hashlib

    return hashlib.sha256()


def scan(fd: int, first: int, last: int, redactor: Redactor, count_fd: Optional[int] = None) -> Scan:
    """Read fd to its end once: hash, sniff, collect lines first..last, count lines.

    count_fd, a second descriptor of the same file (a large one), lets a wc
    child count its newlines beside this pass, which then counts only as far
    as the range needs.
    """
    result, sha = Scan(), _sha256(os.fstat(fd).st_size)
    collector = _Collector(first, last, redactor)
    counter: Optional[_LineCounter] = None
    buf = bytearray(limits.READ_FILE_CHUNK)
    with memoryview(buf) as view, io.FileIO(fd, closefd=False) as reader:
        while True:
            size = reader.readinto(buf) or 0
            if not size:
                break
            result.sniff(buf, size)
            if not result.binary:
                if result.size == 0:
                    counter = _LineCounter.start(count_fd)
                if counter is None or collector.lineno <= last:
                    newlines = buf.count(b"\n", 0, size)
                    collector.feed(buf, size, newlines)
                    result.newlines += newlines
            sha.update(view[:size])
            result.size += size
            result.last_byte = buf[size - 1]
    collector.finish()
    if counter is not None:
        counted = counter.newlines()
        result.newlines = counted if counted is not None else _count_newlines(fd)
    result.digest, result.rows = sha.hexdigest(), collector.rows
    return result


# --- the result text ---------------------------------------------------------
def _header(shown: str, first: int, last: int, total: int) -> str:
    return f"{shown} lines {first}–{last} of {total}"


def _stop(last: int, cap: int) -> str:
    return f"[stopped at line {last} to stay under {cap} bytes; continue with offset {last + 1}]"


def _numbered(first: int, rows: List[str]) -> List[str]:
    width = len(str(first + len(rows) - 1))
    return [f"{first + i:>{width}}  {row}" if row else f"{first + i:>{width}}" for i, row in enumerate(rows)]


def _fitting(shown: str, first: int, rows: List[str], total: int, cap: int) -> int:
    """How many rows fit under cap with the header, and the stop line when cut.

    Exact: the numbers' width is that of the last row of each candidate range.
    """
    rows_size = 0
    for k, row in enumerate(rows, start=1):
        rows_size += utf8_len(row) + (3 if row else 1)
        last = first + k - 1
        size = utf8_len(_header(shown, first, last, total)) + rows_size + k * len(str(last))
        if k < len(rows):
            size += 1 + utf8_len(_stop(last, cap))
        if size > cap:
            return k - 1
    return len(rows)


def _render(shown: str, first: int, rows: List[tuple], total: int, cap: int):
    """(text, last line shown): the header, the rows that fit, the stop line if cut.

    When not even the first line fits (a long line of wide characters under a
    small cap), that line alone is shown, clipped shorter until it fits.
    """
    max_chars = limits.READ_LINE_MAX_CHARS
    clipped = [clip_counted(text, count, max_chars) for text, count in rows]
    fit = _fitting(shown, first, clipped, total, cap)
    while fit == 0 and max_chars > 1:
        max_chars //= 2
        clipped[0] = clip_counted(rows[0][0], rows[0][1], max_chars)
        fit = min(_fitting(shown, first, clipped, total, cap), 1)
    fit = max(fit, 1)
    last = first + fit - 1
    lines = [_header(shown, first, last, total)] + _numbered(first, clipped[:fit])
    if fit < len(rows):
        lines.append(_stop(last, cap))
    return "\n".join(lines), last


def _earlier(reads: List[Dict[str, Any]], path: str, digest: str, first: int, last: int) -> Optional[int]:
    """The seq of the latest earlier read of path, same hash, whose range covers first..last."""
    seqs = [
        read["seq"]
        for read in reads
        if read["path"] == path
        and read["content_hash"] == digest
        and read["range"][0] <= first
        and last <= read["range"][1]
    ]
    return max(seqs) if seqs else None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _reply(shown: str, path: str, result: Scan, request: protocol.Request) -> protocol.Reply:
    first = request.args["offset"]
    meta: Dict[str, Any] = {"path": path, "content_hash": result.digest}
    if result.binary:
        return protocol.Reply(f"{shown} is a binary file ({result.size} bytes); not shown", meta)
    meta["lines"] = result.lines
    if result.lines == 0:
        return protocol.Reply(f"{shown} is empty", meta)
    if first > result.lines:
        text = f"{shown} has {_plural(result.lines, 'line')}; offset {first} is past the end"
        return protocol.Reply(text, meta)
    text, last = _render(shown, first, result.rows, result.lines, request.max_bytes)
    meta["range"] = [first, last]
    seq = _earlier(request.reads, path, result.digest, first, last)
    if seq is not None:
        meta["repeat_of"] = seq
        text = f"{shown} lines {first}–{last}: unchanged since step {seq}; read that result."
    return protocol.Reply(text, meta)


def run(request: protocol.Request) -> protocol.Reply:
    """Read args.path from args.offset, args.limit lines (see the module docstring)."""
    given = request.args["path"]
    first = request.args["offset"]
    last = first + request.args["limit"] - 1
    cwd = runstate.current_cwd(request)
    with paths.resolve(request.home, cwd, given) as target:
        fd = target.open_regular(given)
        big = target.st.st_size >= limits.READ_COUNT_CHILD_MIN_BYTES
        count_fd = target.open_regular(given) if big else None
        path = target.path
    try:
        result = scan(fd, first, last, runstate.redactor_for(request), count_fd)
    except OSError as exc:
        raise paths.fail(given, f"cannot be read: {exc.strerror}") from None
    finally:
        for opened in (fd, count_fd):
            if opened is not None:
                os.close(opened)
    shown = paths.display(path, request.home, paths.physical_cwd(request.home, cwd))
    return _reply(shown, path, result, request)
