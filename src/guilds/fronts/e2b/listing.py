"""``GET /v2/sandboxes`` and ``GET /sandboxes``: a key's sandboxes, filtered, ordered and paged as E2B's
API pages them.

v2 query (each optional):

- ``state``: ``running``, ``paused`` or both, comma separated (default both);
- ``metadata``: ``key=value`` pairs joined by ``&``, the whole and each key and value
  URL-encoded as the SDKs send them; a sandbox is listed when it has every pair;
- ``template``: a template id or name; the sandboxes of the template it names (none when it
  names no template; a ``name:tag`` is refused: sandboxes are not tagged);
- ``startedAfter``: an ISO 8601 time; the sandboxes started at or after it;
- ``order``: ``desc`` (newest first, the default) or ``asc``;
- ``limit``: 1 to E2B_LIST_MAX_LIMIT (default that), and ``nextToken``: where the page begins.

The order is by start time, ties by id (descending: ids ascending; ascending: the reverse).
A page that is not the last carries ``X-Next-Token``: the last sandbox's start time and id,
with ``__asc`` for the ascending order, base64 (URL alphabet), E2B's token; a token of the
other order is refused. With running sandboxes asked for, ``X-Total-Running`` counts those
that pass the filters. A bad value is answered 400 with E2B's body naming it.

v1 lists the running sandboxes, newest first, filtered by ``metadata`` only, unpaged.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

from ...limits import E2B_LIST_MAX_LIMIT
from .connect import ConnectError
from .sandboxes import PAUSED, RUNNING, E2BSandbox

ASC, DESC = "asc", "desc"
_SEPARATOR = "__"


def _bad(message: str) -> ConnectError:
    return ConnectError("invalid_argument", message)


def metadata_filter(value: str | None) -> dict[str, str]:
    """The pairs of a ``metadata`` query value (decoded once more as a whole, then each key and
    value: the SDKs encode them twice)."""
    if value is None:
        return {}
    found = {}
    for pair in unquote_plus(value).split("&"):
        parts = pair.split("=")
        if len(parts) != 2:
            raise _bad(f"Error parsing metadata: {pair!r} is not a key=value pair")
        found[unquote_plus(parts[0])] = unquote_plus(parts[1])
    return found


def _time(text: str, what: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _bad(f"{what}: {text[:64]!r} is not an ISO 8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Cursor:
    started_at: datetime
    sandbox_id: str

    def token(self, order: str) -> str:
        text = _SEPARATOR.join([_iso(self.started_at), self.sandbox_id, *([ASC] if order == ASC else [])])
        return base64.urlsafe_b64encode(text.encode()).decode()

    @classmethod
    def of_token(cls, token: str, order: str) -> Cursor:
        try:
            parts = base64.urlsafe_b64decode(token.encode("ascii")).decode().split(_SEPARATOR)
        except (binascii.Error, UnicodeError, ValueError):
            raise _bad("Invalid next token: not a token this server gave") from None
        if not 2 <= len(parts) <= 3 or (len(parts) == 3 and parts[2] != ASC):
            raise _bad("Invalid next token: not a token this server gave")
        if (len(parts) == 3) != (order == ASC):
            raise _bad("Invalid next token: the cursor was issued for a different sort order")
        return cls(_time(parts[0], "Invalid next token"), parts[1])


@dataclass(frozen=True)
class Query:
    states: frozenset[str]
    metadata: dict[str, str]
    order: str = DESC
    template: str | None = None
    started_after: datetime | None = None
    limit: int = E2B_LIST_MAX_LIMIT
    cursor: Cursor | None = None

    @classmethod
    def of_v2(cls, query: Mapping[str, str]) -> Query:
        states = frozenset(query.get("state", f"{RUNNING},{PAUSED}").split(","))
        if not states <= {RUNNING, PAUSED}:
            raise _bad(f"state: running, paused or both (comma separated), not {query['state'][:64]!r}")
        order = query.get("order", DESC)
        if order not in (ASC, DESC):
            raise _bad(f"Invalid order parameter: unknown order {order[:16]!r}")
        template = query.get("template")
        if template is not None and ":" in template:
            raise _bad("Invalid template: tags are not supported here because sandboxes are not tag-scoped")
        started = query.get("startedAfter")
        token = query.get("nextToken")
        return cls(states, metadata_filter(query.get("metadata")), order, template,
                   None if started is None else _time(started, "startedAfter"), _limit(query.get("limit")),
                   Cursor.of_token(token, order) if token else None)

    def passes(self, box: E2BSandbox, same_template: Callable[[str], bool]) -> bool:
        return (box.state in self.states and all(box.metadata.get(k) == v for k, v in self.metadata.items())
                and (self.started_after is None or box.started_at >= self.started_after)
                and (self.template is None or same_template(box.template)))

    def after_cursor(self, box: E2BSandbox) -> bool:
        if self.cursor is None:
            return True
        at, ident = self.cursor.started_at, self.cursor.sandbox_id
        if self.order == ASC:
            return box.started_at > at or (box.started_at == at and box.id < ident)
        return box.started_at < at or (box.started_at == at and box.id > ident)


def _limit(value: str | None) -> int:
    if value is None:
        return E2B_LIST_MAX_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= E2B_LIST_MAX_LIMIT:
        raise _bad(f"limit: a whole number from 1 to {E2B_LIST_MAX_LIMIT}, not {value[:16]!r}")
    return int(value)


def ordered(boxes: Iterable[E2BSandbox], order: str) -> list[E2BSandbox]:
    """By start time, ties by id: descending with ids ascending, or the exact reverse."""
    rising = sorted(sorted(boxes, key=lambda box: box.id, reverse=True), key=lambda box: box.started_at)
    return rising if order == ASC else rising[::-1]


def page(boxes: Iterable[E2BSandbox], query: Query, template_of: Callable[[str], str],
         client_id: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The page's listed sandboxes and its headers (``X-Next-Token``, ``X-Total-Running``)."""
    wanted = None
    if query.template is not None:
        try:
            wanted = template_of(query.template)
        except ConnectError:  # names no template: none of its sandboxes
            return [], ({"X-Total-Running": "0"} if RUNNING in query.states else {})
    def same(template: str) -> bool:
        try:
            return template_of(template) == wanted
        except ConnectError:  # made from a snapshot, named by its name: that name only
            return template == query.template

    passing = [box for box in boxes if query.passes(box, same)]
    headers = {}
    if RUNNING in query.states:
        headers["X-Total-Running"] = str(sum(box.state == RUNNING for box in passing))
    found = ordered(filter(query.after_cursor, passing), query.order)
    if len(found) > query.limit:
        found = found[:query.limit]
        headers["X-Next-Token"] = Cursor(found[-1].started_at, found[-1].id).token(query.order)
    return [box.listed(client_id) for box in found], headers


def running_v1(boxes: Iterable[E2BSandbox], query: Mapping[str, str], client_id: str) -> list[dict[str, Any]]:
    """v1's answer: the running sandboxes with every ``metadata`` pair, newest first."""
    wanted = metadata_filter(query.get("metadata"))
    return [box.listed(client_id) for box in ordered(boxes, DESC)
            if box.state == RUNNING and all(box.metadata.get(k) == v for k, v in wanted.items())]
