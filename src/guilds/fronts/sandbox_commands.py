"""`guilds sandbox list | stop [AGENT] | rm [AGENT]`: the agents' sandboxes, ended or removed.

    list   every guilds sandbox this machine knows of, one line each: the backend, the
           agent, what it is (a bwrap process, a container, a pod) and its state.
           bwrap: the data folder's records; docker: the containers labelled
           ``guilds.agent`` at DOCKER_HOST (when an engine answers there); kubernetes:
           the pods so labelled in ``kubernetes.namespace`` (when the agent's sandbox
           is kubernetes).
    stop   the agent's sandbox ends now, as its idle stop would end it; its files stay
           (the next call starts it again). AGENT: another agent id of the same settings.
    rm     stop, then remove the sandbox's state: bwrap, the agent's files under the
           data folder (its state root went with the sandbox); local, the agent's state
           folder under the data folder; docker, the container and its state volume;
           kubernetes, the pod, its home claim and its secret. The agent's home on
           this machine stays; and for each, the egress proxy's files (agent.network a
           list). Nothing is asked; every removed thing is named.

Exit status: 0 done (also when there was nothing to stop or remove), 1 when a
backend failed (its error printed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence

from ..sandbox import Box, backends, get_sandbox, remove_egress_files
from .wiring import Wired, apply_overrides, resolve, settings_options


def list_boxes(wired: Wired) -> list[Box]:
    """Every backend's sandboxes, in ``guilds.sandbox.BACKENDS``' order."""
    settings = wired.settings
    return [box for name, kind in backends(settings)
            for box in kind.boxes(settings, wired.data_dir, chosen=name == settings.sandbox)]


async def stop_box(wired: Wired, *, remove: bool) -> list[str]:
    """Stop the agent's sandbox (rm: and remove its state); what was stopped or removed."""
    sandbox = get_sandbox(wired.settings, wired.data_dir)
    gone = await (sandbox.remove() if remove else sandbox.stop())
    done = [f"stopped the {sandbox.name} sandbox of agent {wired.settings.id}"]
    if remove:
        gone += remove_egress_files(wired.data_dir, wired.settings.id)
    return done + [f"removed {thing}" for thing in gone]


def _parser(action: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"guilds sandbox {action}")
    if action != "list":
        parser.add_argument("agent", nargs="?", help="the agent id (default: the settings' agent.id)")
    settings_options(parser)
    return parser


def _wired(opts: argparse.Namespace, env: Mapping[str, str]) -> Wired:
    wired = resolve(opts.config, env=env, overrides={"sandbox": opts.sandbox} if opts.sandbox else None)
    agent = getattr(opts, "agent", None)
    if not agent:
        return wired
    settings = apply_overrides(wired.settings, {"id": agent})
    return Wired(settings, wired.data_dir, wired.env, wired.coding, wired.settings_file)


def main(action: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The `guilds sandbox` actions but `image`; a GuildsError goes to the CLI, which prints it."""
    opts = _parser(action).parse_args(list(argv))
    wired = _wired(opts, env)
    if action == "list":
        boxes = list_boxes(wired)
        for box in boxes:
            print(box.line())
        if not boxes:
            print("no sandboxes")
        return 0
    for line in asyncio.run(stop_box(wired, remove=action == "rm")):
        print(line)
    return 0
