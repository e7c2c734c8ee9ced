"""Sandbox backends, chosen by the short name in ``agent.sandbox``.

    local       a folder on this machine; isolates nothing       (local.py)
    bwrap       one long-lived bubblewrap sandbox per agent      (bubblewrap.py)
    auto        bwrap where it works here, else local with a one-line warning
    docker      one container per agent, Docker SDK              (docker.py)
    kubernetes  one pod per agent, the Kubernetes client         (kubernetes.py)

Backends are imported only when chosen. The seam they implement: ``base.Sandbox``.
"""

from __future__ import annotations

import logging
import os

from ..config.egress import NO_LIST_SANDBOXES, list_refused
from ..config.settings import SANDBOXES, AgentSettings
from ..errors import ConfigError, SandboxError
from .base import ExecResult, Sandbox

__all__ = ["ExecResult", "Sandbox", "get_sandbox"]

log = logging.getLogger(__name__)


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
    if name == "docker":
        from .docker import DockerSandbox

        return DockerSandbox(settings, idle_seconds=idle_seconds, data_dir=data_dir)
    if name == "kubernetes":
        from .kubernetes import KubernetesSandbox

        return KubernetesSandbox(settings, idle_seconds=idle_seconds)
    if name != "local":
        from .bwrap_argv import unavailable

        reason = unavailable()
        if reason is None:
            return _bwrap(settings, data_dir, idle_seconds)
        if name == "bwrap":
            raise SandboxError(f"agent.sandbox = 'bwrap': bubblewrap does not work here: {reason}")
        if settings.egress:
            raise SandboxError(f"{list_refused('local')} (agent.sandbox = 'auto': bubblewrap does not "
                               f"work here: {reason})")
        log.warning("sandbox: bubblewrap does not work here (%s); using local, which isolates "
                    "nothing: commands run as this user, with all its files and the network", reason)
    from .local import LocalSandbox

    return LocalSandbox(settings, data_dir)


def _bwrap(settings: AgentSettings, data_dir: str | os.PathLike, idle_seconds: float | None) -> Sandbox:
    from .bubblewrap import BwrapSandbox

    if idle_seconds is None:
        return BwrapSandbox(settings, data_dir)
    return BwrapSandbox(settings, data_dir, idle_seconds=idle_seconds)
