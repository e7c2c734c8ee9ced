"""code_search: ripgrep over the text of the files under a path inside the home.

Result text (exact). files mode (default), highest count first, ties in path order::

    <path>: N matches                one line per file (N as rg --count-matches counts;
                                     "1 match")
    … K more files                   when more than the maximum matched
    M matches in F files             the totals ("1 match in 1 file")

content mode, rg's own groups (``--`` between groups when context > 0)::

    <path>:<line>: <text>            a matching line
    <path>-<line>- <text>            a context line (context 0 to 5)
    … K more lines                   when more than the maximum were found
    M matches in F files             the totals; with " (counting at most 10
                                     matching lines per file)" when a file had 10

    no matches for '<pattern>' in <path>
    [stopped to stay under B bytes; K lines left out]
                                     in place of "… K more", when the byte cap
                                     stops the result: K counts every file or
                                     match/context line not shown
    [timed out after 60s; the search was stopped]
                                     last, after the totals of what was found

Paths are relative to the run's working directory, or ``~/...`` outside it
(paths.display), so they can be passed back to file_read; the no-match line names
the searched path the same way (``.`` for the working directory).

Maxima: 30 files, 40 lines (match and context lines; ``--`` does not count),
10 matching lines per file (rg --max-count). ``limit`` lowers the mode's maximum;
a limit above it is clamped to it. A line is clipped to 300 characters after its
secrets are redacted; rg's output is read in chunks and a long line is kept only
up to what its clip shows. In content mode the totals are rg's --stats, which
count matches within the 10 lines per file that rg searched for.

The search: rg with --no-config (and RIPGREP_CONFIG_PATH removed from its
environment), the pattern as --regexp=, the glob as --glob=, ``--`` before the
path. It respects .gitignore and .ignore files, also outside a git repository
(--no-require-git), searches hidden files but not .git folders nor the helper's
own .runs folder, skips binary files, and does not follow links. The path must
resolve inside the home (paths.py); rg runs with its working directory set from
the descriptor of the resolved folder, so a link swapped in afterwards cannot
redirect it. A file path is searched through rg's stdin from a descriptor
opened by paths.py (the glob does not apply to it). Exit 2 with nothing found
is an error carrying rg's message.

meta: matches (total), files (count).
"""

from __future__ import annotations

import heapq
import os
import re
import selectors
import shutil
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import limits, paths, protocol, runstate
from ..shaping import utf8_len
from .file_read import LineHead, clip_counted, keep_bytes, make_redactor

EXCLUDED = ("!.git", "!.runs")
"""Globs added after the model's: later globs win, so these always apply."""
_HEADER = re.compile(rb"([0-9]+)([:-])")
_NOTE = re.compile(rb": (WARNING: |binary file matches)")
_STATS_MATCHES = re.compile(rb"^([0-9]+) matches$", re.M)
_STATS_FILES = re.compile(rb"^([0-9]+) files contained matches$", re.M)
_READ_SIZE = 256 * 1024
_STATS_MAX = 4096


# --- running rg ---------------------------------------------------------------
def rg_program() -> str:
    program = shutil.which("rg")
    if program is None:
        raise protocol.OpError("code_search: rg (ripgrep) is not installed in the sandbox")
    return program


def rg_argv(program: str, args: Dict[str, Any], root: str) -> List[str]:
    """The whole rg command line: no pattern or glob can be read as an option."""
    argv = [program, "--no-config", "--no-require-git", "--hidden", "--no-messages"]
    argv += ["--color=never", "--null", "--with-filename"]
    if args["mode"] == "files":
        argv.append("--count-matches")
    else:
        argv += ["--line-number", "--no-heading", "--stats"]
        argv += [f"--max-count={limits.SEARCH_MATCHES_PER_FILE}", f"--context={args['context']}"]
    if args["fixed"]:
        argv.append("--fixed-strings")
    if args["ignore_case"]:
        argv.append("--ignore-case")
    if args["glob"] is not None:
        argv.append(f"--glob={args['glob']}")
    argv += [f"--glob={glob}" for glob in EXCLUDED]
    return argv + [f"--regexp={args['pattern']}", "--", root]


def run_rg(argv: List[str], stdin: int, timeout: float, sink: Callable[[bytes], None]) -> Tuple[int, bytes, bool]:
    """Run argv, feeding its stdout to sink as it comes; (exit code, stderr start, timed out).

    Runs in the helper's working directory. Past timeout seconds the process is
    killed. At most limits.SEARCH_STDERR_MAX_BYTES of stderr are kept.
    """
    env = {k: v for k, v in os.environ.items() if k != "RIPGREP_CONFIG_PATH"}
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    err = bytearray()
    deadline = time.monotonic() + timeout
    timed_out = False
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, sink)
        selector.register(proc.stderr, selectors.EVENT_READ, None)
        while selector.get_map() and not timed_out:
            left = deadline - time.monotonic()
            timed_out = left <= 0
            for key, _ in selector.select(max(left, 0)):
                data = os.read(key.fd, _READ_SIZE)
                if not data:
                    selector.unregister(key.fileobj)
                elif key.data is not None:
                    key.data(data)
                else:
                    err += data[: limits.SEARCH_STDERR_MAX_BYTES - len(err)]
    if timed_out:
        proc.kill()
    code = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return code, bytes(err), timed_out


def rg_error(stderr: bytes) -> str:
    """rg's error as one line: 'regex parse error: unclosed group', 'error parsing glob ...'."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return "code_search: rg failed"
    first = lines[0][4:] if lines[0].startswith("rg: ") else lines[0]
    detail = [line for line in lines[1:] if line.startswith("error: ")]
    if first.endswith(":") and detail:
        first = f"{first} {detail[-1][len('error: '):]}"
    return f"code_search: {first}"


# --- reading rg's output ------------------------------------------------------
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
    """One line of content-mode output: kind ':' match, '-' context, '!' note, '--' group break."""

    def __init__(self, kind: str, path: bytes = b"", number: int = 0):
        self.kind, self.path, self.number = kind, path, number
        self.text, self.chars = "", 0


class RgOutput:
    """rg's standard output with --null, parsed as a stream into rows for a sink.

    A row is 'path NUL number (: or -) text LF', or a note 'path: WARNING: ...'
    about a binary file; '--' lines are skipped (the sink draws its own group
    breaks); an empty line starts the --stats block, kept in `stats`. For each
    row, ``sink.begin(row)`` returns a LineHead to take its text, or None to skip
    it, and ``sink.end(row, line)`` follows; a row's text is never held whole.
    """

    def __init__(self, sink: Any):
        self.sink = sink
        self.stats = b""
        self._pending = b""
        self._row: Optional[Row] = None
        self._line: Optional[LineHead] = None

    def feed(self, data: bytes) -> None:
        data = self._pending + data
        pos = 0
        while pos < len(data):
            if self.stats:
                self.stats = (self.stats + data[pos:])[:_STATS_MAX]
                pos = len(data)
            elif self._row is not None:
                pos = self._text(data, pos)
            else:
                step = self._start(data, pos)
                if step < 0:
                    break
                pos = step
        self._pending = data[pos:]
        if len(self._pending) > limits.SEARCH_PATH_MAX_BYTES:
            self._pending = b""

    def _text(self, data: bytes, pos: int) -> int:
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        if self._line is not None:
            self._line.add(data[pos:end])
        if nl < 0:
            return end
        self.sink.end(self._row, self._line)
        self._row = self._line = None
        return nl + 1

    def _start(self, data: bytes, pos: int) -> int:
        """Parse the start of a row at pos; the position after it, or -1 to wait for more."""
        if data.startswith(b"\n", pos):
            self.stats = b"\n"
            return pos + 1
        if data.startswith(b"-", pos) and len(data) - pos < 3:
            return -1
        if data.startswith(b"--\n", pos):
            return pos + 3
        nl = data.find(b"\n", pos)
        z = data.find(b"\0", pos)
        note = _NOTE.search(data, pos, nl) if nl >= 0 and (z < 0 or nl < z) else None
        if note is not None:
            self._begin(Row("!", data[pos : note.start()]))
            return note.start() + 2
        header = _HEADER.match(data, z + 1) if z >= 0 else None
        if header is None or header.end() == len(data):
            return -1
        self._begin(Row(header.group(2).decode(), data[pos:z], int(header.group(1))))
        return header.end()

    def _begin(self, row: Row) -> None:
        self._row = row
        self._line = self.sink.begin(row)


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
        self.paths: set = set()
        self.capped = False
        self._redactor = redactor if redactor else None
        self._keep = keep_bytes(limits.SEARCH_LINE_MAX_CHARS)
        self._groups: Dict[bytes, List[Row]] = {}
        self._kept = 0
        self._path: Optional[bytes] = None
        self._rows: Optional[List[Row]] = None
        self._file_matches = 0
        self.output = RgOutput(self)

    def feed(self, data: bytes) -> None:
        self.output.feed(data)

    def begin(self, row: Row) -> Optional[LineHead]:
        self.entries += 1
        if row.path != self._path:
            self._close_group()
            self._open_group(row.path)
        if row.kind == ":":
            self._count_match(row.path)
        return LineHead(self._keep, self._redactor) if self._rows is not None else None

    def end(self, row: Row, line: Optional[LineHead]) -> None:
        if line is not None and self._rows is not None:
            row.text, row.chars = line.text(strip_cr=True)
            self._rows.append(row)

    def _count_match(self, path: bytes) -> None:
        self.match_lines += 1
        self.paths.add(path)
        self._file_matches += 1
        if self._file_matches >= limits.SEARCH_MATCHES_PER_FILE:
            self.capped = True

    def _open_group(self, path: bytes) -> None:
        self._path, self._file_matches = path, 0
        wanted = self._kept < self.keep_rows or path < max(self._groups)
        self._rows = [] if wanted else None

    def _close_group(self) -> None:
        if self._rows:
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
        matches = _STATS_MATCHES.search(self.output.stats)
        files = _STATS_FILES.search(self.output.stats)
        if matches and files:
            return int(matches.group(1)), int(files.group(1))
        return self.match_lines, len(self.paths)


# --- the result text ------------------------------------------------------------
def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def totals_line(matches: int, files: int) -> str:
    return f"{_plural(matches, 'match', 'matches')} in {_plural(files, 'file', 'files')}"


def _stop(cap: int, left_out: int) -> str:
    return f"[stopped to stay under {cap} bytes; {_plural(left_out, 'line', 'lines')} left out]"


def _trim_breaks(rows: List[Tuple[str, bool]]) -> List[Tuple[str, bool]]:
    while rows and not rows[-1][1]:
        rows = rows[:-1]
    return rows


def compose(body: List[Tuple[str, bool]], hidden: int, more: str, tail: List[str], cap: int) -> str:
    """The result under cap: body rows (text, counts as a line), '… K more', then tail.

    hidden counts the lines beyond the maximum, which `more` announces. When the
    whole does not fit, the body stops at a row and a stop line, counting every
    line left out (cut or hidden), takes the place of `more`.
    """
    body = _trim_breaks(body)
    whole = [text for text, _ in body] + ([more] if hidden else []) + tail
    if utf8_len("\n".join(whole)) <= cap:
        return "\n".join(whole)
    entries = sum(1 for _, counts in body if counts) + hidden
    tail_size = utf8_len("\n".join(tail)) + 1
    used = shown = fit = 0
    for i, (text, counts) in enumerate(body, start=1):
        used += utf8_len(text) + 1
        shown += counts
        if used + utf8_len(_stop(cap, entries - shown)) + tail_size > cap:
            break
        fit = i
    kept = _trim_breaks(body[:fit])
    left_out = entries - sum(1 for _, counts in kept if counts)
    return "\n".join([text for text, _ in kept] + [_stop(cap, left_out)] + tail)


def _namer(root: str, is_file: bool) -> Callable[[bytes], str]:
    """rg's path (relative to the searched folder, './x') -> the path a result shows."""

    def name(raw: bytes) -> str:
        if is_file:
            return root
        rel = raw.decode("utf-8", "replace")
        rel = rel[2:] if rel.startswith("./") else rel
        return rel if root == "." else f"{root}/{rel}"

    return name


def _files_body(counts: FileCounts, maximum: int, name: Callable[[bytes], str]):
    top = heapq.nsmallest(maximum, counts.counts, key=lambda item: (-item[0], item[1]))
    body = [(f"{name(path)}: {_plural(count, 'match', 'matches')}", True) for count, path in top]
    hidden = len(counts.counts) - len(top)
    return body, hidden, f"… {hidden} more files"


def _row_text(row: Row, name: Callable[[bytes], str]) -> str:
    if row.kind == "--":
        return "--"
    text = clip_counted(row.text, row.chars, limits.SEARCH_LINE_MAX_CHARS)
    if row.kind == "!":
        return f"{name(row.path)}: {text}"
    head = f"{name(row.path)}{row.kind}{row.number}{row.kind}"
    return f"{head} {text}" if text else head


def _content_body(lines: ContentLines, name: Callable[[bytes], str]):
    rows = lines.rows()
    body = [(_row_text(row, name), row.kind != "--") for row in rows]
    hidden = lines.entries - sum(1 for row in rows if row.kind != "--")
    return body, hidden, f"… {hidden} more lines"


# --- the op ---------------------------------------------------------------------
def _maximum(args: Dict[str, Any]) -> int:
    top = limits.SEARCH_FILES_MAX if args["mode"] == "files" else limits.SEARCH_LINES_MAX
    return min(args["limit"] or top, top)


def _search(target: paths.Resolved, given: str, args: Dict[str, Any], sink: Any) -> Tuple[int, bytes, bool]:
    """Run rg on the resolved target: a folder from its descriptor, a file on stdin."""
    program = rg_program()
    timeout = limits.SEARCH_TIMEOUT_SECONDS
    if target.kind == "directory":
        os.fchdir(target.fd)
        return run_rg(rg_argv(program, args, "."), subprocess.DEVNULL, timeout, sink.feed)
    fd = target.open_regular(given)
    try:
        return run_rg(rg_argv(program, args, "-"), fd, timeout, sink.feed)
    finally:
        os.close(fd)


def run(request: protocol.Request) -> protocol.Reply:
    """Search args.pattern under args.path (see the module docstring)."""
    args = request.args
    given = args["path"] if args["path"] is not None else "."
    cwd = runstate.current_cwd(request)
    files_mode = args["mode"] == "files"
    sink: Any = FileCounts() if files_mode else ContentLines(_maximum(args), args["context"], make_redactor(request))
    with paths.resolve(request.home, cwd, given) as target:
        code, err, timed_out = _search(target, given, args, sink)
        is_file, path = target.kind != "directory", target.path
    matches, files = sink.totals()
    if code == 2 and not files and not timed_out and err:
        raise protocol.OpError(rg_error(err))
    root = paths.display(path, request.home, paths.physical_cwd(request.home, cwd))
    tail = [f"[timed out after {limits.SEARCH_TIMEOUT_SECONDS}s; the search was stopped]"] if timed_out else []
    meta = {"matches": matches, "files": files}
    if not files:
        return protocol.Reply("\n".join([f"no matches for '{args['pattern']}' in {root}"] + tail), meta)
    name = _namer(root, is_file)
    if files_mode:
        body, hidden, more = _files_body(sink, _maximum(args), name)
        totals = totals_line(matches, files)
    else:
        body, hidden, more = _content_body(sink, name)
        totals = totals_line(matches, files)
        if sink.capped:
            totals += f" (counting at most {limits.SEARCH_MATCHES_PER_FILE} matching lines per file)"
    return protocol.Reply(compose(body, hidden, more, [totals] + tail, request.max_bytes), meta)
