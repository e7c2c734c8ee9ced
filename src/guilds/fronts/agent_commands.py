"""`guilds agent new [TEMPLATE] | list | rm ID | fork SOURCE N`: agents made on demand from the settings' templates.

    new    make an agent of TEMPLATE (default: ``default``, the settings file's own
           agent), its sandbox started; prints its id, template, owner, home and expiry.
           --owner NAME (default ``local``), --expires-in SECONDS (default: never).
    list   the live agents, one line each, oldest first (--owner: one owner's).
    rm     remove the agent ID and everything of it (its sandbox, egress proxy's files,
           home and entry); every removed thing is named. --owner: only if it is that
           owner's.
    fork   make N agents of SOURCE's template whose homes start as SOURCE's home now
           (SOURCE: an agent's id, or ``self``, the settings file's own agent), or at its
           checkpoint --checkpoint NAME; prints the fork's line, then each child's. The
           fork waits for SOURCE's running calls and says so. --owner NAME (default:
           SOURCE's), --expires-in SECONDS. Files only: no running process is forked.

Every action first removes the agents whose expiry has passed. Exit status: 0
done, 2 for bad input (an unknown template, a cap reached, no such agent), 1
when a backend failed.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..record.agent_rows import AgentRecord
from .agent import Agent
from .wiring import resolve

ACTIONS = ("new", "list", "rm", "fork")
SELF = "self"
"""`guilds agent fork`'s name for the settings file's own agent."""


def _when(at: datetime | None) -> str:
    return "never" if at is None else at.strftime("%Y-%m-%dT%H:%M:%SZ")


def agent_line(record: AgentRecord) -> str:
    """One agent as `guilds agent new` and `list` print it."""
    return (f"{record.id}  template {record.template}  owner {record.owner}  home {record.home}  "
            f"made {_when(record.created_at)}  expires {_when(record.expires_at)}")


def _parser(action: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"guilds agent {action}")
    if action == "new":
        parser.add_argument("template", nargs="?", default="default", help="the template (default: default)")
    if action == "fork":
        parser.add_argument("source", help=f"the agent forked: its id, or {SELF} (the settings file's own agent)")
        parser.add_argument("n", type=int, help="how many agents to make")
        parser.add_argument("--checkpoint", metavar="NAME", help="the source's files at this checkpoint, not now")
    if action in ("new", "fork"):
        parser.add_argument("--expires-in", type=float, metavar="SECONDS", help="removed after this long")
    if action == "rm":
        parser.add_argument("id", help="the agent's id")
    parser.add_argument("--owner", default="local" if action == "new" else None,
                        help="the owner (new: default local; fork: default the source's; list, rm: only this "
                             "owner's)")
    parser.add_argument("--config", help="the settings file (default: <data folder>/settings.toml)")
    return parser


async def _act(action: str, opts: argparse.Namespace, env: Mapping[str, str]) -> list[str]:
    async with Agent(resolve(opts.config, env=env)) as agent:
        if action == "new":
            made = await agent.make_agent(opts.template, owner=opts.owner, expires_in=opts.expires_in)
            return [f"made {agent_line(made.record)}"]
        if action == "fork":
            done = await agent.fork(None if opts.source == SELF else opts.source, opts.n, checkpoint=opts.checkpoint,
                                    owner=opts.owner, expires_in=opts.expires_in)
            return [*done.forked.lines(), *(f"made {agent_line(r)}" for r in done.forked.records)]
        if action == "list":
            return [agent_line(r) for r in await agent.list_agents(owner=opts.owner)] or ["no agents"]
        return [f"removed {thing}" for thing in await agent.remove_agent(opts.id, owner=opts.owner)]


def main(action: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The `guilds agent` actions; a GuildsError goes to the CLI, which prints it."""
    opts = _parser(action).parse_args(list(argv))
    for line in asyncio.run(_act(action, opts, env)):
        print(line)
    return 0
