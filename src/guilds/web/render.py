"""The Result view's renderings: Markdown to safe HTML, and JSON as a tree.

Markdown is CommonMark (plus tables and strikethrough) through markdown-it-py
with raw HTML off: a ``<script>`` in a result is shown as text, never run.
What it renders is redacted again as it reads (``shown.redact_html``):
Markdown's escapes, character references and inline marks can put a secret
back together that the text holds in no one piece.
Line breaks are kept (``breaks``), because a tool's text is lines of output
more often than prose. Links keep markdown-it's own check (no ``javascript:``),
and the app's Content-Security-Policy keeps images to the app itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

from guilds_code.redact import Redactor

from ..record.redaction import redact_meta
from .shown import redact_html

_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


def markdown_html(text: str, redactor: Redactor) -> Markup:
    """Text as Markdown, rendered to HTML in which raw HTML stays text, redacted as it shows."""
    return Markup(redact_html(_MD.render(text), redactor))  # noqa: S704 - raw HTML is off: the renderer escapes it


@dataclass(frozen=True)
class JsonNode:
    """One node of a JSON tree. ``text`` is a scalar's JSON, or a container's size."""

    key: str | None
    kind: str
    """object, array, string, number, boolean or null."""
    text: str
    children: tuple[JsonNode, ...] = ()


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def redacted_tree(value: Any, redactor: Redactor) -> JsonNode:
    """A parsed JSON value as a tree, its keys and strings redacted once parsed (their escapes undone)."""
    return json_tree(redact_meta(redactor, value))


def json_tree(value: Any, key: str | None = None) -> JsonNode:
    """A parsed JSON value as a tree of nodes."""
    kind = _kind(value)
    if kind == "object":
        children = tuple(json_tree(v, str(k)) for k, v in value.items())
        return JsonNode(key, kind, _count("{}", len(children), "key"), children)
    if kind == "array":
        children = tuple(json_tree(v, str(i)) for i, v in enumerate(value))
        return JsonNode(key, kind, _count("[]", len(children), "item"), children)
    return JsonNode(key, kind, json.dumps(value, ensure_ascii=False))


def _count(brackets: str, n: int, noun: str) -> str:
    """``{}`` when empty, else ``{…} 3 keys``."""
    if n == 0:
        return brackets
    return f"{brackets[0]}…{brackets[1]} {n} {noun}{'' if n == 1 else 's'}"


def parse_json(text: str) -> Any | None:
    """The text's JSON object or array, or None when it is not one."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return json.loads(stripped, parse_constant=_refuse)
    except ValueError:
        return None


def _refuse(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")
