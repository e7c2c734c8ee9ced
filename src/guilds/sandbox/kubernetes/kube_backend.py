"""The kubernetes backend as ``guilds.sandbox.BACKENDS`` knows it: ``[kubernetes] mode``
picks a pod made on first use (``kubernetes``) or a claimed agent-sandbox Sandbox
(``kube_claims``); doctor's lines and the listed sandboxes are the pod mode's, and in
claim mode also agent-sandbox's."""

from __future__ import annotations

import os

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ..base import Box, Check
from . import kube_admin as admin
from . import kube_claim_admin
from .kube_claims import KubeClaimSandbox
from .kube_sandbox import KubernetesSandbox

CLAIM = "claim"


class KubernetesBackend(KubernetesSandbox):
    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> KubernetesSandbox:
        if settings.kubernetes.mode == CLAIM:
            if settings.egress:
                raise SandboxError("agent.network: a list of hosts is enforced by kubernetes.mode = \"pod\" "
                                   "only, not \"claim\"; use the pod mode, or true or false")
            return KubeClaimSandbox(settings, idle_seconds=idle_seconds)
        return KubernetesSandbox(settings, idle_seconds=idle_seconds, data_dir=data_dir)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        lines = admin.check(settings, needed=needed)
        if settings.kubernetes.mode == CLAIM and all(line.ok for line in lines):
            lines += kube_claim_admin.check(settings, needed=needed)
        return lines

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        """The pods so labelled in ``kubernetes.namespace`` (claim mode: and the agents'
        claims and own Sandboxes), asked only when chosen."""
        if not chosen:
            return []
        claimed = kube_claim_admin.listed(settings) if settings.kubernetes.mode == CLAIM else []
        return admin.boxes(settings) + claimed
