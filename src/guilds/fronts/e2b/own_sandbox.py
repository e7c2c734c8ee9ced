"""A guilds sandbox of an E2B sandbox's own: made when it asks for less network than the
agent has (``network_options.asked``), on bwrap and docker alone.

The agent's sandboxes share one network namespace, so one command cannot be kept
off a host another reaches: a narrower network needs a sandbox of its own. It is
the agent's sandbox with another id (``<agent id>-e2b-<the sandbox id's last 8>``,
short: the proxy's socket path is bounded), so its own bwrap init or container,
egress proxy and files; another ``agent.network``; and a home of its own,
``<agent's home>.e2b/<that id>`` (a home shared with a wider network would let a
command plant what a command there runs later, a login profile, and so leave
the narrower one). The same uid, limits, secrets and repository settings. With no
network at all, the values the proxy would have put in (host-bound secrets,
repository tokens) are left out: nothing inside could use them. Its repositories'
token hosts are the agent's, as first read (``egress_side.pinned_origins``): a
.git/config the agent rewrote never moves a token. It is stopped and its files
and home removed when the E2B sandbox is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
from pathlib import Path

from ...config.settings import AgentSettings
from ...sandbox import get_sandbox, pin_own_origins, remove_egress_files
from ...sandbox.base import Sandbox
from .connect import ConnectError
from .network_options import Entries, same_as_agent


def sandbox_for(agent: Sandbox, settings: AgentSettings, entries: Entries, data_dir: str | None,
                box_id: str) -> Sandbox:
    """The agent's sandbox when entries is its own network, else one of the box's own (not started);
    ``invalid_argument`` where the agent's sandbox cannot confine a network."""
    if entries is not None and not agent.isolates:
        raise ConnectError("invalid_argument", f"network: the {agent.name} sandbox confines no network (its "
                                               "commands have the host's); serve the agent on bwrap or docker")
    if entries is None or same_as_agent(entries, settings):
        return agent
    if not agent.own_networks or data_dir is None:
        raise ConnectError("invalid_argument", f"network: the {agent.name} sandbox serves only the agent's own "
                                               f"network; narrower networks are served on bwrap and docker")
    own = own_settings(settings, agent, entries, box_id)
    pin_own_origins(getattr(agent, "egress", None), settings, own, data_dir)
    return get_sandbox(own, data_dir)


def own_settings(settings: AgentSettings, agent: Sandbox, entries: tuple[str, ...], box_id: str) -> AgentSettings:
    uid = getattr(agent, "uid", None)
    bwrap = dataclasses.replace(settings.bwrap, uid=uid) if isinstance(uid, int) and os.geteuid() == 0 else \
        settings.bwrap
    own_id = f"{settings.id}-e2b-{box_id[-8:]}"
    own = dataclasses.replace(settings, id=own_id, home=own_home(settings.home, own_id), sandbox=agent.name,
                              network=False, egress=entries, bwrap=bwrap)
    if entries:
        return own
    return dataclasses.replace(
        own, secrets={k: v for k, v in settings.secrets.items() if k not in settings.secret_hosts},
        secret_hosts={}, egress_resolve={},
        repos=tuple(dataclasses.replace(r, token="", token_hosts=None) for r in settings.repos))


def own_home(agent_home: Path, own_id: str) -> Path:
    """The home of an own sandbox: beside the agent's, never inside it."""
    return agent_home.with_name(agent_home.name + ".e2b") / own_id


async def remove(sandbox: Sandbox, data_dir: str) -> None:
    """Stop an own sandbox and remove its state, its egress folder and its home."""
    await sandbox.remove()
    settings: AgentSettings = sandbox.settings  # type: ignore[attr-defined]  # bwrap's and docker's

    def remove_files() -> None:
        remove_egress_files(data_dir, settings.id)
        shutil.rmtree(settings.home, ignore_errors=True)
        with contextlib.suppress(OSError):  # the folder of own homes, once none is left
            settings.home.parent.rmdir()

    await asyncio.to_thread(remove_files)
