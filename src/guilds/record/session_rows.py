"""Sessions in the run record, so every server on the record holds them: the app's login
sessions (``guilds.web.sessions``) and the MCP endpoint's older-handshake sessions
(``guilds.fronts.mcp_sessions``), each kind apart.

    Terms (record.session_terms)                       how long a session lives, how many, how often its use is written
    start(conn, kind, digest, principal, now, terms)   a new one: stale ones of its kind end, and those past most
    state(conn, kind, digest, principal, now, terms) -> Held   what a request's session id holds
    touch(conn, digest, now) / end(conn, kind, digest) -> bool

A session is its value's SHA-256 (the front hashes it) and the principal of the token at
its start: a new token ends every session made under the old one. A request writes
nothing unless the session's use is older than ``touch``, so it costs one read.
"""

from __future__ import annotations

import enum
from datetime import datetime

import sqlalchemy as sa

from .schema import sessions
from .session_terms import Terms
from .statements import as_utc


class Held(enum.Enum):
    NO = "no"
    """No live session: none with that value, of another kind or token, or stale (the next start deletes it)."""
    YES = "yes"
    STALE_USE = "stale use"
    """Live, its last use written longer than ``Terms.touch`` ago: write it."""


def _stale(kind: str, now: datetime, terms: Terms) -> sa.ColumnElement[bool]:
    return sa.and_(sessions.c.kind == kind, sa.or_(sessions.c.used_at <= now - terms.idle,
                                                   sessions.c.started_at <= now - terms.max_age))


def start(conn: sa.Connection, kind: str, digest: str, principal: str, now: datetime, terms: Terms) -> None:
    conn.execute(sa.delete(sessions).where(_stale(kind, now, terms)))
    kept = (sa.select(sessions.c.digest).where(sessions.c.kind == kind).order_by(sessions.c.used_at.desc())
            .limit(max(terms.most - 1, 0)).scalar_subquery())
    conn.execute(sa.delete(sessions).where(sessions.c.kind == kind, sessions.c.digest.not_in(kept)))
    conn.execute(sa.insert(sessions).values(digest=digest, kind=kind, principal=principal, started_at=now,
                                            used_at=now))


def state(conn: sa.Connection, kind: str, digest: str, principal: str, now: datetime, terms: Terms) -> Held:
    row = conn.execute(sa.select(sessions.c.kind, sessions.c.principal, sessions.c.started_at, sessions.c.used_at)
                       .where(sessions.c.digest == digest)).one_or_none()
    if row is None or (row.kind, row.principal) != (kind, principal):
        return Held.NO
    started, used = as_utc(row.started_at), as_utc(row.used_at)
    if now - used >= terms.idle or now - started >= terms.max_age:
        return Held.NO
    return Held.STALE_USE if now - used >= terms.touch else Held.YES


def touch(conn: sa.Connection, digest: str, now: datetime) -> None:
    conn.execute(sa.update(sessions).values(used_at=now).where(sessions.c.digest == digest))


def end(conn: sa.Connection, kind: str, digest: str) -> bool:
    return bool(conn.execute(sa.delete(sessions).where(sessions.c.digest == digest, sessions.c.kind == kind)).rowcount)
