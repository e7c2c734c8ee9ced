"""Sandbox backends, chosen by the short name in ``agent.sandbox``.

    local       a folder on this machine; isolates nothing       (local.py)
    bwrap       one long-lived bubblewrap sandbox per agent      (bwrap/bwrap_sandbox.py)
    auto        bwrap where it works here, else local with a one-line warning
    docker      one container per agent, Docker SDK              (docker/docker_sandbox.py)
    kubernetes  one pod per agent, the Kubernetes client         (kubernetes/kube_backend.py)
                or a claim from a warm pool of agent-sandbox     (kubernetes/kube_claims.py)

BACKENDS is the one table of them: a front picks a backend there (``backend``,
``backends``, ``picked``) and asks its class (``base.Backend``: doctor's lines,
the sandboxes it knows of) or the agent's sandbox (``get_sandbox``; the seam
they implement: ``base.Sandbox``). Backends are imported only when asked for.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config.egress import NO_LIST_SANDBOXES, list_refused
from ..config.settings import SANDBOXES, AgentSettings
from ..errors import ConfigError, SandboxError
from .base import Backend, Box, Check, ExecResult, Sandbox

if TYPE_CHECKING:
    from .egress_side import EgressFiles

__all__ = ["BACKENDS", "Backend", "Box", "Check", "ExecResult", "Sandbox", "backend", "backends", "candidates",
           "get_sandbox", "picked", "pin_own_origins", "remove_egress_files"]

log = logging.getLogger(__name__)

BACKENDS = {
    "bwrap": "bwrap.bwrap_sandbox:BwrapSandbox",
    "local": "local:LocalSandbox",
    "docker": "docker.docker_sandbox:DockerSandbox",
    "kubernetes": "kubernetes.kube_backend:KubernetesBackend",
}
"""Each backend's class ("module:class" in this package), in the order doctor's lines
and ``guilds sandbox list`` show them."""
AUTO = "auto"
AUTO_PICKS = ("bwrap", "local")
"""What ``auto`` picks: the first that works here (the last works anywhere)."""


def backend(name: str) -> type[Backend]:
    """The class of the backend named name (a key of BACKENDS)."""
    module, cls = BACKENDS[name].split(":")
    found: type[Backend] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def backends() -> list[tuple[str, type[Backend]]]:
    """(name, class) of every backend, in BACKENDS' order."""
    return [(name, backend(name)) for name in BACKENDS]


def candidates(setting: str) -> list[type[Backend]]:
    """The backends ``agent.sandbox = setting`` may pick, in the order it tries them."""
    return [backend(name) for name in (AUTO_PICKS if setting == AUTO else (setting,))]


def picked(setting: str, works: Callable[[str], bool]) -> type[Backend]:
    """The backend ``agent.sandbox = setting`` picks, where works(name) says whether a
    backend works here (only asked of ``auto``'s picks but the last)."""
    tried = candidates(setting)
    return next((kind for kind in tried[:-1] if works(kind.name)), tried[-1])


def get_sandbox(
    settings: AgentSettings, data_dir: str | os.PathLike, *, idle_seconds: float | None = None
) -> Sandbox:
    """The sandbox named by settings.sandbox, for that agent, keeping its files under data_dir.

    idle_seconds: the idle stop (default: guilds.limits.BWRAP_IDLE_SECONDS_DEFAULT, the
    settings' ``idle_minutes`` for docker and kubernetes; these keep no files
    under data_dir). Raises ConfigError for a name it does not know or an allowlist
    (``settings.egress``) on a sandbox that cannot enforce it, and SandboxError when
    ``bwrap`` is asked for where it does not work (or ``auto`` would fall back to
    ``local`` with an allowlist).
    """
    name = settings.sandbox
    if name not in SANDBOXES:
        raise ConfigError(f"agent.sandbox: unknown sandbox {name!r} (known: {', '.join(SANDBOXES)})")
    if settings.egress and name in NO_LIST_SANDBOXES:  # settings made in code, past the loader's check
        raise ConfigError(list_refused(name))
    kind = picked(name, lambda _: _bwrap_works(settings))
    return kind.for_agent(settings, data_dir, idle_seconds=idle_seconds)


def _bwrap_works(settings: AgentSettings) -> bool:
    """``auto``: does bubblewrap work here? When not, say so, or refuse an allowlist."""
    from .bwrap.bwrap_argv import unavailable

    reason = unavailable()
    if reason is None:
        return True
    if settings.egress:
        raise SandboxError(f"{list_refused('local')} (agent.sandbox = 'auto': bubblewrap does not "
                           f"work here: {reason})")
    log.warning("sandbox: bubblewrap does not work here (%s); using local, which isolates "
                "nothing: commands run as this user, with all its files and the network", reason)
    return False


def remove_egress_files(data_dir: str | os.PathLike, agent_id: str) -> list[str]:
    """The egress proxy's files of the agent (agent.network a list), removed once its
    sandbox is stopped, whichever backend it ran on; the folder's path when it was there."""
    from .egress_process import remove_files
    from .egress_side import egress_files

    return remove_files(egress_files(str(data_dir), agent_id))


def pin_own_origins(agent_files: EgressFiles | None, settings: AgentSettings, own: AgentSettings,
                    data_dir: str) -> None:
    """The agent's pinned origins given to a sandbox beside it with an allowlist of its own."""
    from .egress_side import pin_own_origins as pin

    pin(agent_files, settings, own, data_dir)
