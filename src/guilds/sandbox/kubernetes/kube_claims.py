"""The kubernetes backend's claim mode: an agent's sandbox claimed from a warm pool of
kubernetes-sigs/agent-sandbox (``[kubernetes] mode = "claim"``; its objects:
``kube_claim_spec``).

Lifecycle (calls go over pods/exec to the claimed pod, as in pod mode):

- first use in a process: the template and the warm pool are made when missing
  (the pool's size set to ``warm`` when it differs);
- the agent's claim is found again by name, or made; a claim of another pool
  (the settings changed) is deleted and made anew. The call waits, on a watch
  of the claim, until it holds a ready sandbox, then reads that sandbox's pod;
- on the claimed pod: the image's helpers are checked (a claim made now, once per
  template in a process: its pods run one image), then
  one tar over exec writes the secrets file (0600, ``secrets_file``) and
  repos.json. Every command, the resident helper too, runs under
  ``loaded_argv``, which loads that file: no secret sits in a claim, a
  template or a sandbox object, nor on a command line;
- stop: the claim is deleted; its sandbox and pod go with it, the pool makes
  another. The home lived on the pod's emptyDir: it goes too;
- ``keep_home``: the agent has a Sandbox of its own with its home on a volume
  claim; stop suspends it (the pod is deleted, the volume kept), the next call
  resumes it, and background commands of before read ``ended`` with their
  logs, which the state root on the volume kept;
- a claimed pod that ended (killed, evicted) fails that call, as in pod mode;
  its claim is deleted and the next call claims another (an own Sandbox is
  suspended and resumed, which makes its pod anew).

A pooled pod has no calls while it waits, so a claimed pod runs INIT without its
idle stop: ``guilds sandbox stop`` (or a claim's lifecycle set by the cluster's
operators) ends it. An own Sandbox's pod keeps the idle stop (``idle_minutes``):
INIT exits, the pod ends, and the next call suspends the Sandbox (the controller
deletes the ended pod) and resumes it, silently, as pod mode replaces an idle pod.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import (
    KUBERNETES_CLAIM_GONE_SECONDS,
    KUBERNETES_CLAIM_POLL_SECONDS,
    KUBERNETES_CLAIM_WATCH_SLICE_SECONDS,
    KUBERNETES_START_SECONDS,
)
from .._container import blocking, helpers_digest, repos_file, repos_json
from . import kube_claim_admin as claim_admin
from . import kube_claim_spec as claims
from . import kube_cluster as cluster
from . import kube_spec as spec
from .kube_sandbox import KubernetesSandbox

WATCH_SLICE_SECONDS = KUBERNETES_CLAIM_WATCH_SLICE_SECONDS
GONE_WAIT_SECONDS = KUBERNETES_CLAIM_GONE_SECONDS
_made_lock = threading.Lock()
_made: set[tuple[str, str, int]] = set()
"""(namespace, template, warm) made or checked by this process: once each."""
_helpers_checked: set[str] = set()
"""The templates whose image's helpers this process found to be its own build."""


class KubeClaimSandbox(KubernetesSandbox):
    """KubernetesSandbox whose pod is a claimed agent-sandbox Sandbox's."""

    def __init__(self, settings: AgentSettings, *, idle_seconds: float | None = None,
                 api_client: Any = None):
        super().__init__(settings, idle_seconds=idle_seconds, api_client=api_client)
        self.claim = spec.object_name(self.agent_id)
        self.keep_home = self.config.keep_home
        self._custom: Any = None

    # --- hooks of KubernetesSandbox ----------------------------------------------------
    def _wrapped(self, command: list[str]) -> list[str]:
        return claims.loaded_argv(self.agent_id, command)

    def _ensure(self) -> bool:
        if self._ready:
            return False
        with self._lock:
            template = self._template()
            made = self._own_sandbox(template) if self.keep_home else self._claimed(template["metadata"]["name"])
            phase, detail = spec.pod_phase(self._read_pod() or {})
            if phase in ("ended", "idle"):
                self._delete_pod()
                raise SandboxError(self._ended_text(detail or "it exited"))
            if phase != "running":
                self._wait_running()
            if made and template["metadata"]["name"] not in _helpers_checked:
                self._check_helpers()  # once per template: every pod of it runs one image
                _helpers_checked.add(template["metadata"]["name"])
            self._put([(claims.secrets_file(self.agent_id), claims.secrets_text(self.settings.secrets), 0o600),
                       (repos_file(self.agent_id), repos_json(self.settings, self.home), 0o600)], making=True)
            self._ready = True
            return True

    def _delete_pod(self) -> None:
        """The pod ended: a claim is given back (the next call claims another); an own
        Sandbox is suspended (the next call resumes it with a new pod)."""
        if self.keep_home:
            self._suspend()
        else:
            self._delete_claim(wait=False)

    async def remove(self) -> list[str]:
        """Stop, then delete the claim, the own Sandbox and its home volume."""
        await self.stop()
        return await blocking(lambda: list(claim_admin.remove(self.core.api_client, self.config.namespace,
                                                                  self.claim)))

    # --- the template and its pool -----------------------------------------------------
    def _template(self) -> dict[str, Any]:
        cfg = self.config
        template = claims.template_manifest(cfg, home=self.home, network=self.settings.network,
                                            base_env=self._base_env, helpers=helpers_digest())
        name = template["metadata"]["name"]
        key = (cfg.namespace, name, cfg.warm)
        with _made_lock:
            if key in _made:
                return template
        self._create_custom(claims.EXTENSIONS, claims.TEMPLATES, template, "sandbox template")
        pool = claims.warm_pool_manifest(template, cfg.warm)
        if not self._create_custom(claims.EXTENSIONS, claims.POOLS, pool, "warm pool"):
            with self._api("read the warm pool"):
                have = self.custom.get_namespaced_custom_object(
                    claims.EXTENSIONS, claims.VERSION, cfg.namespace, claims.POOLS, name)
            if (have.get("spec") or {}).get("replicas") != cfg.warm:
                with self._api("resize the warm pool"):
                    self.custom.patch_namespaced_custom_object(
                        claims.EXTENSIONS, claims.VERSION, cfg.namespace, claims.POOLS, name,
                        {"spec": {"replicas": cfg.warm}})
        with _made_lock:
            _made.add(key)
        return template

    # --- a claim from the pool ---------------------------------------------------------
    def _claimed(self, pool: str) -> bool:
        """Find or make the agent's claim, wait until it holds a ready sandbox and point
        self.pod at that sandbox's pod; True when the claim was made now."""
        claim = self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim)
        if claim is not None and claims.pool_of(claim) != pool:
            self._delete_claim(wait=True)
            claim = None
        made = claim is None
        if made:
            made = self._create_custom(claims.EXTENSIONS, claims.CLAIMS,
                                       claims.claim_manifest(self.config.namespace, self.agent_id, pool), "claim")
        bound = self._wait_bound()
        sandbox = self._read(claims.GROUP, claims.SANDBOXES, bound)
        self.pod = claims.pod_of(sandbox) if sandbox is not None else bound
        return made

    def _wait_bound(self) -> str:
        """The claim's ready sandbox, read first and then watched until it has one."""
        from kubernetes import watch

        deadline = time.monotonic() + KUBERNETES_START_SECONDS
        ns, detail = self.config.namespace, ""
        while time.monotonic() < deadline:
            claim = self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim)
            if claim is None:
                raise SandboxError(f"kubernetes: the claim {self.claim} was deleted while it was awaited")
            if name := claims.bound_sandbox(claim):
                return name
            detail = claims.condition(claim, "Ready")[1] or detail
            seconds = max(1, min(WATCH_SLICE_SECONDS, int(deadline - time.monotonic())))
            stream = watch.Watch()
            with self._api(f"watch the claim {self.claim}"):
                for event in stream.stream(
                        self.custom.list_namespaced_custom_object, claims.EXTENSIONS, claims.VERSION, ns,
                        claims.CLAIMS, field_selector=f"metadata.name={self.claim}",
                        resource_version=claim["metadata"]["resourceVersion"], timeout_seconds=seconds,
                        _request_timeout=seconds + 5):
                    got = event.get("object") or {}
                    if event.get("type") == "DELETED" or claims.bound_sandbox(got):
                        stream.stop()
                        break
                    detail = claims.condition(got, "Ready")[1] or detail
        raise SandboxError(f"kubernetes: the claim {self.claim} held no ready sandbox after "
                           f"{KUBERNETES_START_SECONDS} s ({detail or 'no condition yet'}); is the "
                           "agent-sandbox controller running with --extensions?")

    def _delete_claim(self, *, wait: bool) -> None:
        with self._api("delete the claim"), cluster.ignoring(404):
            self.custom.delete_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, self.config.namespace,
                                                        claims.CLAIMS, self.claim)
        deadline = time.monotonic() + GONE_WAIT_SECONDS
        while wait and self._read(claims.EXTENSIONS, claims.CLAIMS, self.claim) is not None:
            if time.monotonic() > deadline:
                raise SandboxError(f"kubernetes: the claim {self.claim} was not gone after {GONE_WAIT_SECONDS} s")
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)

    # --- an agent's own Sandbox (keep_home) --------------------------------------------
    def _own_sandbox(self, template: dict[str, Any]) -> bool:
        """Make the agent's Sandbox, or resume it when suspended; wait until it is ready."""
        wanted = claims.own_sandbox_manifest(self.config, template, self.agent_id, self.idle_seconds)
        have = self._read(claims.GROUP, claims.SANDBOXES, self.claim)
        if have is not None and have["spec"].get("podTemplate") != wanted["spec"]["podTemplate"]:
            with self._api("update the sandbox"):  # the settings changed: the next pod is the new one
                self.custom.patch_namespaced_custom_object(
                    claims.GROUP, claims.VERSION, self.config.namespace, claims.SANDBOXES, self.claim,
                    {"spec": {"podTemplate": wanted["spec"]["podTemplate"]}})
        made = have is None and self._create_custom(claims.GROUP, claims.SANDBOXES, wanted, "sandbox")
        if have is not None and have["spec"].get("operatingMode") == "Suspended":
            self._set_mode("Running")
        elif have is not None and spec.pod_phase(self._read_pod_named(claims.pod_of(have)))[0] == "idle":
            self._resume_after_idle(claims.pod_of(have))
        deadline = time.monotonic() + KUBERNETES_START_SECONDS
        detail = ""
        while time.monotonic() < deadline:
            sandbox = self._read(claims.GROUP, claims.SANDBOXES, self.claim)
            if sandbox is not None:
                status, detail = claims.condition(sandbox, "Ready")
                if status == "True":
                    self.pod = claims.pod_of(sandbox)
                    return made
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)
        raise SandboxError(f"kubernetes: the sandbox {self.claim} was not ready after "
                           f"{KUBERNETES_START_SECONDS} s ({detail or 'no condition yet'})")

    def _resume_after_idle(self, pod: str) -> None:
        """The idle stop ended the pod (INIT exited 0): suspend the Sandbox, wait until the
        controller has deleted that pod, and resume it (a new pod on the same volume)."""
        self._suspend()
        deadline = time.monotonic() + GONE_WAIT_SECONDS
        while self._read_pod_named(pod):
            if time.monotonic() > deadline:
                raise SandboxError(f"kubernetes: the idle pod {pod} was not gone after {GONE_WAIT_SECONDS} s")
            time.sleep(KUBERNETES_CLAIM_POLL_SECONDS)
        self._set_mode("Running")

    def _read_pod_named(self, pod: str) -> dict[str, Any]:
        with self._api("read the pod"), cluster.ignoring(404):
            found = self.core.read_namespaced_pod(pod, self.config.namespace)
            return dict(self.core.api_client.sanitize_for_serialization(found))
        return {}

    def _suspend(self) -> None:
        self._set_mode("Suspended")

    def _set_mode(self, mode: str) -> None:
        with self._api(f"set the sandbox {self.claim} {mode.lower()}"), cluster.ignoring(404):
            self.custom.patch_namespaced_custom_object(claims.GROUP, claims.VERSION, self.config.namespace,
                                                       claims.SANDBOXES, self.claim, claims.operating_mode(mode))

    # --- the cluster's custom objects --------------------------------------------------
    @property
    def custom(self) -> Any:
        if self._custom is None:
            from kubernetes import client

            self._custom = client.CustomObjectsApi(self.core.api_client)
        return self._custom

    def _read(self, group: str, plural: str, name: str) -> dict[str, Any] | None:
        with self._api(f"read the {plural[:-1]} {name}"), cluster.ignoring(404):
            return dict(self.custom.get_namespaced_custom_object(group, claims.VERSION, self.config.namespace,
                                                                 plural, name))
        return None

    def _create_custom(self, group: str, plural: str, body: dict[str, Any], what: str) -> bool:
        """Create body; False when it was there already (409)."""
        with self._api(f"create the {what}"), cluster.ignoring(409):
            self.custom.create_namespaced_custom_object(group, claims.VERSION, self.config.namespace, plural, body)
            return True
        return False
