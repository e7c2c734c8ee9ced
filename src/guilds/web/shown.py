"""Rendered HTML redacted as the browser shows it.

Markdown undoes some of what redaction looks at, and joins what it never
sees whole: a character reference (``&#x41;``) becomes its character, and
emphasis or a code span between two halves of a value (``SEC*RET*``,
``SEC`RET` ``) shows the value in one piece though the text holds it in
none. So the Result view's HTML is redacted once more, as it reads: its text
nodes joined into one text (a value across elements is found whole; the part
in the first node becomes ``[REDACTED]``, the rest is dropped), and each
attribute value on its own (a link's address, an image's alt text, a code
block's language).

HTML that needs no change is returned as it came.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from html.parser import HTMLParser

from guilds_code.redact import MARK, Redactor

Attrs = list[tuple[str, str | None]]


@dataclass
class _Tag:
    name: str
    attrs: Attrs
    closed: bool = False
    end: bool = False

    def html(self) -> str:
        if self.end:
            return f"</{self.name}>"
        attrs = "".join(f" {k}" if v is None else f' {k}="{escape(v)}"' for k, v in self.attrs)
        return f"<{self.name}{attrs}{' /' if self.closed else ''}>"


class _Parts(HTMLParser):
    """HTML as a list of tags and texts (character references resolved)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.parts: list[_Tag | str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: Attrs) -> None:
        self.parts.append(_Tag(tag, attrs))

    def handle_startendtag(self, tag: str, attrs: Attrs) -> None:
        self.parts.append(_Tag(tag, attrs, closed=True))

    def handle_endtag(self, tag: str) -> None:
        self.parts.append(_Tag(tag, [], end=True))

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def redact_html(html: str, redactor: Redactor) -> str:
    """html (made by the app's own renderer) with every secret redacted from what it shows."""
    if not redactor:
        return html
    parts = _Parts(html).parts
    changed = _redact_attrs(parts, redactor)
    texts = [i for i, part in enumerate(parts) if isinstance(part, str)]
    pieces = [str(parts[i]).encode("utf-8", "surrogateescape") for i in texts]
    spans = redactor.spans(b"".join(pieces))
    if not spans and not changed:
        return html
    for i, text in zip(texts, _cut(pieces, spans), strict=True):
        parts[i] = text
    return "".join(escape(part, quote=False) if isinstance(part, str) else part.html() for part in parts)


def _redact_attrs(parts: list[_Tag | str], redactor: Redactor) -> bool:
    """Redact every attribute value in place; whether any changed."""
    changed = False
    for part in parts:
        if isinstance(part, _Tag) and part.attrs:
            attrs = [(k, None if v is None else redactor.redact(v)) for k, v in part.attrs]
            changed |= attrs != part.attrs
            part.attrs = attrs
    return changed


def _cut(pieces: list[bytes], spans: list[tuple[int, int]]) -> list[str]:
    """The pieces of one joined text with each span of it replaced by MARK, put where the span starts."""
    out, offset, spans = [], 0, list(spans)
    for piece in pieces:
        end, kept, pos = offset + len(piece), [], offset
        while spans and spans[0][0] < end:
            start, stop = spans[0]
            if start >= pos:
                kept += [piece[pos - offset:start - offset], MARK.encode()]
            pos = max(pos, min(stop, end))
            if stop > end:
                break
            spans.pop(0)
        kept.append(piece[pos - offset:])
        out.append(b"".join(kept).decode("utf-8", "surrogateescape"))
        offset = end
    return out
