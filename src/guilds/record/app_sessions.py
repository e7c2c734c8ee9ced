"""The app's login sessions in the run record, so every server on the record holds them.

    Terms(idle, max_age, most, touch)          how long a session lives, how many, how often its use is written
    start(conn, digest, principal, now, terms)  a login: stale sessions end, the least recently used past most too
    state(conn, digest, principal, now, terms) -> Held   what a request's cookie holds
    touch(conn, digest, now) / end(conn, digest) -> bool

A session is its cookie value's SHA-256 (``guilds.web.sessions`` hashes it) and the
principal of the token at its login: a new token ends every session made under the old one.
A request writes nothing unless the session's use is older than ``touch``, so an app
page costs one read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from .schema import app_sessions
from .statements import as_utc


@dataclass(frozen=True)
class Terms:
    idle: timedelta
    """A session ends after this long without a request."""
    max_age: timedelta
    """A session ends this long after its login."""
    most: int
    """At most this many live at once; a login past it ends the one used least recently."""
    touch: timedelta
    """A request writes its session's use only when the last written one is older than this."""


class Held(enum.Enum):
    NO = "no"
    """No live session: none with that value, another token's, or stale (the next login deletes it)."""
    YES = "yes"
    STALE_USE = "stale use"
    """Live, its last use written longer than ``Terms.touch`` ago: write it."""


def _stale(now: datetime, terms: Terms) -> sa.ColumnElement[bool]:
    return sa.or_(app_sessions.c.used_at <= now - terms.idle, app_sessions.c.started_at <= now - terms.max_age)


def start(conn: sa.Connection, digest: str, principal: str, now: datetime, terms: Terms) -> None:
    conn.execute(sa.delete(app_sessions).where(_stale(now, terms)))
    kept = (sa.select(app_sessions.c.digest).order_by(app_sessions.c.used_at.desc())
            .limit(max(terms.most - 1, 0)).scalar_subquery())
    conn.execute(sa.delete(app_sessions).where(app_sessions.c.digest.not_in(kept)))
    conn.execute(sa.insert(app_sessions).values(digest=digest, principal=principal, started_at=now, used_at=now))


def state(conn: sa.Connection, digest: str, principal: str, now: datetime, terms: Terms) -> Held:
    row = conn.execute(sa.select(app_sessions.c.principal, app_sessions.c.started_at, app_sessions.c.used_at)
                       .where(app_sessions.c.digest == digest)).one_or_none()
    if row is None or row.principal != principal:
        return Held.NO
    started, used = as_utc(row.started_at), as_utc(row.used_at)
    if now - used >= terms.idle or now - started >= terms.max_age:
        return Held.NO
    return Held.STALE_USE if now - used >= terms.touch else Held.YES


def touch(conn: sa.Connection, digest: str, now: datetime) -> None:
    conn.execute(sa.update(app_sessions).values(used_at=now).where(app_sessions.c.digest == digest))


def end(conn: sa.Connection, digest: str) -> bool:
    return bool(conn.execute(sa.delete(app_sessions).where(app_sessions.c.digest == digest)).rowcount)
