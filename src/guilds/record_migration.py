"""Bring a run record written by an older version up to date, once, at setup.

Older versions kept a call's answer whole (the body with the trailer's
``remaining_tool_calls: N`` line at its end) and repeated the call's fields
(``records.CALL_FIELDS``) inside its metadata. This adds the ``remaining``
column where it is missing, splits each finished call's text into body and
count, and drops the repeated fields from its metadata. A call already split
(``remaining`` set) is left alone, so running it again changes nothing.
"""

from __future__ import annotations

import re

import sqlalchemy as sa

from .records import CALL_FIELDS, TRAILER

_TRAILER_RE = re.compile("\n?" + re.escape(TRAILER).replace(r"\{n\}", r"(\d+)") + r"\n?\Z")
BATCH = 500
"""Calls read and rewritten at a time."""


def split_trailer(text: str) -> tuple[str, str]:
    """(body, trailer): an older answer's ``remaining_tool_calls: N`` last line apart."""
    match = _TRAILER_RE.search(text)
    if not match:
        return text, ""
    return text[: match.start()], match.group().strip("\n")


def split_answer(text: str) -> tuple[str, int | None]:
    """(body, N) of an older answer; (text, None) when it has no trailer."""
    match = _TRAILER_RE.search(text)
    return (text[: match.start()], int(match.group(1))) if match else (text, None)


def migrate(conn: sa.Connection) -> None:
    """Add what the record lacks and split what older versions kept joined (sync, in a transaction)."""
    columns = {c["name"] for c in sa.inspect(conn).get_columns("calls")}
    if "remaining" not in columns:
        conn.execute(sa.text("ALTER TABLE calls ADD COLUMN remaining INTEGER"))
    _split_old_calls(conn)


def _split_old_calls(conn: sa.Connection) -> None:
    from .store import calls

    pending = (sa.select(calls.c.run_id, calls.c.seq, calls.c.text, calls.c.meta)
               .where(calls.c.remaining.is_(None), calls.c.text.is_not(None),
                      sa.tuple_(calls.c.run_id, calls.c.seq) > sa.tuple_(sa.bindparam("run"), sa.bindparam("seq")))
               .order_by(calls.c.run_id, calls.c.seq).limit(BATCH))
    update = sa.update(calls).where(calls.c.run_id == sa.bindparam("k_run"), calls.c.seq == sa.bindparam("k_seq"))
    after = {"run": "", "seq": 0}
    while rows := conn.execute(pending, after).all():
        changes = []
        for run_id, seq, text, meta in rows:
            body, remaining = split_answer(text)
            if remaining is not None:
                kept = {k: v for k, v in meta.items() if k not in CALL_FIELDS} if isinstance(meta, dict) else meta
                changes.append({"k_run": run_id, "k_seq": seq, "text": body, "meta": kept, "remaining": remaining})
        if changes:
            conn.execute(update, changes)
        after = {"run": rows[-1][0], "seq": rows[-1][1]}
