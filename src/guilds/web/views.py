"""A call opened: its three views, as pure functions of its (redacted) record; the
Result view redacts what it renders once more (``shown``).

The product page:

    Arguments  The call's arguments
    Result     Text as Markdown, with Raw for the text as returned; JSON as a tree
    Metadata   The call and the tool, then the exit code, the Full output log,
               the working directory, the file and its lines, and Same as step
               for a repeated read

Beyond the page: an ``Egress`` row for each connection the call's commands
asked of the egress proxy (agent.network a list, docs/network.md).

Where the page is silent: the Result view opens first; a string argument is
shown as given and any other value as JSON; an exit code of a command that
timed out reads ``124 (timed out)``; the lines read ``a–b of n``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from markupsafe import Markup

from guilds_code.redact import Redactor

from ..record.values import CallRecord
from .flow import FlowItem, call_path, flow_item, log_url, running, text_of
from .logs import LOG_HEAD_BYTES, LOG_TAIL_BYTES, LogExcerpt
from .render import JsonNode, markdown_html, parse_json, redacted_tree
from .savings_view import metadata_rows, size

VIEWS = {"arguments": "Arguments", "result": "Result", "metadata": "Metadata"}
DEFAULT_VIEW = "result"
RAW = "raw"
BLOCK_CHARS = 80
"""An argument longer than this is shown as a block of lines, not inline."""


@dataclass(frozen=True)
class Argument:
    name: str
    text: str
    block: bool


def arguments_view(args: Any) -> list[Argument]:
    """The call's arguments: a string as given, any other value as JSON."""
    if not isinstance(args, dict):
        return [Argument("", json.dumps(args, indent=2, ensure_ascii=False), True)]
    out = []
    for name, value in args.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        out.append(Argument(str(name), text, "\n" in text or len(text) > BLOCK_CHARS))
    return out


@dataclass(frozen=True)
class Switch:
    label: str
    href: str
    active: bool


@dataclass(frozen=True)
class ResultView:
    raw: str
    """The text as returned to the model."""
    format: str
    """What is shown: markdown, tree (a JSON text) or raw."""
    formats: tuple[Switch, ...]
    html: Markup | None = None
    tree: JsonNode | None = None
    trailer: str = ""
    running: bool = False


def result_view(call: CallRecord, fmt: str | None = None, *, redactor: Redactor) -> ResultView:
    """The text as Markdown, or a JSON text as a tree; with ``fmt="raw"`` the text as returned.
    What Markdown renders and what JSON parses to are redacted again, as shown."""
    raw, body, trailer = call.text or "", call.body or "", call.trailer
    value = parse_json(body)
    rendered = "markdown" if value is None else "tree"
    shown = RAW if fmt == RAW else rendered
    formats = (
        Switch("Markdown" if value is None else "Tree", call_path(call.run_id, call.seq, "result"), shown != RAW),
        Switch("Raw", call_path(call.run_id, call.seq, "result", RAW), shown == RAW),
    )
    view = ResultView(raw=raw, format=shown, formats=formats, trailer=trailer, running=running(call))
    if shown == "tree":
        return replace(view, tree=redacted_tree(value, redactor))
    if shown == "markdown":
        return replace(view, html=markdown_html(body, redactor))
    return view


@dataclass(frozen=True)
class MetaRow:
    label: str
    value: str
    href: str = ""
    own_page: bool = False
    """The link opens a page of its own (the log), not the call panel."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def lines_text(meta: dict) -> str:
    """A file_read's lines: ``a–b of n`` (the range read, of the file's lines)."""
    rng, total = meta.get("range"), _int(meta.get("lines"))
    span = ""
    if isinstance(rng, list) and len(rng) == 2 and None not in map(_int, rng):
        span = f"{rng[0]}–{rng[1]}"
    if span and total is not None:
        return f"{span} of {total}"
    return span or (f"{total} lines" if total is not None else "")


def metadata_view(call: CallRecord) -> list[MetaRow]:
    """The call and the tool, then those of the page's fields the call has."""
    meta = call.meta or {}
    rows = [MetaRow("Call", text_of(meta.get("call")) or call.call_id), MetaRow("Tool", call.tool)]
    exit_code = _int(meta.get("exit_code"))
    if exit_code is not None:
        timed_out = meta.get("timed_out") is True
        rows.append(MetaRow("Exit code", f"{exit_code} (timed out)" if timed_out else str(exit_code)))
    if text_of(meta.get("log_path")):
        rows.append(MetaRow("Full output log", meta["log_path"], log_url(call.run_id, call.seq), True))
    if text_of(meta.get("cwd")):
        rows.append(MetaRow("Working directory", meta["cwd"]))
    if text_of(meta.get("path")):
        rows.append(MetaRow("File", meta["path"]))
    if lines_text(meta):
        rows.append(MetaRow("Lines", lines_text(meta)))
    repeat_of = _int(meta.get("repeat_of"))
    if repeat_of is not None:
        rows.append(MetaRow("Same as step", str(repeat_of), call_path(call.run_id, repeat_of)))
    rows += [MetaRow(label, value) for label, value in metadata_rows(meta)]
    return rows


@dataclass(frozen=True)
class CallPage:
    """A call opened: its flow item, the tabs, and the one view shown."""

    item: FlowItem
    tool: str
    view: str
    tabs: tuple[Switch, ...]
    arguments: list[Argument] | None = None
    result: ResultView | None = None
    metadata: list[MetaRow] | None = None


def egress_rows(decisions: Sequence[Mapping[str, Any]]) -> list[MetaRow]:
    """One ``Egress`` row per decision of the egress proxy for the call's commands:
    ``host:port allowed · 2.0 KB up, 15.1 KB down`` or ``host:port refused: reason``."""
    rows = []
    for d in decisions:
        where = f"{d['host']}:{d['port']}"
        if d["allowed"]:
            text = f"{where} allowed · {size(d['bytes_up'])} up, {size(d['bytes_down'])} down"
        else:
            text = f"{where} refused: {d['reason']}"
        rows.append(MetaRow("Egress", text))
    return rows


def call_page(call: CallRecord, view: str | None = None, fmt: str | None = None,
              egress: Sequence[Mapping[str, Any]] = (), *, redactor: Redactor) -> CallPage:
    """egress: the call's egress decisions (agent.network a list), listed in its Metadata."""
    view = view if view in VIEWS else DEFAULT_VIEW
    tabs = tuple(Switch(label, call_path(call.run_id, call.seq, v), v == view) for v, label in VIEWS.items())
    page = CallPage(item=flow_item(call), tool=call.tool, view=view, tabs=tabs)
    if view == "arguments":
        return replace(page, arguments=arguments_view(call.args))
    if view == "metadata":
        return replace(page, metadata=metadata_view(call) + egress_rows(egress))
    return replace(page, result=result_view(call, fmt, redactor=redactor))


@dataclass(frozen=True)
class LogView:
    """The Full output log page: the excerpt, or why there is none."""

    title: str
    path: str
    back: str
    head: str = ""
    omitted: str = ""
    """The line between head and tail, when the middle is not shown."""
    tail: str = ""
    note: str = ""
    error: str = ""


def log_view(call: CallRecord, excerpt: LogExcerpt | None, error: str = "") -> LogView:
    meta = call.meta or {}
    view = LogView(title=f"Full output log · step {call.seq}", path=text_of(meta.get("log_path")),
                   back=call_path(call.run_id, call.seq, "metadata"), error=error)
    if excerpt is None:
        return view
    if not excerpt.tail and not excerpt.omitted:
        return replace(view, head=excerpt.head, note=f"The whole log: {excerpt.size} bytes.")
    note = (f"The log is {excerpt.size} bytes: its first {LOG_HEAD_BYTES // 1024} KiB and its last "
            f"{LOG_TAIL_BYTES // 1024} KiB or less, from a line start, are shown.")
    return replace(view, head=excerpt.head, tail=excerpt.tail, note=note,
                   omitted=f"[… {excerpt.omitted} bytes of the log not shown …]")
