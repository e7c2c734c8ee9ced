"""code_search: ripgrep over the text of the files under a path inside the home.

Result text (exact). files mode (default), highest count first, ties in path order::

    <path>: N matches                one line per file (N as rg --count-matches counts;
                                     "1 match")
    … K more files                   when more than the maximum matched
    M matches in F files             the totals ("1 match in 1 file")

content mode, files in path order (the same lines every time, whatever order
rg's threads finish in), ``--`` between groups when context > 0 (between files
and where line numbers jump, as rg draws them)::

    <path>:<line>: <text>            a matching line
    <path>-<line>- <text>            a context line (context 0 to 5)
    <path>: WARNING: stopped searching binary file after match (...)
                                     rg's note on a file it found binary midway
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
import select
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import limits, paths, protocol, runstate
from ..shaping import clip_line, utf8_len
from .file_read import LineHead, clip_counted, keep_bytes, make_redactor, spawn

EXCLUDED = ("!.git", "!.runs")
"""Globs added after the model's: later globs win, so these always apply."""
_HEADER = re.compile(rb"([0-9]+)([:-])")
"""After a path's NUL: the line number and ':' (a match) or '-' (context)."""
_NOTE = re.compile(rb": (WARNING: |binary file matches)")
_STATS_MATCHES = re.compile(rb"^([0-9]+) matches$", re.MULTILINE)
_STATS_FILES = re.compile(rb"^([0-9]+) files contained matches$", re.MULTILINE)
_READ_SIZE = 256 * 1024
_STATS_MAX = 4096
_PATTERN_SHOWN_MAX = 200


# --- running rg ---------------------------------------------------------------
def rg_program() -> str:
    """rg's absolute path, found on PATH (as shutil.which, without importing shutil)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", "rg")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise protocol.OpError("code_search: rg (ripgrep) is not installed in the sandbox")


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


def run_rg(argv: List[str], stdin: Optional[int], timeout: float, sink: Callable[[bytes], None]) -> Tuple[int, bytes, bool]:
    """Run argv, feeding its stdout to sink as it comes; (exit code, stderr start, timed out).

    stdin is a descriptor to read from, or None for /dev/null. Runs in the
    helper's working directory, without RIPGREP_CONFIG_PATH in its environment.
    Past timeout seconds the process is killed (exit code -9). At most
    limits.SEARCH_STDERR_MAX_BYTES of stderr are kept.
    """
    env = {k: v for k, v in os.environ.items() if k != "RIPGREP_CONFIG_PATH"}
    try:
        pid, out_r, err_r = spawn(argv, stdin, env)
    except OSError as exc:
        raise protocol.OpError(f"code_search: cannot run {argv[0]}: {exc.strerror}") from None
    err = bytearray()
    deadline = time.monotonic() + timeout
    poller = select.poll()
    open_fds = {out_r, err_r}
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                break
            for fd, _ in poller.poll(left * 1000):
                data = os.read(fd, _READ_SIZE)
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                elif fd == out_r:
                    sink(data)
                else:
                    err += data[: limits.SEARCH_STDERR_MAX_BYTES - len(err)]
    finally:
        os.close(out_r)
        os.close(err_r)
    status = os.waitpid(pid, 0)[1]
    return os.waitstatus_to_exitcode(status), bytes(err), bool(open_fds)


def rg_error(stderr: bytes) -> str:
    """rg's error as one line: 'regex parse error: unclosed group', 'error parsing glob ...'."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return "code_search: rg failed"
    first = lines[0].removeprefix("rg: ")
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
            header = _HEADER.match(line, z + 1) if z > 0 else None
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
        note = _NOTE.search(line)
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
        header = _HEADER.match(tail, z + 1) if z > 0 else None
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
        row.text, row.chars = row.line.text(strip_cr=True)
        row.line = None
        self._rows.append(row)

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
        return self.match_lines, self.files_seen


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
        rel = rel.removeprefix("./")
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
        return run_rg(rg_argv(program, args, "."), None, timeout, sink.feed)
    fd = target.open_regular(given)
    try:
        return run_rg(rg_argv(program, args, "-"), fd, timeout, sink.feed)
    finally:
        os.close(fd)


def _totals(sink: Any, matches: int, files: int) -> str:
    line = totals_line(matches, files)
    if getattr(sink, "capped", False):
        line += f" (counting at most {limits.SEARCH_MATCHES_PER_FILE} matching lines per file)"
    return line


def _text(args: Dict[str, Any], sink: Any, root: str, is_file: bool, tail: List[str], cap: int) -> str:
    """The result text for what rg found under root (see the module docstring)."""
    matches, files = sink.totals()
    if not files:
        pattern = clip_line(args["pattern"], _PATTERN_SHOWN_MAX)
        return "\n".join([f"no matches for '{pattern}' in {root}"] + tail)
    name = _namer(root, is_file)
    if isinstance(sink, FileCounts):
        body, hidden, more = _files_body(sink, _maximum(args), name)
    else:
        body, hidden, more = _content_body(sink, name)
    return compose(body, hidden, more, [_totals(sink, matches, files)] + tail, cap)


def run(request: protocol.Request) -> protocol.Reply:
    """Search args.pattern under args.path (see the module docstring)."""
    args = request.args
    given = args["path"] if args["path"] is not None else "."
    cwd = runstate.current_cwd(request)
    if args["mode"] == "files":
        sink: Any = FileCounts()
    else:
        sink = ContentLines(_maximum(args), args["context"], make_redactor(request))
    with paths.resolve(request.home, cwd, given) as target:
        code, err, timed_out = _search(target, given, args, sink)
        is_file, path = target.kind != "directory", target.path
    matches, files = sink.totals()
    if code == 2 and not files and not timed_out and err:
        raise protocol.OpError(rg_error(err))
    root = paths.display(path, request.home, paths.physical_cwd(request.home, cwd))
    tail = [f"[timed out after {limits.SEARCH_TIMEOUT_SECONDS}s; the search was stopped]"] if timed_out else []
    text = _text(args, sink, root, is_file, tail, request.max_bytes)
    return protocol.Reply(text, {"matches": matches, "files": files})
