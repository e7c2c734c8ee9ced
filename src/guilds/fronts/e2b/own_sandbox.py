"""A guilds sandbox of an E2B sandbox's own: made when it asks for less network than the
agent has (``egress.asked``), on bwrap and docker alone.

The agent's sandboxes share one network namespace, so one command cannot be kept
off a host another reaches: a narrower network needs a sandbox of its own. It is
the agent's sandbox with another id (``<agent id>-e2b-<the sandbox id's last 8>``, short:
the proxy's socket path is bounded; its own
bwrap init or container, its own egress proxy and files) and another
``agent.network``; the same home, uid, limits, secrets and repositories. With no
network at all, the values the proxy would have put in (host-bound secrets,
repository tokens) are left out: nothing inside could use them. Its repositories'
token hosts are the agent's, as first read (``egress_side.pinned_origins``): a
.git/config the agent rewrote never moves a token. It is stopped and its files
removed when the E2B sandbox is killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from pathlib import Path

from ...config.settings import AgentSettings
from ...sandbox import get_sandbox
from ...sandbox.base import Sandbox
from ...sandbox.egress_side import ORIGINS_NAME, EgressFiles, egress_files, pinned_origins, prepare
from ..sandbox_commands import removed_files
from .connect import ConnectError
from .egress import Entries, same_as_agent

CONFINING = ("bwrap", "docker")
"""The sandboxes that give an E2B sandbox a network of its own."""


def sandbox_for(agent: Sandbox, settings: AgentSettings, entries: Entries, data_dir: str | None,
                box_id: str) -> Sandbox:
    """The agent's sandbox when entries is its own network, else one of the box's own (not started);
    ``invalid_argument`` where the agent's sandbox cannot confine a network."""
    if entries is not None and agent.name == "local":
        raise ConnectError("invalid_argument", "network: the local sandbox confines no network (its commands "
                                               "have the host's); serve the agent on bwrap or docker")
    if entries is None or same_as_agent(entries, settings):
        return agent
    if agent.name not in CONFINING or data_dir is None:
        raise ConnectError("invalid_argument", f"network: the {agent.name} sandbox serves only the agent's own "
                                               f"network; narrower networks are served on bwrap and docker")
    own = own_settings(settings, agent, entries, box_id)
    _pin_origins(getattr(agent, "egress", None), settings, own, data_dir)
    return get_sandbox(own, data_dir)


def own_settings(settings: AgentSettings, agent: Sandbox, entries: tuple[str, ...], box_id: str) -> AgentSettings:
    uid = getattr(agent, "uid", None)
    bwrap = dataclasses.replace(settings.bwrap, uid=uid) if isinstance(uid, int) and os.geteuid() == 0 else \
        settings.bwrap
    own = dataclasses.replace(settings, id=f"{settings.id}-e2b-{box_id[-8:]}", sandbox=agent.name, network=False,
                              egress=entries, bwrap=bwrap)
    if entries:
        return own
    return dataclasses.replace(
        own, secrets={k: v for k, v in settings.secrets.items() if k not in settings.secret_hosts},
        secret_hosts={}, egress_resolve={},
        repos=tuple(dataclasses.replace(r, token="", token_hosts=None) for r in settings.repos))


def _pin_origins(agent_files: EgressFiles | None, settings: AgentSettings, own: AgentSettings,
                 data_dir: str) -> None:
    """The own sandbox's origins.json: the agent's (pinned now if it was not yet)."""
    if agent_files is None or not own.egress or not any(r.token and r.token_hosts is None for r in own.repos):
        return
    pinned_origins(agent_files, settings, str(settings.home))
    files = egress_files(os.path.realpath(data_dir), own.id)
    prepare(files)
    data = Path(agent_files.path(ORIGINS_NAME)).read_bytes()
    fd = os.open(files.path(ORIGINS_NAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


async def remove(sandbox: Sandbox, data_dir: str) -> None:
    """Stop an own sandbox and remove its files (its egress folder, bwrap's record)."""
    await sandbox.stop()
    settings: AgentSettings = sandbox.settings  # type: ignore[attr-defined]  # bwrap's and docker's

    def remove_files() -> None:
        list(removed_files(Path(data_dir), settings, sandbox.name))
        shutil.rmtree(egress_files(os.path.realpath(data_dir), settings.id).folder, ignore_errors=True)

    await asyncio.to_thread(remove_files)
