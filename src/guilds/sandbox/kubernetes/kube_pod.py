"""What the kubernetes backend's two modes share: a sandbox whose calls run over
pods/exec in one pod of the namespace (``KubePodSandbox``).

Each mode (``kube_sandbox.KubernetesSandbox``, a pod made on first use;
``kube_claims.KubeClaimSandbox``, a pod claimed from a warm pool) says how its pod
is found or made (``_ensure``) and what it does with a pod that ended behind a
call (``_pod_ended``); this base runs everything else in that pod: the calls
(``exec_argv``'s wrapper, found again by token and killed by it), the resident
helper's channel, file writes as one tar over exec, the check that a call's
signal was not the whole pod's end, and the image's helpers checked to be this
orchestrator's build. A call whose exec finds the pod gone (HTTP 404 on the
handshake: nothing ran) looks for the pod again and runs once more.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, TypeVar

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import (
    KUBERNETES_DEADLINE_SLACK_SECONDS,
    KUBERNETES_EGRESS_SETTLE_SECONDS,
    KUBERNETES_POD_GONE_ATTEMPTS,
    KUBERNETES_POD_GONE_PAUSE_SECONDS,
    KUBERNETES_START_POLL_SECONDS,
    KUBERNETES_START_SECONDS,
    KUBERNETES_STATUS_POLL_SECONDS,
    KUBERNETES_STATUS_WAIT_SECONDS,
    KUBERNETES_WRITE_SECONDS,
)
from .._container import (
    EXEC_ENV,
    HELPER_DIR,
    STATE_INSIDE,
    ContainerSandbox,
    blocking,
    ending_argv,
    exec_argv,
    exec_status,
    helper_files,
    kill_argv,
    tar_bytes,
)
from .._host_folder import DEFAULT_PATH, agent_env, checked_id
from .._spawn import KILL_GRACE_SECONDS
from ..base import ExecResult
from ..process_channel import DirectProcess, KubeProcess
from . import kube_admin as admin
from . import kube_cluster as cluster
from . import kube_spec as spec
from .kube_egress import KubeEgress
from .kube_wire import Wire

T = TypeVar("T")


class KubePodSandbox(ContainerSandbox):
    """A sandbox whose calls run in one pod (``self.pod``) of ``kubernetes.namespace``."""

    name = admin.NAME
    resident_keepalive = True
    """A pods/exec stream whose client died may leave its process running, stdin open: the
    resident channel sends keepalives and its server ends without them (``--orphan-exit``)."""
    egress: KubeEgress | None = None
    """agent.network a list: the sandbox's side of the egress proxy, the pod's included."""

    @classmethod
    def checkpoints_refused(cls, settings: AgentSettings) -> str | None:
        """What the cluster lacks for a VolumeSnapshot of the home, asked of it
        (``kube_volsnap``): no checkpoint is kept on kubernetes."""
        from .kube_volsnap import unserved_why

        return unserved_why(settings)
    state_dir = STATE_INSIDE
    python = spec.PYTHON

    def __init__(self, settings: AgentSettings, *, idle_seconds: float | None = None,
                 api_client: Any = None, loader: Sequence[str] = (), wired: bool = False):
        """api_client: a ``kubernetes.client.ApiClient`` (default: from the kubeconfig);
        loader: what every command in the pod runs under (claim mode: the secrets file loaded);
        wired: reads and execs go through a ``kube_wire.Wire`` (claim mode), not the client."""
        self.settings, self.config = settings, settings.kubernetes
        self.home = settings.home_inside()
        self.agent_id = checked_id(settings)
        self.pod = spec.object_name(self.agent_id)
        self.idle_seconds = idle_seconds or self.config.idle_minutes * 60
        env = agent_env(settings, home=self.home, state_dir=STATE_INSIDE, path=DEFAULT_PATH)
        self._base_env = {k: v for k, v in env.items() if k not in settings.secrets}
        self._loader = list(loader)
        self._api_client = api_client
        self._core: Any = None
        self._wired = wired
        self._wire: Wire | None = None
        self._ready = False
        self._lock = threading.Lock()

    # --- what each mode says ------------------------------------------------------
    def _ensure(self) -> bool:
        """Find the pod running, or make or claim it (under ``_lock``), unless known ready;
        True when it was made now."""
        raise NotImplementedError

    def _pod_ended(self) -> None:
        """The pod ended behind a call (under ``_lock``): let it go, so that the next call
        finds or makes another."""
        raise NotImplementedError

    def _gone(self) -> None:
        """A hook: an exec found the pod gone (or not the one it was taken for); the next
        ``_ensure`` looks for it."""

    # --- calls in the pod -----------------------------------------------------------
    def _loaded(self, command: list[str], *, marking: bool = False) -> list[str]:
        """A command as the pod runs it: under the mode's loader (marking: a mode may
        have the loader say on stderr that it found what it loads)."""
        return [*self._loader, *command]

    async def open_process(self, argv: Sequence[str]) -> KubeProcess | DirectProcess:
        """One pods/exec websocket with stdin; closing it also kills what it started (by token).
        A mode may carry a resident helper's channel elsewhere (``DirectProcess``)."""
        return await blocking(self._open_process, list(argv))

    def _open_process(self, argv: list[str]) -> KubeProcess | DirectProcess:
        token = secrets.token_hex(8)
        return self._in_pod(lambda: self._process(ending_argv(argv, token), token))

    def _process(self, command: list[str], token: str) -> KubeProcess:
        """command's exec under the loader; it ends what it started once its stdin ends,
        and closing it waits for that (else kills by token)."""
        process = KubeProcess(self._open_ws(self._loaded(command, marking=True)), stop=lambda: self._kill(token),
                              ends_itself=True)
        self._process_opened(process)
        return process

    def _process_opened(self, process: KubeProcess) -> None:
        """A hook: a mode's look at a process just opened (raise PodGone: it ran nothing)."""

    def _open_ws(self, command: list[str]) -> Any:
        """A pods/exec websocket of command, stdin attached."""
        if (wire := self.wire) is not None:
            return wire.open_exec(self.config.namespace, self.pod, command)
        return cluster.open_exec(self.core, self.pod, self.config.namespace, command)

    def _write(self, path: str, data: bytes) -> None:
        self._put([(path, data, 0o600)])

    def _call(self, argv: list[str], env: dict[str, str], timeout: float, token: str) -> ExecResult:
        if set(env.values()) & set(self.settings.secret_values()):
            raise SandboxError("kubernetes: a secret cannot travel as a per-call variable")
        command = self._loaded(exec_argv(spec.with_env(argv, {**env, EXEC_ENV: token}), timeout, token=token))
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
            self._pod_ended()
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
        moves = [(tmp, name) for (tmp, _, _), (name, _, _) in zip(staged, files, strict=True)]
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
        wire = self.wire
        if wire is not None:
            return wire.exec_stream(self.config.namespace, self.pod, command, stdin, deadline)
        return cluster.exec_stream(self.core, self.pod, self.config.namespace, command, stdin, deadline)

    def _in_pod(self, step: Callable[[], T]) -> T:
        """step() once the pod runs; again on a new pod when the first found it gone
        (deleted behind this process's back, by another orchestrator's stop, say), up to
        KUBERNETES_POD_GONE_ATTEMPTS times, the later ones KUBERNETES_POD_GONE_PAUSE_SECONDS apart (a pod made
        anew under the same name may refuse an exec until its container is listed): a
        refused exec ran nothing."""
        for attempt in range(1, KUBERNETES_POD_GONE_ATTEMPTS + 1):
            self._ensure()
            with self._api(f"exec in {self.pod}"):
                try:
                    return step()
                except cluster.PodGone as gone:
                    self._ready = False
                    self._gone()
                    if attempt == KUBERNETES_POD_GONE_ATTEMPTS:
                        raise SandboxError(f"kubernetes: exec in {self.pod}: {gone.message}") from gone
            if attempt > 1:  # a pod made anew under the same name may list its container late
                time.sleep(KUBERNETES_POD_GONE_PAUSE_SECONDS)
        raise AssertionError("unreachable")

    # --- agent.network a list (``kube_egress``) -------------------------------------------
    def _egress_for_pod(self, pod: dict[str, Any] | None = None) -> None:
        """agent.network a list, the pod found or made running (under the lock; pod: as
        just read, else read now): its egress told of it (``KubeEgress.for_pod``)."""
        egress = self.egress
        if egress is None:
            return
        egress.for_pod(*self._pod_address(pod))

    def _pod_address(self, pod: dict[str, Any] | None = None) -> tuple[str | None, str]:
        """The running pod's (uid, IP) (pod: as just read, else read now); SandboxError
        when it has no IP."""
        pod = pod or self._read_pod() or {}
        uid, pod_ip = (pod.get("metadata") or {}).get("uid"), (pod.get("status") or {}).get("podIP")
        if not pod_ip:
            raise SandboxError(f"kubernetes: the pod {self.pod} runs without an address")
        return uid, str(pod_ip)

    def _apply_policy(self, manifest: dict[str, Any], what: str = "egress network policy") -> None:
        from kubernetes import client

        self._create_once(what, lambda: client.NetworkingV1Api(self.core.api_client)
                          .create_namespaced_network_policy(self.config.namespace, manifest))

    def _run_quietly(self, argv: list[str]) -> str:
        """argv's stdout, run in the pod as it is (the backend's own check)."""
        out, err, status, complete = self._exec_stream(
            argv, b"", time.monotonic() + KUBERNETES_EGRESS_SETTLE_SECONDS + KUBERNETES_WRITE_SECONDS)
        code, problem = spec.exit_status(status) if complete else (None, "no answer")
        if code != 0:
            raise SandboxError(f"kubernetes: {argv[0]} in {self.pod} failed: "
                               f"{problem or err.decode('utf-8', 'replace').strip()[-300:]}")
        return out.decode("utf-8", "replace")

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
        if (wire := self.wire) is not None:
            return self._get(wire, f"/api/v1/namespaces/{self.config.namespace}/pods/{self.pod}", "read the pod")
        with self._api("read the pod"), cluster.ignoring(404):
            pod = self.core.read_namespaced_pod(self.pod, self.config.namespace)
            return self.core.api_client.sanitize_for_serialization(pod)
        return None

    @property
    def wire(self) -> Wire | None:
        """The lean way to the API server, made on first use (wired only; else None: the
        client's way): from the kubeconfig when it reads it, else from the client's
        configuration."""
        if not self._wired:
            return None
        if self._wire is None:
            with self._api("load the kubeconfig"):
                lean = None if self._api_client is not None else Wire.from_kubeconfig()
                self._wire = lean or Wire.from_configuration(self.core.api_client.configuration)
        return self._wire

    def _get(self, wire: Wire, path: str, what: str) -> dict[str, Any] | None:
        """The object at path through the wire; None when it is not there."""
        with self._api(what), cluster.ignoring(404):
            return wire.request("GET", path)
        return None

    @property
    def core(self) -> Any:
        if self._core is None:
            with self._api("load the kubeconfig"):
                self._core = cluster.connect(self._api_client)
        return self._core

    def _api(self, what: str) -> contextlib.AbstractContextManager[None]:
        return cluster.api_errors(what, self.config.namespace)
