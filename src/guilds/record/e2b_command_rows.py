"""The running commands of shared E2B sandboxes (``guilds.fronts.e2b.shared_commands``).

    started(conn, row)                   a command's row (a row of the same sandbox and pid, left by a
                                         command whose end was not written, is replaced)
    ended(conn, sandbox_id, pid, owner)  its row gone, once its command ended
    of_sandbox(conn, sandbox_id)         the rows of the commands whose server is still on the record,
                                         each with that server's ``address``
    forget(conn, sandbox_id)             every row of the sandbox (killed or paused: its commands ended)
    forget_owners(conn, owners)          every row of servers that ended

A pid is the sandbox's own (one pid namespace a sandbox), so (sandbox_id, pid) names one
command whichever server's process service started it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from .schema import e2b_commands, owners


def started(conn: sa.Connection, row: dict[str, Any]) -> None:
    conn.execute(sa.delete(e2b_commands).where(e2b_commands.c.sandbox_id == row["sandbox_id"],
                                               e2b_commands.c.pid == row["pid"]))
    conn.execute(sa.insert(e2b_commands).values(row))


def ended(conn: sa.Connection, sandbox_id: str, pid: int, owner: str) -> None:
    conn.execute(sa.delete(e2b_commands).where(e2b_commands.c.sandbox_id == sandbox_id, e2b_commands.c.pid == pid,
                                               e2b_commands.c.owner == owner))


def of_sandbox(conn: sa.Connection, sandbox_id: str) -> list[dict[str, Any]]:
    query = (sa.select(e2b_commands, owners.c.address)
             .select_from(e2b_commands.join(owners, owners.c.id == e2b_commands.c.owner))
             .where(e2b_commands.c.sandbox_id == sandbox_id).order_by(e2b_commands.c.started_at))
    return [dict(row) for row in conn.execute(query).mappings().all()]


def forget(conn: sa.Connection, sandbox_id: str) -> None:
    conn.execute(sa.delete(e2b_commands).where(e2b_commands.c.sandbox_id == sandbox_id))


def forget_owners(conn: sa.Connection, gone: Sequence[str]) -> None:
    conn.execute(sa.delete(e2b_commands).where(e2b_commands.c.owner.in_(gone)))
