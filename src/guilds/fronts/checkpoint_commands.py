"""`guilds checkpoint NAME | --list` and `guilds rewind RUN SEQ | --name NAME`: an agent's
checkpoints from the command line (docs/checkpoints.md).

    checkpoint NAME      keep the home now under NAME; prints the checkpoint's line
    checkpoint --list    the checkpoints kept, oldest first, one line each
    rewind RUN SEQ       the files as they were before call SEQ of run RUN
    rewind --name NAME   the files as the checkpoint NAME kept them

Both take --config and --sandbox as ``guilds call`` does. Exit status: 0 done, 2 for
bad input, 1 when the checkpoint or the rewind failed (one line saying why).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import BadInput

if TYPE_CHECKING:  # the CLI's parser (and so `guilds mcp`'s first answer) imports this module: the rest on use
    from ..checkpoints import Checkpoint


def point_line(point: Checkpoint) -> str:
    """One checkpoint as the CLI prints it."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(point.at))
    what = (f"name {point.name}" if point.name is not None
            else f"run {point.run_id} call {point.seq} {point.moment}")
    return f"{point.id}  {what}  at {when}  files {point.files}  bytes {point.bytes}"


def add_parsers(sub: argparse._SubParsersAction, settings_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """The checkpoint and rewind commands, on the CLI's subcommands."""
    take = sub.add_parser("checkpoint", help="keep the agent's home now under a name, or --list the kept ones")
    take.add_argument("name", nargs="?", help="the checkpoint's name")
    take.add_argument("--list", action="store_true", help="the checkpoints kept, oldest first")
    settings_options(take)
    rewind = sub.add_parser("rewind", help="the agent's files as before call SEQ of run RUN, or a named checkpoint")
    rewind.add_argument("run", nargs="?", help="the run id")
    rewind.add_argument("seq", nargs="?", type=int, help="the call's number in the run")
    rewind.add_argument("--name", help="a checkpoint's name instead of a run's call")
    settings_options(rewind)


async def _act(opts: argparse.Namespace, env: Mapping[str, str], overrides: dict) -> list[str]:
    from .agent import Agent
    from .wiring import resolve

    async with Agent(resolve(opts.config, env=env, overrides=overrides)) as agent:
        if opts.command == "checkpoint":
            if opts.list:
                return [point_line(p) for p in agent.checkpoints()] or ["no checkpoints"]
            if not opts.name:
                raise BadInput("checkpoint: give a NAME, or --list")
            return [f"kept {point_line(await agent.checkpoint(opts.name))}"]
        if opts.name is None and (opts.run is None or opts.seq is None):
            raise BadInput("rewind: give RUN and SEQ, or --name NAME")
        done = await agent.rewind(opts.run, opts.seq, name=opts.name)
        return [done.line(opts.run, opts.seq) if opts.name is None else
                f"rewound to checkpoint {opts.name} ({done.checkpoint}): {done.changed} paths restored"]


def main(opts: argparse.Namespace, env: Mapping[str, str], overrides: dict) -> int:
    import asyncio  # here, not at the top: the CLI's parser (and so `guilds mcp`'s first answer) imports this module

    for line in asyncio.run(_act(opts, env, overrides)):
        print(line)
    return 0

