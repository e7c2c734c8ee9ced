"""The kubernetes sandbox's objects, exec framing and error texts, as pure functions.

Per agent, in the configured namespace (names from ``object_name``):

- a Secret ``<name>-env``: the agent's secrets, put into the pod's environment
  (``envFrom``), so none travels on a command line;
- a PersistentVolumeClaim ``<name>-home`` (``home_size``): the home (subPath
  ``home``) and the state root (subPath ``state``), kept when the pod goes;
- the Pod ``<name>``: INIT as its command (the idle stop), a shared process
  namespace so the pause container reaps zombies, the configured image,
  resources (requests = limits), runtimeClassName (e.g. gVisor), a service
  account whose token is not mounted, the agent's uid CONTAINER_UID with
  ``runAsNonRoot`` (the kubelet refuses to start it as root), ``fsGroup`` so
  the claim is the agent's, no capabilities, no privilege escalation,
  restartPolicy Never, and the label ``guilds.network: "off"`` unless ``agent.network``;
- one NetworkPolicy per namespace (``guilds-network-off``) denying all traffic
  to and from the pods so labelled (it needs a CNI that enforces policies).

Exec is the websocket of ``pods/exec`` (channels 1 stdout, 2 stderr, 3 the
final Status, ``exit_status``). A file goes in as a tar on stdin of
``untar_argv``: ``head -c SIZE`` stops at the archive's end, so stdin need not
be closed, and each file is extracted under a temporary name, then renamed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any, Mapping, Sequence

from ...config.settings import KubernetesSettings
from .._container import CONTAINER_UID, STATE_INSIDE, init_argv

LABEL_AGENT = "guilds.agent"
LABEL_NETWORK = "guilds.network"
ANNOTATION_AGENT = "guilds/agent-id"
ANNOTATION_FINGERPRINT = "guilds/fingerprint"
NETWORK_POLICY = "guilds-network-off"
CONTAINER = "sandbox"
PYTHON = "python3"
_NAME_MAX = 63 - len("-home")
_UNTAR = ('head -c "$0" | tar -xof - -C "$1" || exit 1; shift; '
          'while [ $# -gt 0 ]; do mv -f -- "$1" "$2" || exit 1; shift 2; done')


def object_name(agent_id: str) -> str:
    """A DNS-1123 label from the agent id: lowercased, other characters as '-', and a
    short hash of the id so that ``Web_1`` and ``web-1`` stay apart (pure)."""
    digest = hashlib.sha256(agent_id.encode()).hexdigest()[:8]
    clean = re.sub(r"[^a-z0-9-]+", "-", agent_id.lower()).strip("-")
    return f"guilds-{clean}"[: _NAME_MAX - 9].rstrip("-") + f"-{digest}"


def keyed_fingerprint(key: bytes, spec: Any) -> str:
    """An HMAC-SHA-256 of a JSON-able spec under key (pure): a running pod is still right
    while its annotation matches, and without the key it cannot be recomputed from the
    spec, nor a guess of a secret in it tested."""
    text = json.dumps(spec, sort_keys=True, default=str).encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()[:32]


def secret_manifest(cfg: KubernetesSettings, name: str, secrets: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"{name}-env", "namespace": cfg.namespace,
                         "labels": {LABEL_AGENT: name}},
            "stringData": dict(secrets)}


def claim_manifest(cfg: KubernetesSettings, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{name}-home", "namespace": cfg.namespace,
                         "labels": {LABEL_AGENT: name}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": cfg.home_size}}}}


def network_policy_manifest(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": NETWORK_POLICY, "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": {LABEL_NETWORK: "off"}},
                     "policyTypes": ["Ingress", "Egress"]}}


def pod_manifest(
    cfg: KubernetesSettings, *, agent_id: str, home: str, network: bool, idle_seconds: float,
    base_env: Mapping[str, str], fingerprint: str,
) -> dict[str, Any]:
    """The agent's pod (pure). base_env: the environment without secrets."""
    name = object_name(agent_id)
    resources = {"cpu": cfg.cpu, "memory": cfg.memory}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "shareProcessNamespace": True,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 5,
        "containers": [{
            "name": CONTAINER,
            "image": cfg.image,
            "command": init_argv(PYTHON, idle_seconds),
            "workingDir": home,
            "env": [{"name": k, "value": v} for k, v in base_env.items()],
            "envFrom": [{"secretRef": {"name": f"{name}-env"}}],
            "resources": {"requests": resources, "limits": resources},
            "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                "runAsUser": CONTAINER_UID, "runAsGroup": CONTAINER_UID,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "home", "mountPath": home, "subPath": "home"},
                             {"name": "home", "mountPath": STATE_INSIDE, "subPath": "state"}],
        }],
        "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": f"{name}-home"}}],
        "securityContext": {"fsGroup": CONTAINER_UID},
    }
    if cfg.runtime_class:
        spec["runtimeClassName"] = cfg.runtime_class
    if cfg.service_account:
        spec["serviceAccountName"] = cfg.service_account
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": cfg.namespace,
                         "labels": {LABEL_AGENT: name, LABEL_NETWORK: "on" if network else "off"},
                         "annotations": {ANNOTATION_AGENT: agent_id,
                                         ANNOTATION_FINGERPRINT: fingerprint}},
            "spec": spec}


def with_env(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """argv with per-call variables set by ``env`` (pods/exec takes no environment).
    Only for values that are not secret: the secrets are in the pod's environment."""
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)


def helpers_check_argv(paths: Sequence[str]) -> list[str]:
    """sha256sum of the image's helpers: the pod runs as the agent, which cannot
    write /usr/local/bin, so the image's own copies must be this orchestrator's build."""
    return ["sha256sum", "--", *paths]


def helpers_mismatch(output: bytes, expected: Mapping[str, str]) -> list[str]:
    """The helper paths whose sha256sum line in output is missing or differs (pure)."""
    seen = {}
    for line in output.decode("utf-8", "replace").splitlines():
        digest, _, path = line.partition("  ")
        seen[path] = digest
    return [path for path, digest in expected.items() if seen.get(path) != digest]


def untar_argv(size: int, moves: Sequence[tuple[str, str]], root: str = "/") -> list[str]:
    """Extract a tar of ``size`` bytes from stdin at root, then rename each (temp, final)."""
    return ["/bin/sh", "-c", _UNTAR, str(size), root, *(p for move in moves for p in move)]


def exit_status(status: str | bytes) -> tuple[int | None, str]:
    """(exit code, error) from the exec's final Status on channel 3 (pure).

    Success -> 0; NonZeroExitCode -> its ExitCode cause; anything else (the
    command could not start, the container is gone) -> None and the message.
    """
    try:
        doc = json.loads(status)
    except ValueError:
        return None, "no exit status from the exec"
    if doc.get("status") == "Success":
        return 0, ""
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"]), ""
    return None, str(doc.get("message") or doc.get("reason") or "the exec failed")


def pod_phase(pod: Mapping[str, Any]) -> tuple[str, str]:
    """("running" | "pending" | "idle" | "ended" | "image", detail) of a pod's status (pure).

    idle: INIT exited 0 (the idle stop); ended: killed, out of memory, evicted;
    image: the image cannot be pulled.
    """
    status = pod.get("status") or {}
    phase = status.get("phase")
    states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
    waiting = [s["waiting"] for s in states if s.get("waiting") is not None]
    if any(w.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName") for w in waiting):
        return "image", waiting[0].get("message") or waiting[0]["reason"]
    if phase == "Running" and states and all(s.get("running") is not None for s in states):
        return "running", ""
    if phase in ("Pending", "Running", None):
        return "pending", (waiting[0].get("reason", "") if waiting else "")
    done = [s["terminated"] for s in states if s.get("terminated") is not None]
    if phase == "Succeeded" and all(t.get("exitCode") == 0 for t in done):
        return "idle", ""
    if done:
        return "ended", f"{done[0].get('reason', 'Error')}, exit code {done[0].get('exitCode')}"
    return "ended", status.get("reason") or str(phase)


def api_error_text(what: str, status: int, reason: str, body: str | None, namespace: str) -> str:
    """The one-line error for a refused API request (pure)."""
    try:
        message = json.loads(body or "").get("message") or reason
    except (ValueError, AttributeError):
        message = reason or "no answer"
    if status == 0:
        return f"kubernetes: {what}: the cluster is not reachable ({message}); check KUBECONFIG"
    if status in (401, 403):
        return (f"kubernetes: {what}: forbidden in namespace {namespace!r} ({message}); "
                "the orchestrator needs rights on pods, pods/exec, secrets, "
                "persistentvolumeclaims and networkpolicies there, and in claim mode on "
                "agent-sandbox's sandboxes, sandboxclaims, sandboxtemplates and sandboxwarmpools")
    if status == 404:
        return f"kubernetes: {what}: not found ({message})"
    if status == 422:
        return f"kubernetes: {what}: the cluster refused the spec ({message})"
    return f"kubernetes: {what}: {message} (HTTP {status})"
