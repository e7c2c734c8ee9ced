"""Sandbox backends, chosen by the short name in ``agent.sandbox``.

    local       a folder on this machine; isolates nothing       (local.py)
    bwrap       one long-lived bubblewrap sandbox per agent      (bwrap/bwrap_sandbox.py)
    auto        bwrap where it works here, else local with a one-line warning
    docker      one container per agent, Docker SDK              (docker/docker_sandbox.py)
    kubernetes  [kubernetes] mode = "pod": one pod per agent,    (kubernetes/kube_sandbox.py)
                the Kubernetes client; "claim": a claim from a
                warm pool of agent-sandbox                       (kubernetes/kube_claims.py)

BACKENDS is the one table of them: a front picks a backend there (``backend``,
``backends``, ``picked``) and asks its class (``base.Backend``: doctor's lines,
the sandboxes it knows of) or the agent's sandbox (``get_sandbox``; the seam
they implement: ``base.Sandbox``). A backend of more than one mode has a class
per mode, picked by its settings' ``mode`` (``[kubernetes] mode``). Backends are
imported only when asked for.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from collections.abc import Callable, Mapping

from ..config.egress import NO_LIST_SANDBOXES, list_refused
from ..config.settings import SANDBOXES, AgentSettings
from ..errors import ConfigError, SandboxError
from .base import Backend, Box, Check, ExecResult, Sandbox

__all__ = ["BACKENDS", "Backend", "Box", "Check", "ExecResult", "Sandbox", "backend", "backend_of", "backends",
           "candidates", "checkpoints_refusal", "get_sandbox", "mode_of", "picked", "refuse_unkept_checkpoints",
           "remove_egress_files"]

log = logging.getLogger(__name__)

BACKENDS: dict[str, str | Mapping[str, str]] = {
    "bwrap": "bwrap.bwrap_sandbox:BwrapSandbox",
    "local": "local:LocalSandbox",
    "docker": "docker.docker_sandbox:DockerSandbox",
    "kubernetes": {"pod": "kubernetes.kube_sandbox:KubernetesSandbox",
                   "claim": "kubernetes.kube_claims:KubeClaimSandbox"},
}
"""Each backend's class ("module:class" in this package), in the order doctor's lines
and ``guilds sandbox list`` show them; for a backend of modes, each mode's class by
the value of the settings' ``[name] mode``, the first the default."""
AUTO = "auto"
AUTO_PICKS = ("bwrap", "local")
"""What ``auto`` picks: the first that works here (the last works anywhere)."""


def backend(name: str, settings: AgentSettings | None = None) -> type[Backend]:
    """The class of the backend named name (a key of BACKENDS); of a backend of modes,
    the class of the mode settings give (without settings, of the default mode)."""
    entry = BACKENDS[name]
    if not isinstance(entry, str):
        entry = entry.get(mode_of(name, settings), next(iter(entry.values())))
    module, cls = entry.split(":")
    found: type[Backend] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def mode_of(name: str, settings: AgentSettings | None) -> str:
    """The ``mode`` of the settings' table of that backend (``[kubernetes] mode``), "" for none."""
    table = getattr(settings, name, None) if settings is not None else None
    return str(getattr(table, "mode", ""))


def backends(settings: AgentSettings | None = None) -> list[tuple[str, type[Backend]]]:
    """(name, class) of every backend, in BACKENDS' order (each mode's as settings give it)."""
    return [(name, backend(name, settings)) for name in BACKENDS]


def candidates(setting: str, settings: AgentSettings | None = None) -> list[type[Backend]]:
    """The backends ``agent.sandbox = setting`` may pick, in the order it tries them."""
    return [backend(name, settings) for name in (AUTO_PICKS if setting == AUTO else (setting,))]


def picked(setting: str, works: Callable[[str], bool], settings: AgentSettings | None = None) -> type[Backend]:
    """The backend ``agent.sandbox = setting`` picks, where works(name) says whether a
    backend works here (only asked of ``auto``'s picks but the last)."""
    tried = candidates(setting, settings)
    return next((kind for kind in tried[:-1] if works(kind.name)), tried[-1])


def get_sandbox(
    settings: AgentSettings, data_dir: str | os.PathLike, *, idle_seconds: float | None = None
) -> Sandbox:
    """The sandbox named by settings.sandbox, for that agent, keeping its files under data_dir.

    idle_seconds: the idle stop (default: guilds.limits.BWRAP_IDLE_SECONDS_DEFAULT, the
    settings' ``idle_minutes`` for docker and kubernetes; docker keeps no files
    under data_dir, kubernetes its fingerprint key and claim notes, ``kube_host``).
    Raises ConfigError for a name it does not know or an allowlist (``settings.egress``)
    on a sandbox that cannot enforce it, and SandboxError when ``bwrap`` is asked for
    where it does not work (or ``auto`` would fall back to ``local`` with an allowlist).
    """
    name = settings.sandbox
    if name not in SANDBOXES:
        raise ConfigError(f"agent.sandbox: unknown sandbox {name!r} (known: {', '.join(SANDBOXES)})")
    if settings.egress and name in NO_LIST_SANDBOXES:  # settings made in code, past the loader's check
        raise ConfigError(list_refused(name))
    return backend_of(settings).for_agent(settings, data_dir, idle_seconds=idle_seconds)


def checkpoints_refusal(settings: AgentSettings, key: str = "agent.checkpoints") -> str | None:
    """The one-line refusal of the agent's checkpoints on its backend, naming why (on
    kubernetes, what the cluster lacks, asked of it: blocking); None where they are kept."""
    if settings.sandbox == AUTO:  # bwrap or local: a folder on this machine either way
        return None
    why = backend(settings.sandbox, settings).checkpoints_refused(settings)
    return None if why is None else f"{key}: not served on {settings.sandbox} here: {why}"


async def refuse_unkept_checkpoints(settings: AgentSettings) -> None:
    """ConfigError naming why, when the settings ask for a checkpoint per call on a backend
    that keeps none; asked when the agent starts."""
    if settings.checkpoints and (line := await asyncio.to_thread(checkpoints_refusal, settings)):
        raise ConfigError(line)


def backend_of(settings: AgentSettings) -> type[Backend]:
    """The backend the agent's sandbox is made on (``auto``: the one it picks here)."""
    return picked(settings.sandbox, lambda _: _bwrap_works(settings), settings)


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
    from .egress_side import egress_files, remove_files

    return remove_files(egress_files(str(data_dir), agent_id))


def inherit_egress_origins(data_dir: str | os.PathLike, source_id: str, child_id: str) -> None:
    """A fork's child keeps its source's pinned repository origins (``egress_side.origins``);
    call it before the child's sandbox starts."""
    from .egress_side import egress_files
    from .egress_side.origins import inherit_origins

    root = os.path.realpath(data_dir)
    inherit_origins(egress_files(root, source_id), egress_files(root, child_id))
