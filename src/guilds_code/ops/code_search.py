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
redirect it; a folder the agent's uid cannot enter is an error naming the
folder that stops it (reach.py). A file path is searched through rg's stdin from a descriptor
opened by paths.py (the glob does not apply to it). Exit 2 with nothing found
is an error carrying rg's message.

meta: matches (total), files (count).
"""

from __future__ import annotations

import heapq
import os

from .. import limits, paths, protocol, runstate
from ..lines import clip_counted
from ..shaping import clip_line, utf8_len
from .rg import rg_argv, rg_error, rg_program, run_rg
from .rg_output import ContentLines, FileCounts, Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Tuple

_PATTERN_SHOWN_MAX = 200


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


def _search(target: paths.Resolved, given: str, args: Dict[str, Any], sink: Any,
            home: str) -> Tuple[int, bytes, bool]:
    """Run rg on the resolved target: a folder from its descriptor, a file on stdin."""
    program = rg_program()
    timeout = limits.SEARCH_TIMEOUT_SECONDS
    if target.kind == "directory":
        target.enter(given, home)
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
        sink = ContentLines(_maximum(args), args["context"], runstate.redactor_for(request))
    with paths.resolve(request.home, cwd, given) as target:
        code, err, timed_out = _search(target, given, args, sink, request.home)
        is_file, path = target.kind != "directory", target.path
    matches, files = sink.totals()
    if code == 2 and not files and not timed_out and err:
        raise protocol.OpError(rg_error(err))
    root = paths.display(path, request.home, paths.physical_cwd(request.home, cwd))
    tail = [f"[timed out after {limits.SEARCH_TIMEOUT_SECONDS}s; the search was stopped]"] if timed_out else []
    text = _text(args, sink, root, is_file, tail, request.max_bytes)
    return protocol.Reply(text, {"matches": matches, "files": files})
