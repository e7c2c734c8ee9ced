"""The row text the app shows for each call: a pure function, table-tested.

The product page's "Row reads" table, to the letter; the parts a row joins
are separated by ``ROW_SEP``:

    shell         Run <first line> / Start <first line> (background);
                  "· timed out" or "· exit N" when not 0
    shell_status  List background commands / Check b1 / Stop b1
    file_read     Read <path> / Read <path> from line N;
                  "· unchanged since step N" for a repeated read
    code_search   Search files / Search lines, with "in <path>"

Where the page is silent: a call that failed (is_error) ends with
"· error"; <first line> is the command's first non-blank line, stripped and
clipped at ROW_MAX_CHARS with "…"; code_task (a block of its own in the app)
reads "Code task"; any other tool reads its name.
"""

from __future__ import annotations

from typing import Any, Mapping

ROW_SEP = " · "
ROW_MAX_CHARS = 80
"""A row is one line of the run's flow: a longer first line or path is clipped."""


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ROW_MAX_CHARS else text[: ROW_MAX_CHARS - 1] + "…"


def first_line(command: Any) -> str:
    """The first non-blank line of a command, stripped and clipped."""
    if not isinstance(command, str):
        return ""
    for line in command.splitlines():
        if line.strip():
            return _clip(line.strip())
    return ""


def _shell(args: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
    verb = "Start" if args.get("background") is True else "Run"
    parts = [f"{verb} {first_line(args.get('command'))}".rstrip()]
    if meta.get("timed_out") is True:
        parts.append("timed out")
    elif isinstance(meta.get("exit_code"), int) and meta["exit_code"] != 0:
        parts.append(f"exit {meta['exit_code']}")
    return parts


def _shell_status(args: Mapping[str, Any]) -> list[str]:
    bid = args.get("id")
    if not isinstance(bid, str) or not bid:
        return ["List background commands"]
    return [f"{'Stop' if args.get('stop') is True else 'Check'} {_clip(bid)}"]


def _file_read(args: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
    path = args.get("path")
    head = f"Read {_clip(path)}" if isinstance(path, str) else "Read"
    offset = args.get("offset")
    if isinstance(offset, int) and not isinstance(offset, bool) and offset > 1:
        head += f" from line {offset}"
    parts = [head]
    if isinstance(meta.get("repeat_of"), int):
        parts.append(f"unchanged since step {meta['repeat_of']}")
    return parts


def _code_search(args: Mapping[str, Any]) -> list[str]:
    head = "Search lines" if args.get("mode") == "content" else "Search files"
    path = args.get("path")
    return [f"{head} in {_clip(path)}" if isinstance(path, str) and path else head]


def row_text(tool: str, args: Mapping[str, Any], meta: Mapping[str, Any], is_error: bool) -> str:
    """The row of one call in the run's flow."""
    args = args if isinstance(args, Mapping) else {}
    if tool == "shell":
        parts = _shell(args, meta)
    elif tool == "shell_status":
        parts = _shell_status(args)
    elif tool == "file_read":
        parts = _file_read(args, meta)
    elif tool == "code_search":
        parts = _code_search(args)
    elif tool == "code_task":
        parts = ["Code task"]
    else:
        parts = [_clip(str(tool)) or "Tool call"]
    if is_error:
        parts.append("error")
    return ROW_SEP.join(parts)
