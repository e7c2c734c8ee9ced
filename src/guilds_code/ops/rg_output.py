"""Reading rg's output as a stream: file counts (files mode), rows (content mode).

Both are sinks for run_rg: ``feed`` takes rg's standard output in chunks of
any size, and memory stays bounded whatever rg prints (a row's text is kept
only up to what its clip shows; the rows kept are at most what is shown).
"""

from __future__ import annotations

from .. import limits
from ..lines import LineHead, keep_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

# Content mode's patterns, compiled by the classes that use them: files mode never imports re.
_HEADER = rb"([0-9]+)([:-])"
"""After a path's NUL: the line number and ':' (a match) or '-' (context)."""
_NOTE = rb": (WARNING: |binary file matches)"
_STATS_MATCHES = rb"(?m)^([0-9]+) matches$"
_STATS_FILES = rb"(?m)^([0-9]+) files contained matches$"
_STATS_MAX = 4096


class FileCounts:
    """files mode: records 'path NUL count LF' (rg --count-matches --null)."""

    def __init__(self) -> None:
        self._pending = b""
        self.counts: List[Tuple[int, bytes]] = []

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        pos = 0
        while True:
            z = data.find(b"\0", pos)
            nl = data.find(b"\n", z + 1) if z >= 0 else -1
            if nl < 0:
                break
            count = data[z + 1 : nl]
            if count.isdigit():
                self.counts.append((int(count), data[pos:z]))
            pos = nl + 1
        self._pending = data[pos:]
        if len(self._pending) > limits.SEARCH_PATH_MAX_BYTES:
            self._pending = b""

    def totals(self) -> Tuple[int, int]:
        return sum(count for count, _ in self.counts), len(self.counts)


class Row:
    """One line of content-mode output: kind ':' match, '-' context, '!' note, '--' group break.

    While its text is read, `line` takes it (a LineHead); then text and chars hold it.
    """

    def __init__(self, kind: str, path: bytes = b"", number: int = 0, line: Optional[LineHead] = None):
        self.kind, self.path, self.number, self.line = kind, path, number, line
        self.text, self.chars = "", 0


class RgOutput:
    """rg's standard output with --null, parsed as a stream into rows for a sink.

    A row is 'path NUL number (: or -) text LF', or a note 'path: WARNING: ...'
    about a binary file; '--' lines are skipped (the sink draws its own group
    breaks); an empty line starts the --stats block, kept in `stats`.

    For each row, ``sink.begin(kind, path, number)`` returns a Row whose LineHead
    takes the text, or None to skip it; ``sink.end(row)`` follows. Complete lines
    of a chunk are handled in bulk; a row still open at the end of a chunk is
    streamed into its LineHead, so no row's text is ever held whole.
    """

    def __init__(self, sink: Any):
        import re

        self._header, self._note = re.compile(_HEADER), re.compile(_NOTE)
        self.sink = sink
        self.stats = b""
        self._pending = b""
        self._carry = b""
        self._open: Any = False  # a Row or None while a row's text runs past a chunk

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        self._pending = b""
        pos = 0
        if self._open is not False:
            pos = self._continue(data)
            if self._open is not False:
                return
        last = data.rfind(b"\n")
        if last >= pos:
            self._lines(data[pos:last].split(b"\n"))
            pos = last + 1
        if pos < len(data):
            self._tail(data[pos:])

    def _continue(self, data: bytes) -> int:
        """Feed the open row's text up to its newline; the position after it."""
        nl = data.find(b"\n")
        if self._open is not None:
            self._open.line.add(data if nl < 0 else data[:nl])
        if nl < 0:
            return len(data)
        if self._open is not None:
            self.sink.end(self._open)
        self._open = False
        return nl + 1

    def _lines(self, lines: List[bytes]) -> None:
        begin, end = self.sink.begin, self.sink.end
        for line in lines:
            if self.stats:
                self.stats = (self.stats + line + b"\n")[:_STATS_MAX]
                continue
            if self._carry:
                line, self._carry = self._carry + b"\n" + line, b""
            elif not line:
                self.stats = b"\n"
                continue
            z = line.find(b"\0")
            header = self._header.match(line, z + 1) if z > 0 else None
            if header is None:
                self._other(line)
                continue
            number, kind = header.groups()
            row = begin(kind, line[:z], int(number))
            if row is not None:
                row.line.add(line[header.end() :])
                end(row)

    def _other(self, line: bytes) -> None:
        """A line that is not a row: a note, a '--', or the start of a path holding a newline."""
        note = self._note.search(line)
        if note is not None:
            row = self.sink.begin(b"!", line[: note.start()], 0)
            if row is not None:
                row.line.add(line[note.start() + 2 :])
                self.sink.end(row)
        elif line != b"--" and len(line) < limits.SEARCH_PATH_MAX_BYTES:
            self._carry = line

    def _tail(self, tail: bytes) -> None:
        """The last, unfinished line of a chunk: kept for the next, or opened as a row."""
        if self.stats:
            self.stats = (self.stats + tail)[:_STATS_MAX]
            return
        z = tail.find(b"\0")
        header = self._header.match(tail, z + 1) if z > 0 else None
        if header is None or header.end() == len(tail):
            if len(tail) < limits.SEARCH_PATH_MAX_BYTES:
                self._pending = tail
            return
        number, kind = header.groups()
        self._open = self.sink.begin(kind, (self._carry + b"\n" if self._carry else b"") + tail[:z], int(number))
        self._carry = b""
        self._continue(tail[header.end() :])


class ContentLines:
    """content mode: the rows to show, in path order, and the counts of all.

    rg prints each file's rows together, but files in the order its threads
    finish them; to show the same lines every time, only the groups of the
    smallest paths that make up `keep_rows` rows are kept (bounded memory), and
    sorted at the end. Group breaks are drawn as rg draws them with context:
    between files, and where line numbers jump.
    """

    def __init__(self, keep_rows: int, context: int, redactor: Any):
        self.keep_rows = keep_rows
        self.context = context
        self.entries = 0
        self.match_lines = 0
        self.files_seen = 0
        self.capped = False
        self._redactor = redactor or None
        self._keep = keep_bytes(limits.SEARCH_LINE_MAX_CHARS)
        self._groups: Dict[bytes, List[Row]] = {}
        self._kept = 0
        self._path: Optional[bytes] = None
        self._rows: Optional[List[Row]] = None
        self._file_matches = 0
        self.output = RgOutput(self)

    def feed(self, data: bytes) -> None:
        self.output.feed(data)

    def begin(self, kind: bytes, path: bytes, number: int) -> Optional[Row]:
        self.entries += 1
        if path != self._path:
            self._close_group()
            self._open_group(path)
        if kind == b":":
            self.match_lines += 1
            self._file_matches += 1
            if self._file_matches == 1:
                self.files_seen += 1
            elif self._file_matches == limits.SEARCH_MATCHES_PER_FILE:
                self.capped = True
        if self._rows is None:
            return None
        return Row(kind.decode(), path, number, LineHead(self._keep, self._redactor))

    def end(self, row: Row) -> None:
        """The row's text is read: keep it in the open group (begin gave a row only for one)."""
        if row.line is not None:
            row.text, row.chars = row.line.text(strip_cr=True)
            row.line = None
        if self._rows is not None:
            self._rows.append(row)

    def _open_group(self, path: bytes) -> None:
        self._path, self._file_matches = path, 0
        wanted = self._kept < self.keep_rows or path < max(self._groups)
        self._rows = [] if wanted else None

    def _close_group(self) -> None:
        if self._rows and self._path is not None:
            self._groups[self._path] = self._rows
            self._kept += len(self._rows)
            self._trim()
        self._rows = None

    def _trim(self) -> None:
        """Drop the largest paths' groups while the others still make keep_rows rows."""
        while len(self._groups) > 1:
            largest = max(self._groups)
            rest = self._kept - len(self._groups[largest])
            if rest < self.keep_rows:
                return
            del self._groups[largest]
            self._kept = rest

    def rows(self) -> List[Row]:
        """The rows to show, in path order, with group breaks; at most keep_rows lines."""
        self._close_group()
        out: List[Row] = []
        shown = 0
        for path in sorted(self._groups):
            previous = None
            for row in self._groups[path]:
                if shown == self.keep_rows:
                    return out
                if self.context and out and (previous is None or row.number > previous.number + 1):
                    out.append(Row("--"))
                out.append(row)
                shown += 1
                previous = row
        return out

    def totals(self) -> Tuple[int, int]:
        """(matches, files): rg's --stats when it printed them, else what was seen."""
        import re

        matches = re.search(_STATS_MATCHES, self.output.stats)
        files = re.search(_STATS_FILES, self.output.stats)
        if matches and files:
            return int(matches.group(1)), int(files.group(1))
        return self.match_lines, self.files_seen
