"""The agents of the run record as the app lists them, with their runs counted.

    query(owner, statuses, besides, limit, offset)   a page of AgentListing rows, newest first
    run_totals(agent_id)                              an agent's runs: how many, the last call's start
    statuses()                                        the statuses the ``agents`` table holds

An agent of the record is one made on demand (a row of ``agents``) or one that
only has runs (a settings file's own agent, whose runs name it): the latter has
no template, owner, sandbox or status in the record, and its first run's start
stands for when it was made. A filter on the owner or the status keeps only the
agents made on demand. ``besides`` leaves one agent out (the serving one, which
the app lists apart). A page's run counts and last calls are read for its rows
alone, each on the runs table's ``agent_id`` index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Mapping

import sqlalchemy as sa

from .schema import agents, runs

_TIME = sa.DateTime(timezone=True)


@dataclass(frozen=True, kw_only=True)
class AgentListing:
    """One agent of the record, as listed."""

    id: str
    template: str | None
    """None: not made on demand (only its runs name it)."""
    owner: str | None
    sandbox: str | None
    status: str | None
    created_at: datetime | None
    """When it was made; for an agent that only has runs, its first run's start."""
    expires_at: datetime | None = None
    removed_at: datetime | None = None
    runs: int = 0
    last_call_at: datetime | None = None
    """The start of its latest call (its runs' latest activity); None: no run."""

    @property
    def made_on_demand(self) -> bool:
        return self.template is not None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> AgentListing:
        return cls(**{str(key): utc(value) for key, value in row.items()})


def utc(value: Any) -> Any:
    """SQLite hands a time back naive; it was written in UTC."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _unknown(name: str, kind: Any = sa.String) -> sa.Label:
    return sa.cast(sa.null(), kind).label(name)


def _listed(owner: str | None, statuses: tuple[str, ...], besides: str | None) -> sa.Subquery:
    made = sa.select(agents.c.id, agents.c.template, agents.c.owner, agents.c.sandbox, agents.c.status,
                     agents.c.created_at, agents.c.expires_at, agents.c.removed_at)
    if owner is not None:
        made = made.where(agents.c.owner == owner)
    if statuses:
        made = made.where(agents.c.status.in_(statuses))
    if owner is not None or statuses:
        return made.subquery("listed")
    only_runs = (sa.select(runs.c.agent_id.label("id"), _unknown("template"), _unknown("owner"),
                           _unknown("sandbox"), _unknown("status"), sa.func.min(runs.c.created_at).label("created_at"),
                           _unknown("expires_at", _TIME), _unknown("removed_at", _TIME))
                 .where(runs.c.agent_id.not_in(sa.select(agents.c.id)))
                 .group_by(runs.c.agent_id))
    if besides is not None:
        only_runs = only_runs.where(runs.c.agent_id != besides)
    return sa.union_all(made, only_runs).subquery("listed")


def query(*, owner: str | None = None, statuses: tuple[str, ...] = (), besides: str | None = None,
          limit: int, offset: int = 0) -> sa.Select:
    """A page of the record's agents, newest first, with their runs counted."""
    listed = _listed(owner, statuses, besides)
    newest = (listed.c.created_at.desc(), listed.c.id)
    page = sa.select(listed).order_by(*newest).limit(limit).offset(offset).subquery("page")
    count, last = _totals(page.c.id)
    return sa.select(page, count.label("runs"), last.label("last_call_at")).order_by(
        page.c.created_at.desc(), page.c.id)


def _totals(agent_id: Any) -> tuple[sa.ScalarSelect, sa.ScalarSelect]:
    of_agent = runs.c.agent_id == agent_id
    return (sa.select(sa.func.count()).select_from(runs).where(of_agent).scalar_subquery(),
            sa.select(sa.func.max(runs.c.updated_at)).where(of_agent).scalar_subquery())


def run_totals(agent_id: str) -> sa.Select:
    """One row: the agent's runs counted (``runs``) and its latest call's start (``last_call_at``)."""
    count, last = _totals(agent_id)
    return sa.select(count.label("runs"), last.label("last_call_at"))


def statuses() -> sa.Select:
    """The statuses of the ``agents`` table, in order."""
    return sa.select(agents.c.status).distinct().order_by(agents.c.status)
