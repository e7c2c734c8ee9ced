"""The ``kubernetes`` backend: one pod per agent, through the official Kubernetes client.

What the cluster holds per agent: ``kube_spec``; the edge with the cluster:
``kube_cluster``. The cluster is the one the kubeconfig names (KUBECONFIG,
else ~/.kube/config), else the one this process runs in, read when the first
call needs it.

Lifecycle:

- found again by name: a running pod whose fingerprint annotation matches is
  used as it is; one with another fingerprint is deleted and made anew. The
  fingerprint is an HMAC-SHA-256 over the pod, the secrets and the helpers'
  build, keyed with the data folder's ``kubernetes/fingerprint.key``
  (``kube_host``), which never goes into the cluster: whoever reads pods cannot
  test guesses of a secret against it. An orchestrator of another data folder
  has another key, so it makes the agent's pod anew;
- created on first use: the network policy (once per namespace), the claim
  (if missing), the Secret (always replaced: the secrets may have changed),
  then the pod; once it runs, repos.json goes in as a tar over exec, and the
  image's helpers are checked to be this orchestrator's build (the pod runs as
  the agent's uid, which cannot write /usr/local/bin: rebuild the image with
  ``guilds sandbox image`` when they differ);
- made by many orchestrator processes at once: a pod create refused with 409
  means another process made it, which is then waited for until it runs;
- a pod found ended by its idle stop is replaced silently; one found killed,
  out of memory or evicted fails that call with SandboxError saying so and is
  deleted, the next call makes a new one. The claim keeps the home and the
  state root, so background commands of the old pod show ``ended``;
- exec: pods/exec over its websocket, the call wrapped as in docker
  (``_container.exec_argv``: timeout inside, processes found again by token);
- stop: the pod is deleted; the claim and the Secret are kept (``remove()``
  deletes them too);
- agent.network a list: ``kube_egress`` (the egress proxy on this host, the
  pod's own NetworkPolicy to it, the relay's file and the trust bundle written
  once the pod runs, and the policy checked to hold before the first call).

Doctor's line, the pods ``guilds sandbox list`` shows and what ``rm`` deletes:
``kube_admin``.

What this mode and the claim mode share (the calls, the files written, the
helpers' check): ``kube_pod``. The claim mode (warm pools of
kubernetes-sigs/agent-sandbox): ``kube_claims``; ``guilds.sandbox.BACKENDS``
picks one class or the other by ``[kubernetes] mode``.
"""

from __future__ import annotations

import os
from typing import Any

from ...config.settings import AgentSettings
from ...errors import SandboxError
from .._container import blocking, helpers_digest, repos_file, repos_json
from ..base import Box, Check
from ..egress_side import Egress
from ..process_channel import DirectProcess, KubeProcess
from . import kube_admin as admin
from . import kube_cluster as cluster
from . import kube_direct, kube_host
from . import kube_spec as spec
from .kube_egress import KubeEgress, PodSide, route_source
from .kube_pod import KubePodSandbox
from .kube_user import with_user


class KubernetesSandbox(KubePodSandbox):
    """``[kubernetes] mode = "pod"``: the agent's own pod, made on first use."""

    network_list_held = ("on kubernetes only where the cluster enforces NetworkPolicy (each new pod is "
                         "checked before its first call and refused if not)")

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *,
                 idle_seconds: float | None = None, api_client: Any = None):
        """data_dir: the data folder: the fingerprint's key (``kube_host``), and the egress
        proxy's files when agent.network is a list; api_client: a
        ``kubernetes.client.ApiClient`` (default: from the kubeconfig)."""
        super().__init__(settings, idle_seconds=idle_seconds, api_client=api_client)
        self.data_dir = data_dir
        self.egress = self._egress_of(data_dir)
        """agent.network a list: the sandbox's side of the egress proxy, the pod's included
        (None otherwise)."""
        if self.egress is not None:
            self._base_env.update(self.egress.env())
        self._channel_policy_for: str | None = None
        """``channel = "direct"``: the pod uid whose ingress policy this process made."""

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> KubernetesSandbox:
        return cls(settings, data_dir, idle_seconds=idle_seconds)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        return admin.check(settings, needed=needed)

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        """The pods so labelled in ``kubernetes.namespace``, asked only when chosen."""
        return admin.boxes(settings) if chosen else []

    async def remove(self) -> list[str]:
        """Stop (the pod deleted), then delete its home claim and its Secret."""
        await self.stop()
        return await blocking(lambda: list(admin.remove_kept(self.core, self.pod, self.config.namespace)))

    def _egress_of(self, data_dir: str | os.PathLike | None) -> KubeEgress | None:
        folder = Egress.data_folder(self.settings, data_dir, self.name)
        if folder is None:
            return None
        side = PodSide(lock=self._lock, ready=lambda: self._ready, apply_policy=self._apply_policy,
                       put=lambda files: self._put(files, making=True), run=self._run_quietly)
        return KubeEgress(self.settings, folder, pod=self.pod, idle_seconds=self.idle_seconds, side=side)

    # --- blocking steps ---------------------------------------------------------
    def _start(self) -> None:
        if not self._ensure():
            self._put(self._repos_files())

    def _repos_files(self) -> list[tuple[str, bytes, int]]:
        entries = None if self.egress is None else self.egress.repos_entries()
        return [(repos_file(self.agent_id), repos_json(self.settings, self.home, entries), 0o600)]

    def _stop(self) -> list[str]:
        with self._lock:
            self._ready = False
            self._delete_pod()
            if self.egress is not None:
                self.egress.stop()
        return []

    # --- finding and creating the pod -------------------------------------------
    def _ensure(self) -> bool:
        """Find the running pod or make it; True when it was made now."""
        if self._ready:
            return False
        with self._lock:
            manifest = self._manifest()
            pod = self._read_pod()
            if pod is not None:
                phase, detail = spec.pod_phase(pod)
                same = (pod["metadata"].get("annotations") or {}).get(spec.ANNOTATION_FINGERPRINT) \
                    == manifest["metadata"]["annotations"][spec.ANNOTATION_FINGERPRINT]
                if same and phase in ("running", "pending"):
                    self._wait_running()
                    self._egress_for_pod()
                    self._ready = True
                    return False
                self._delete_pod()
                if phase == "ended":
                    raise SandboxError(self._ended_text(detail))
            self._create(manifest)
            self._ready = True
            return True

    def _manifest(self) -> dict[str, Any]:
        """The pod, its fingerprint (keyed) covering the pod, the secrets and the helpers' build."""
        pod = spec.pod_manifest(self.config, agent_id=self.agent_id, home=self.home,
                                network=self.settings.network, idle_seconds=self.idle_seconds,
                                base_env=self._base_env, fingerprint="")
        pod["spec"] = with_user(pod["spec"], self.settings.user)
        if self.egress is not None:
            pod["spec"]["containers"][0]["command"] = self.egress.init_command()
        stamp = spec.keyed_fingerprint(kube_host.fingerprint_key(self.data_dir),
                                       [pod, dict(self.settings.secrets), helpers_digest()])
        pod["metadata"]["annotations"][spec.ANNOTATION_FINGERPRINT] = stamp
        return pod

    # --- channel = "direct" (``kube_direct``) ----------------------------------------
    def _open_process(self, argv: list[str]) -> KubeProcess | DirectProcess:
        if self.config.channel != "direct" or not kube_direct.serves(argv):
            return super()._open_process(argv)
        process = super()._open_process(kube_direct.offering(argv))
        if not isinstance(process, KubeProcess):
            return process
        try:
            pod_ip = self._direct_address()
            return kube_direct.taken(process, pod_ip) or process
        except BaseException:
            process.close()
            raise

    def _direct_address(self) -> str:
        """The pod's IP, its ingress policy made once per pod by this process."""
        uid, pod_ip = self._pod_address()
        if uid and uid != self._channel_policy_for:
            self._apply_policy(kube_direct.ingress_manifest(self.config.namespace, self.pod, route_source(pod_ip),
                                                            owner=uid), "channel network policy")
            self._channel_policy_for = uid
        return pod_ip

    def _delete_pod(self) -> None:
        with self._api("delete the pod"), cluster.ignoring(404):
            self.core.delete_namespaced_pod(self.pod, self.config.namespace, grace_period_seconds=0)

    def _pod_ended(self) -> None:
        self._delete_pod()

    def _create(self, manifest: dict[str, Any]) -> None:
        cfg, ns, core = self.config, self.config.namespace, self.core
        from kubernetes import client

        self._create_once("network policy", lambda: client.NetworkingV1Api(core.api_client)
                          .create_namespaced_network_policy(ns, spec.network_policy_manifest(ns)))
        self._create_once("volume claim", lambda: core.create_namespaced_persistent_volume_claim(
            ns, spec.claim_manifest(cfg, self.pod)))
        secrets_in_pod = self.settings.secrets if self.egress is None else self.egress.pod_secrets()
        secret = spec.secret_manifest(cfg, self.pod, secrets_in_pod)
        with self._api("write the secret"):
            try:
                core.create_namespaced_secret(ns, secret)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                core.replace_namespaced_secret(secret["metadata"]["name"], ns, secret)
        with self._api("create the pod"):
            try:
                core.create_namespaced_pod(ns, manifest)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
                self._wait_running()  # another orchestrator process made it: it sets it up
                self._egress_for_pod()
                return
        self._wait_running()
        if self.config.channel == "direct":  # made now, so that it holds by the channel's opening
            self._direct_address()
        self._check_helpers()
        self._put(self._repos_files(), making=True)
        self._egress_for_pod()
