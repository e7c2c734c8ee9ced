"""The ``kubernetes`` backend: one pod per agent, through the official Kubernetes client.

What the cluster holds per agent: ``kube_spec``; the edge with the cluster:
``kube_cluster``. The cluster is the one the kubeconfig names (KUBECONFIG,
else ~/.kube/config), else the one this process runs in, read when the first
call needs it.

Lifecycle:

- found again by name: a running pod whose fingerprint annotation matches is
  used as it is; one with another fingerprint is deleted and made anew;
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

The claim mode (warm pools of kubernetes-sigs/agent-sandbox): ``kube_claims``; the table's
class, which picks one mode or the other: ``kube_backend``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

from ...errors import SandboxError
from ...limits import (
    KUBERNETES_DEADLINE_SLACK_SECONDS, KUBERNETES_START_POLL_SECONDS, KUBERNETES_START_SECONDS,
    KUBERNETES_STATUS_POLL_SECONDS, KUBERNETES_STATUS_WAIT_SECONDS, KUBERNETES_WRITE_SECONDS,
    KUBERNETES_EGRESS_SETTLE_SECONDS,
)
from ...config.settings import AgentSettings
from . import kube_admin as admin
from . import kube_cluster as cluster
from . import kube_egress
from . import kube_spec as spec
from .kube_egress import KubeEgress
from .._host_folder import DEFAULT_PATH, agent_env, checked_id
from .._container import (
    EXEC_ENV, HELPER_DIR, STATE_INSIDE, blocking, exec_argv, exec_status, fingerprint, helper_files,
    ContainerSandbox,
    helpers_digest, kill_argv, repos_file, repos_json, tar_bytes,
)
from .._spawn import KILL_GRACE_SECONDS
from ..base import Box, Check, ExecResult
from ..process_channel import KubeProcess

T = TypeVar("T")


class KubernetesSandbox(ContainerSandbox):
    name = admin.NAME
    network_list_held = ("on kubernetes only where the cluster enforces NetworkPolicy (each new pod is "
                         "checked before its first call and refused if not)")
    state_dir = STATE_INSIDE
    python = spec.PYTHON

    def __init__(self, settings: AgentSettings, *, idle_seconds: float | None = None,
                 api_client: Any = None, data_dir: str | os.PathLike | None = None):
        """api_client: a ``kubernetes.client.ApiClient`` (default: from the kubeconfig);
        data_dir: where the egress proxy keeps its files (needed when agent.network is a list)."""
        self.settings, self.config = settings, settings.kubernetes
        self.home = str(settings.home)
        self.agent_id = checked_id(settings)
        self.pod = spec.object_name(self.agent_id)
        self.idle_seconds = idle_seconds or self.config.idle_minutes * 60
        env = agent_env(settings, home=self.home, state_dir=STATE_INSIDE, path=DEFAULT_PATH)
        self._base_env = {k: v for k, v in env.items() if k not in settings.secrets}
        self._egress = self._egress_of(data_dir)
        self.egress = None if self._egress is None else self._egress.files
        """agent.network a list: the egress proxy's files (None otherwise)."""
        if self._egress is not None:
            self._base_env.update(self._egress.env())
        self._pod_ip: str | None = None
        """agent.network a list: the pod's address, once its egress is set up."""
        self._egress_pod: str | None = None
        """agent.network a list: the uid of the pod whose egress was set up."""
        self._api_client = api_client
        self._core: Any = None
        self._ready = False
        self._lock = threading.Lock()

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> KubernetesSandbox:
        return cls(settings, idle_seconds=idle_seconds, data_dir=data_dir)

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

    async def open_process(self, argv: Sequence[str]) -> KubeProcess:
        """One pods/exec websocket with stdin; closing it also kills what it started (by token)."""
        return await blocking(self._open_process, list(argv))

    def _open_process(self, argv: list[str]) -> KubeProcess:
        token = secrets.token_hex(8)
        command = self._wrapped(spec.with_env(argv, {EXEC_ENV: token}))
        ws = self._in_pod(lambda: cluster.open_exec(self.core, self.pod, self.config.namespace, command))
        return KubeProcess(ws, stop=lambda: self._kill(token))

    def _egress_of(self, data_dir: str | os.PathLike | None) -> KubeEgress | None:
        if not self.settings.egress:
            return None
        if data_dir is None:
            raise SandboxError("agent.network is a list, and the kubernetes sandbox was given no data folder "
                               "for the egress proxy")
        return KubeEgress(self.settings, data_dir, agent_id=self.agent_id, pod=self.pod,
                          idle_seconds=self.idle_seconds)

    async def keep_egress(self) -> None:
        """Before each call: the egress proxy running (started again when it died), and the
        pod told again where it listens when that changed (no thread hop without a list)."""
        if self._egress is not None:
            await blocking(self._keep_egress)

    # --- blocking steps ---------------------------------------------------------
    def _start(self) -> None:
        if not self._ensure():
            self._put(self._repos_files())

    def _repos_files(self) -> list[tuple[str, bytes, int]]:
        entries = None if self._egress is None else self._egress.repos_entries()
        return [(repos_file(self.agent_id), repos_json(self.settings, self.home, entries), 0o600)]

    def _keep_egress(self) -> None:
        """The pod known running: its proxy kept (a pod not known yet is made, and told,
        by the call)."""
        pod_ip = self._pod_ip
        if self._ready and pod_ip is not None:
            with self._lock:
                self._publish_egress(pod_ip)

    def _egress_for_pod(self) -> None:
        """agent.network a list, the pod found or made running (under the lock): set up
        (``_publish_egress``) once per pod in this process, a pod of another uid anew."""
        if self._egress is None:
            return
        pod = self._read_pod() or {}
        uid, pod_ip = (pod.get("metadata") or {}).get("uid"), (pod.get("status") or {}).get("podIP")
        if not pod_ip:
            raise SandboxError(f"kubernetes: the pod {self.pod} runs without an address")
        if uid != self._egress_pod:
            self._egress.published = None
        self._egress_pod, self._pod_ip = uid, pod_ip
        self._publish_egress(pod_ip)

    def _publish_egress(self, pod_ip: str) -> None:
        """The proxy kept; where it changed (or the pod is not told yet), the pod's policy
        applied, the relay's file and the trust bundle written, and the policy checked to hold."""
        if self._egress is None:
            return
        from kubernetes import client

        address, port = self._egress.keep(pod_ip)
        if self._egress.published == (address, port):
            return
        policy = kube_egress.policy_manifest(self.config.namespace, self.pod, address, port,
                                             owner=self._egress_pod or "")
        self._create_once("egress network policy", lambda: client.NetworkingV1Api(self.core.api_client)
                          .create_namespaced_network_policy(self.config.namespace, policy))
        self._put(self._egress.pod_files(address, port), making=True)
        self._egress.check_held(address, port, self._run_quietly)
        self._egress.published = (address, port)

    def _run_quietly(self, argv: list[str]) -> str:
        """argv's stdout, run in the pod as it is (the backend's own check)."""
        out, err, status, complete = self._exec_stream(
            argv, b"", time.monotonic() + KUBERNETES_EGRESS_SETTLE_SECONDS + KUBERNETES_WRITE_SECONDS)
        code, problem = spec.exit_status(status) if complete else (None, "no answer")
        if code != 0:
            raise SandboxError(f"kubernetes: {argv[0]} in {self.pod} failed: "
                               f"{problem or err.decode('utf-8', 'replace').strip()[-300:]}")
        return out.decode("utf-8", "replace")

    def _write(self, path: str, data: bytes) -> None:
        self._put([(path, data, 0o600)])

    def _call(self, argv: list[str], env: dict[str, str], timeout: float, token: str) -> ExecResult:
        if set(env.values()) & set(self.settings.secret_values()):
            raise SandboxError("kubernetes: a secret cannot travel as a per-call variable")
        command = self._wrapped(exec_argv(spec.with_env(argv, {**env, EXEC_ENV: token}), timeout, token=token))
        began = time.monotonic()
        try:
            out, err, status, complete = self._stream(  # the wrapper's grace, then its reap's
                command, b"", began + timeout + 2 * KILL_GRACE_SECONDS + KUBERNETES_DEADLINE_SLACK_SECONDS)
        except SandboxError:
            self._ready = False  # the pod may be gone: look again before the next call
            raise
        if not complete:
            self._kill(token)
            return ExecResult(None, out, err, True)
        raw, problem = spec.exit_status(status)
        if raw is None:
            self._ready = False  # look at the pod again before the next call
            raise SandboxError(f"kubernetes: exec in {self.pod}: {problem}")
        code, timed_out = exec_status(raw, elapsed=time.monotonic() - began, timeout=timeout)
        if code is not None and code < 0 and not timed_out:
            self._check_running()
        return ExecResult(code, out, err, timed_out)

    def _wrapped(self, command: list[str]) -> list[str]:
        """A call's command as the pod runs it (the claim mode loads the secrets first)."""
        return command

    def _check_running(self) -> None:
        """After a call that ended by a signal: was it the whole pod? An exec of ``true``
        says at once (the pod's status reaches the API a moment later, and is waited for)."""
        try:
            _, _, status, complete = self._exec_stream(["true"], b"", time.monotonic() + KUBERNETES_WRITE_SECONDS)
            if complete and spec.exit_status(status)[0] == 0:
                return
        except SandboxError:
            pass
        self._ready = False
        deadline = time.monotonic() + KUBERNETES_STATUS_WAIT_SECONDS
        phase, detail = spec.pod_phase(self._read_pod() or {})
        while phase != "ended" and time.monotonic() < deadline:
            time.sleep(KUBERNETES_STATUS_POLL_SECONDS)
            phase, detail = spec.pod_phase(self._read_pod() or {})
        with self._lock:
            self._delete_pod()
        raise SandboxError(self._ended_text(detail if phase == "ended" else "its container is gone"))

    def _ended_text(self, detail: str) -> str:
        return (f"the sandbox pod {self.pod} ended ({detail}); its running commands ended. "
                "Nothing in the home was lost; the next call starts a new pod")

    def _put(self, files: list[tuple[str, bytes, int]], *, making: bool = False) -> None:
        """Write files with one tar over exec: each under a temporary name, then renamed
        (making: the pod is being made, under the lock)."""
        tag = secrets.token_hex(4)
        staged = [(f"{name}.{tag}.tmp", data, mode) for name, data, mode in files]
        archive = tar_bytes(staged, mtime=int(time.time()))
        moves = [(tmp, name) for (tmp, _, _), (name, _, _) in zip(staged, files)]
        stream = self._exec_stream if making else self._stream
        _, err, status, complete = stream(spec.untar_argv(len(archive), moves), archive,
                                          time.monotonic() + KUBERNETES_WRITE_SECONDS)
        code, problem = spec.exit_status(status) if complete else (None, "no answer")
        if code != 0:
            detail = problem or err.decode("utf-8", "replace").strip()[-300:]
            raise SandboxError(f"kubernetes: writing {files[0][0]} failed: {detail}")

    def _kill(self, token: str) -> None:
        with contextlib.suppress(SandboxError):
            self._exec_stream(kill_argv(token), b"", time.monotonic() + KUBERNETES_WRITE_SECONDS)

    def _stream(self, command: list[str], stdin: bytes, deadline: float
                ) -> tuple[bytes, bytes, bytes, bool]:
        return self._in_pod(lambda: self._exec(command, stdin, deadline))

    def _exec_stream(self, command: list[str], stdin: bytes, deadline: float
                     ) -> tuple[bytes, bytes, bytes, bool]:
        """One exec in the pod as it is, making none (while it is made, under the lock)."""
        with self._api(f"exec in {self.pod}"):
            try:
                return self._exec(command, stdin, deadline)
            except cluster.PodGone as gone:
                raise SandboxError(f"kubernetes: exec in {self.pod}: {gone.message}") from gone

    def _exec(self, command: list[str], stdin: bytes, deadline: float) -> tuple[bytes, bytes, bytes, bool]:
        return cluster.exec_stream(self.core, self.pod, self.config.namespace, command, stdin, deadline)

    def _in_pod(self, step: Callable[[], T]) -> T:
        """step() once the pod runs; once more on a new pod when the first found it gone
        (deleted behind this process's back, by another orchestrator's stop, say): a
        refused exec ran nothing."""
        for attempt in (1, 2):
            self._ensure()
            with self._api(f"exec in {self.pod}"):
                try:
                    return step()
                except cluster.PodGone as gone:
                    self._ready = False
                    if attempt == 2:
                        raise SandboxError(f"kubernetes: exec in {self.pod}: {gone.message}") from gone
        raise AssertionError("unreachable")

    def _stop(self) -> list[str]:
        with self._lock:
            self._ready = False
            self._delete_pod()
            if self._egress is not None:
                self._pod_ip = None
                self._egress.stop()
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
        """The pod, its fingerprint covering the pod, the secrets and the helpers' build."""
        pod = spec.pod_manifest(self.config, agent_id=self.agent_id, home=self.home,
                                network=self.settings.network, idle_seconds=self.idle_seconds,
                                base_env=self._base_env, fingerprint="")
        if self._egress is not None:
            pod["spec"]["containers"][0]["command"] = self._egress.init_command()
        stamp = fingerprint([pod, dict(self.settings.secrets), helpers_digest()])
        pod["metadata"]["annotations"][spec.ANNOTATION_FINGERPRINT] = stamp
        return pod

    def _create(self, manifest: dict[str, Any]) -> None:
        cfg, ns, core = self.config, self.config.namespace, self.core
        from kubernetes import client

        self._create_once("network policy", lambda: client.NetworkingV1Api(core.api_client)
                          .create_namespaced_network_policy(ns, spec.network_policy_manifest(ns)))
        self._create_once("volume claim", lambda: core.create_namespaced_persistent_volume_claim(
            ns, spec.claim_manifest(cfg, self.pod)))
        secrets_in_pod = self.settings.secrets if self._egress is None else self._egress.pod_secrets()
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
        self._check_helpers()
        self._put(self._repos_files(), making=True)
        self._egress_for_pod()

    def _check_helpers(self) -> None:
        expected = {f"{HELPER_DIR}/{n}": hashlib.sha256(data).hexdigest() for n, data in helper_files()}
        out, _err, status, complete = self._exec_stream(spec.helpers_check_argv(list(expected)), b"",
                                                  time.monotonic() + KUBERNETES_WRITE_SECONDS)
        code, problem = spec.exit_status(status) if complete else (None, "no answer")
        if code is None:
            raise SandboxError(f"kubernetes: checking the helpers in {self.pod} failed: {problem}")
        wrong = spec.helpers_mismatch(out, expected)
        if wrong:
            raise SandboxError(f"kubernetes: the image {self.config.image!r} has other helpers than "
                               f"this orchestrator ({', '.join(wrong)}): rebuild it with "
                               "`guilds sandbox image` and push it")

    def _create_once(self, what: str, create: Any) -> None:
        with self._api(f"create the {what}"), cluster.ignoring(409):
            create()

    def _wait_running(self) -> None:
        deadline = time.monotonic() + KUBERNETES_START_SECONDS
        while time.monotonic() < deadline:
            pod = self._read_pod()
            phase, detail = spec.pod_phase(pod or {})
            if phase == "running":
                return
            if phase in ("image", "ended"):
                raise SandboxError(f"kubernetes: pod {self.pod} cannot run: {detail} "
                                   f"(image {self.config.image!r})")
            time.sleep(KUBERNETES_START_POLL_SECONDS)
        raise SandboxError(f"kubernetes: pod {self.pod} not running after {KUBERNETES_START_SECONDS} s")

    def _read_pod(self) -> dict[str, Any] | None:
        with self._api("read the pod"), cluster.ignoring(404):
            pod = self.core.read_namespaced_pod(self.pod, self.config.namespace)
            return self.core.api_client.sanitize_for_serialization(pod)
        return None

    def _delete_pod(self) -> None:
        with self._api("delete the pod"), cluster.ignoring(404):
            self.core.delete_namespaced_pod(self.pod, self.config.namespace, grace_period_seconds=0)

    # --- the cluster --------------------------------------------------------------
    @property
    def core(self) -> Any:
        if self._core is None:
            with self._api("load the kubeconfig"):
                self._core = cluster.connect(self._api_client)
        return self._core

    def _api(self, what: str) -> contextlib.AbstractContextManager[None]:
        return cluster.api_errors(what, self.config.namespace)
