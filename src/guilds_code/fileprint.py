"""Whether a shell command only prints files: its output is their text, not diagnostics.

A command is a file print when every simple command in it (split at ``;``,
``&&``, ``||``, ``|``, ``&`` and newlines; leading ``VAR=value`` words and the
wrappers in WRAPPERS skipped; redirections dropped) runs a program of PRINTERS
(``git`` with a subcommand of GIT_PRINTERS), or one of QUIET, which prints no
file but does not make the command anything else (``cd web && cat src/app.py``).
A command this cannot read as such (a subshell, a substitution, a heredoc, a
``case``, an unbalanced quote) is not a file print: its error lines are listed.

Error lines in a file print's elided part would be the file's own text (a
``raise ValueError(...)`` in the source being read), so shell lists none
(docs/helper.md, "Error lines kept through elision").
"""

from __future__ import annotations

import re
import shlex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator, List, Optional, Tuple

PRINTERS = frozenset((
    "cat", "tac", "nl", "head", "tail", "sed", "awk", "cut", "sort", "uniq", "wc", "tr", "fold",
    "column", "less", "more", "bat", "batcat", "grep", "egrep", "fgrep", "rg", "ag", "ack",
    "ls", "find", "tree", "stat", "file", "diff", "xxd", "od", "hexdump", "strings", "jq",
))
"""Programs whose output is the text (or the names) of the files they are given."""
GIT_PRINTERS = frozenset(("show", "diff", "log", "blame", "grep", "ls-files", "cat-file"))
"""git subcommands that print the repository's files or their changes."""
QUIET = frozenset(("cd", "pushd", "popd", "echo", "printf", "true", ":", "test", "[", "read",
                   "export", "set", "for", "done", "fi"))
"""Words that begin a simple command and print no file's text themselves: cd, echo, a loop's ends."""
KEYWORDS = frozenset(("do", "then", "else", "elif", "if", "while", "until", "!", "{", "}"))
"""Shell keywords skipped before a command's program (``do cat "$f"``)."""
WRAPPERS = frozenset(("env", "command", "time", "nice", "nohup", "sudo", "xargs"))
"""Programs that run the program named after them (their options skipped)."""
_SEPARATORS = frozenset((";", "&&", "||", "|", "&", "|&", ";;", "\n"))
_UNREADABLE = ("(", ")", "<<", "$(", "`", "case")
_PUNCTUATION = ";&|()<>\n"
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def prints_files(command: str) -> bool:
    """True when command only prints files (see the module docstring)."""
    words = _words(command)
    if words is None:
        return False
    kinds = [_kind(*_program(segment)) for segment in _segments(words)]
    return "print" in kinds and all(kind in ("print", "quiet", "empty") for kind in kinds)


def _words(command: str) -> Optional[List[str]]:
    """The command's words and operators, or None when it is not read plainly."""
    if any(mark in command for mark in ("$(", "`", "<<")):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote
        return None
    return None if any(w in _UNREADABLE for w in words) else words


def _segments(words: List[str]) -> Iterator[List[str]]:
    """The simple commands, redirections (and their targets) left out."""
    segment: List[str] = []
    skip_next = False
    for word in words:
        if word in _SEPARATORS:
            yield segment
            segment, skip_next = [], False
        elif skip_next:
            skip_next = False
        elif set(word) <= set("<>&"):
            skip_next = True
            if segment and segment[-1].isdigit():
                segment.pop()  # the descriptor of 2>&1
        else:
            segment.append(word)
    yield segment


def _program(segment: List[str]) -> Tuple[Optional[str], List[str]]:
    """(program, the words after it) of a simple command, or (None, []) when it is empty."""
    at = 0
    while at < len(segment) and (_ASSIGNMENT.match(segment[at]) or segment[at] in KEYWORDS):
        at += 1
    while at < len(segment) and segment[at] in WRAPPERS:
        at += 1
        while at < len(segment) and (segment[at].startswith("-") or "=" in segment[at]):
            at += 1
    if at >= len(segment):
        return None, []
    return segment[at].rsplit("/", 1)[-1], segment[at + 1:]


def _kind(program: Optional[str], args: List[str]) -> str:
    """'print', 'quiet', 'empty' (no program) or 'other'."""
    if program is None:
        return "empty"
    if program in QUIET:
        return "quiet"
    if program in PRINTERS:
        return "print"
    if program == "git":
        sub = next((a for a in _git_args(args) if not a.startswith("-")), None)
        return "print" if sub in GIT_PRINTERS else "other"
    return "other"


def _git_args(args: List[str]) -> Iterator[str]:
    """git's words after its global options (-C DIR and -c NAME=VALUE take a value)."""
    it = iter(args)
    for arg in it:
        if arg in ("-C", "-c"):
            next(it, None)
            continue
        yield arg
