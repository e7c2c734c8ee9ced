"""The Agents page: every agent of the run record, as pure functions of the record's rows.

One row an agent: its id (a link to its runs), template, owner, state, sandbox,
when it was made, expires and was removed, its runs counted and its latest
call. The serving agent (the settings file's own, ``ServingAgent``) comes first,
on the first page, when the filters keep it; then the agents of the record,
newest first (``record.agent_listing``). A state is shown as the record holds
it, whatever it is; a value the record does not have is shown empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from ..record.agent_listing import AgentListing
from ..record.agent_rows import LIVE
from .flow import runs_href, when

DEFAULT_TEMPLATE = "default"
"""The template the serving agent is (``guilds.config.templates``)."""


@dataclass(frozen=True)
class ServingAgent:
    """The agent of the settings file the server serves: its id and sandbox kind."""

    id: str
    sandbox: str


@dataclass(frozen=True)
class AgentItem:
    id: str
    template: str
    owner: str
    state: str
    sandbox: str
    made: str
    expires: str
    """"never" for an agent made on demand without an expiry; "" where the record keeps none."""
    removed: str
    runs: int
    last_call: str
    runs_href: str
    serving: bool = False
    """The server's own agent."""


def _when(at: datetime | None) -> str:
    return when(at) if at is not None else ""


def agent_item(agent: AgentListing) -> AgentItem:
    expires = _when(agent.expires_at) or ("never" if agent.made_on_demand else "")
    return AgentItem(id=agent.id, template=agent.template or "", owner=agent.owner or "", state=agent.status or "",
                     sandbox=agent.sandbox or "", made=_when(agent.created_at), expires=expires,
                     removed=_when(agent.removed_at), runs=agent.runs, last_call=_when(agent.last_call_at),
                     runs_href=runs_href(agent.id))


def serving_item(agent: ServingAgent, runs: int, last_call: datetime | None) -> AgentItem:
    """The serving agent: the default template, live while the server runs, made by no one."""
    return AgentItem(id=agent.id, template=DEFAULT_TEMPLATE, owner="", state=LIVE, sandbox=agent.sandbox, made="",
                     expires="", removed="", runs=runs, last_call=_when(last_call), runs_href=runs_href(agent.id),
                     serving=True)


@dataclass(frozen=True)
class AgentFilters:
    """The Agents page's query: an owner, states (none: any), the offset."""

    owner: str | None = None
    states: tuple[str, ...] = ()
    offset: int = 0

    def keeps_serving(self) -> bool:
        """The serving agent has no owner and is live."""
        return self.owner is None and (not self.states or LIVE in self.states) and self.offset == 0

    def href(self, offset: int) -> str:
        query: list[tuple[str, str | int]] = [("owner", self.owner)] if self.owner is not None else []
        query += [("state", state) for state in self.states]
        query += [("offset", offset)] if offset else []
        return "/agents" + (f"?{urlencode(query)}" if query else "")


@dataclass(frozen=True)
class AgentsPage:
    items: list[AgentItem]
    newer_href: str
    older_href: str
    filters: AgentFilters
    states: list[str]
    """The states to filter by: the record's, and those asked for."""


def agents_page(listed: list[AgentListing], filters: AgentFilters, limit: int, *,
                serving: AgentItem | None = None, states: Sequence[str] = ()) -> AgentsPage:
    """``listed`` holds up to limit + 1 agents from the offset: one more means there are older ones.
    serving: the serving agent's row, shown first when the filters keep it."""
    items = [agent_item(a) for a in listed[:limit]]
    if serving is not None and filters.keeps_serving():
        items.insert(0, serving)
    offset = filters.offset
    newer = filters.href(max(0, offset - limit)) if offset > 0 else ""
    older = filters.href(offset + limit) if len(listed) > limit else ""
    shown_states = sorted({*states, *filters.states})
    return AgentsPage(items, newer, older, filters, shown_states)
