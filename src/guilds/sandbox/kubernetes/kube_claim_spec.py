"""The claim mode's objects (kubernetes-sigs/agent-sandbox), as pure functions.

``[kubernetes] mode = "claim"``: in the configured namespace,

- one ``SandboxTemplate`` per pod spec (``template_manifest``): today's pod of
  ``kube_spec.pod_manifest`` (non-root uid, no token, every capability dropped,
  requests = limits, the runtime class, the network label) with what no
  agent's own: no Secret in its environment, the home and the state root on
  an ``emptyDir`` of ``home_size``, and no idle stop (a pooled pod waits for
  its agent). Its name is a hash of that spec, so agents whose settings give
  the same pod (one image and runtime class, the same home path) share it.
  The controller's own NetworkPolicy is turned off (``Unmanaged``): the
  namespace's ``guilds-network-off`` holds the labelled pods;
- one ``SandboxWarmPool`` per template, of the same name, ``warm`` replicas;
- one ``SandboxClaim`` per agent, named like its pod in pod mode
  (``kube_spec.object_name``), pointing at the pool: the controller adopts a
  ready sandbox of the pool, or makes one from the template when none is ready;
- with ``keep_home``: instead of a claim, a ``Sandbox`` of the agent's own, of
  the same name, with a volume claim template ``home`` (the controller names
  its claim ``home-<name>``); suspended (``operatingMode: Suspended``: its pod
  deleted, the volume kept) and resumed (``Running``).

No secret is in any of these: the agent's secrets go into the claimed pod
after adoption, as a 0600 file of the state root (``secrets_file``) that
every command's wrapper loads (``loaded_argv``).
"""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any, Mapping, Sequence, TypeAlias

from ...config.settings import KubernetesSettings, SandboxUser
from ...errors import SandboxError
from ...limits import KUBERNETES_CLAIM_NO_IDLE_SECONDS
from .._container import STATE_INSIDE, fingerprint, init_argv
from . import kube_spec as spec
from .kube_user import with_user

GROUP = "agents.x-k8s.io"
EXTENSIONS = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
CLAIMS, TEMPLATES, POOLS, SANDBOXES = "sandboxclaims", "sandboxtemplates", "sandboxwarmpools", "sandboxes"
ANNOTATION_POD_NAME = "agents.x-k8s.io/pod-name"
LABEL_TEMPLATE = "guilds.template"
HOME_VOLUME = "home"
NO_IDLE_SECONDS = KUBERNETES_CLAIM_NO_IDLE_SECONDS
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NO_FILE_EXIT = 126
NO_FILE_TEXT = "guilds: the sandbox has no environment file"
LOADED_MARK = b"guilds: the environment file is there\n"
"""What a marked loader writes to stderr once it found the file, before the command runs."""
_CHECK = f'[ -r "$0" ] || {{ echo "{NO_FILE_TEXT} $0" >&2; exit {NO_FILE_EXIT}; }}; '
_LOAD = _CHECK + '. "$0" && exec "$@"'
_LOAD_MARKED = _CHECK + f"printf '%s\\n' '{LOADED_MARK.decode().strip()}' >&2; " + '. "$0" && exec "$@"'


Relay: TypeAlias = "tuple[str, list[str]] | None"
"""What INIT runs first (``init_argv``'s relay_with): the egress relay with agent.network a list."""


def _pod_spec(cfg: KubernetesSettings, *, home: str, network: bool, base_env: Mapping[str, str],
              user: SandboxUser | None = None, relay: Relay = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(the pod spec every agent of these settings shares, its labels)."""
    pod = spec.pod_manifest(cfg, agent_id="pool", home=home, network=network, idle_seconds=NO_IDLE_SECONDS,
                            base_env=base_env, fingerprint="")
    pod_spec = copy.deepcopy(pod["spec"])
    container = pod_spec["containers"][0]
    del container["envFrom"]
    container["command"] = init_argv(spec.PYTHON, NO_IDLE_SECONDS, relay_with=relay)
    pod_spec["volumes"] = [{"name": HOME_VOLUME, "emptyDir": {"sizeLimit": cfg.home_size}}]
    return with_user(pod_spec, user), {spec.LABEL_NETWORK: pod["metadata"]["labels"][spec.LABEL_NETWORK]}


def template_manifest(cfg: KubernetesSettings, *, home: str, network: bool, base_env: Mapping[str, str],
                      helpers: str, user: SandboxUser | None = None, relay: Relay = None) -> dict[str, Any]:
    """The SandboxTemplate for these settings (user: the template's user, ``kube_user``;
    relay: INIT's egress relay); its name covers the spec and the helpers' build."""
    pod_spec, labels = _pod_spec(cfg, home=home, network=network, base_env=base_env, user=user, relay=relay)
    name = "guilds-" + fingerprint([pod_spec, labels, helpers])[:12]
    return {"apiVersion": f"{EXTENSIONS}/{VERSION}", "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": cfg.namespace, "labels": {LABEL_TEMPLATE: name}},
            "spec": {"podTemplate": {"metadata": {"labels": {**labels, LABEL_TEMPLATE: name}},
                                     "spec": pod_spec},
                     "networkPolicyManagement": "Unmanaged"}}


def warm_pool_manifest(template: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    meta = template["metadata"]
    return {"apiVersion": f"{EXTENSIONS}/{VERSION}", "kind": "SandboxWarmPool",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": dict(meta["labels"])},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": meta["name"]}}}


def claim_manifest(namespace: str, agent_id: str, pool: str) -> dict[str, Any]:
    name = spec.object_name(agent_id)
    return {"apiVersion": f"{EXTENSIONS}/{VERSION}", "kind": "SandboxClaim",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {spec.LABEL_AGENT: name, LABEL_TEMPLATE: pool},
                         "annotations": {spec.ANNOTATION_AGENT: agent_id}},
            "spec": {"warmPoolRef": {"name": pool}}}


def own_sandbox_manifest(cfg: KubernetesSettings, template: Mapping[str, Any], agent_id: str,
                         idle_seconds: float, relay: Relay = None) -> dict[str, Any]:
    """The Sandbox of an agent that keeps its home: the template's pod with the home on a
    volume claim of ``home_size`` (the controller mounts it in place of the emptyDir), and
    INIT's idle stop after idle_seconds (this pod waits in no pool)."""
    name = spec.object_name(agent_id)
    pod_template = copy.deepcopy(template["spec"]["podTemplate"])
    pod_template["metadata"]["labels"][spec.LABEL_AGENT] = name
    pod_template["spec"]["volumes"] = []
    pod_template["spec"]["containers"][0]["command"] = init_argv(spec.PYTHON, idle_seconds, relay_with=relay)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Sandbox",
            "metadata": {"name": name, "namespace": cfg.namespace,
                         "labels": {spec.LABEL_AGENT: name, LABEL_TEMPLATE: template["metadata"]["name"]},
                         "annotations": {spec.ANNOTATION_AGENT: agent_id}},
            "spec": {"podTemplate": pod_template, "operatingMode": "Running",
                     "volumeClaimTemplates": [{
                         "metadata": {"name": HOME_VOLUME},
                         "spec": {"accessModes": ["ReadWriteOnce"],
                                  "resources": {"requests": {"storage": cfg.home_size}}}}]}}


def operating_mode(mode: str) -> dict[str, Any]:
    """The merge patch that suspends ("Suspended") or resumes ("Running") a Sandbox."""
    return {"spec": {"operatingMode": mode}}


def condition(obj: Mapping[str, Any], kind: str) -> tuple[str, str]:
    """(status, "reason: message") of obj's condition of that type; ("", "") when absent."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            detail = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
            return str(cond.get("status", "")), detail
    return "", ""


def bound_sandbox(claim: Mapping[str, Any]) -> str:
    """The name of the ready sandbox a claim holds, "" while it holds none ready."""
    name = ((claim.get("status") or {}).get("sandbox") or {}).get("name") or ""
    return name if name and condition(claim, "Ready")[0] == "True" else ""


def pod_of(sandbox: Mapping[str, Any]) -> str:
    """The pod of a Sandbox: its pod-name annotation (a pod adopted from a pool), else its name."""
    meta = sandbox.get("metadata") or {}
    return (meta.get("annotations") or {}).get(ANNOTATION_POD_NAME) or meta.get("name", "")


def pool_of(claim: Mapping[str, Any]) -> str:
    return ((claim.get("spec") or {}).get("warmPoolRef") or {}).get("name", "")


def secrets_file(agent_id: str) -> str:
    """The 0600 file of the state root that holds the agent's environment of secrets."""
    return f"{STATE_INSIDE}/{agent_id}/secrets.env"


def secrets_text(secrets: Mapping[str, str]) -> bytes:
    """One ``export NAME='value'`` line per secret, as ``.`` reads it (pure)."""
    lines = []
    for name, value in secrets.items():
        if not _SHELL_NAME.fullmatch(name):
            raise SandboxError(f"kubernetes: the secret name {name!r} is not a variable name")
        lines.append(f"export {name}={shlex.quote(value)}\n")
    return "".join(lines).encode()


def loaded_argv(agent_id: str, argv: Sequence[str], *, marked: bool = False) -> list[str]:
    """argv run with the secrets file loaded into its environment; without the file it
    fails (status NO_FILE_EXIT, NO_FILE_TEXT on stderr) rather than run without the
    agent's secrets (marked: LOADED_MARK on stderr first when the file is there)."""
    return ["/bin/sh", "-c", _LOAD_MARKED if marked else _LOAD, secrets_file(agent_id), *argv]


def found_no_file(agent_id: str, status: int | None, stderr: bytes) -> bool:
    """Did the loader refuse this command for want of the agent's secrets file (so nothing
    of it ran)? Its status and its one line, whole: a command that ran says otherwise."""
    return status == NO_FILE_EXIT and stderr == f"{NO_FILE_TEXT} {secrets_file(agent_id)}\n".encode()
