"""What the kubernetes backend answers without a sandbox, and what ``rm`` removes.

- ``check(settings, needed)``: doctor's line: which kubeconfig (KUBECONFIG, else
  ~/.kube/config), and whether its user has every right the backend uses in
  ``kubernetes.namespace`` (KUBE_VERBS, asked with SelfSubjectAccessReviews);
- ``boxes(settings)``: the pods labelled ``guilds.agent`` in that namespace;
- ``remove_kept(core, pod, namespace)``: the pod's home claim and Secret deleted
  (what a stop keeps), each one named.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...config.settings import AgentSettings
from ...limits import DOCTOR_PROBE_SECONDS
from ..base import Box, Check
from . import kube_cluster as cluster
from . import kube_spec as spec

NAME = "kubernetes"
KUBE_VERBS = (("create", "pods", ""), ("get", "pods", ""), ("delete", "pods", ""), ("create", "pods", "exec"),
              ("create", "persistentvolumeclaims", ""))
"""What the kubernetes backend does in its namespace."""
KUBE_EGRESS_VERBS = (("create", "networkpolicies", ""),)
"""agent.network a list: what it does besides (each pod's egress policy)."""


def kubeconfig_path() -> Path | None:
    """KUBECONFIG's first file, else ~/.kube/config, when it is there."""
    path = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    return path if path.is_file() else None


def _missing_rights(namespace: str, egress: bool = False) -> list[str]:
    """The verbs the backend needs that the kubeconfig's user lacks in namespace (egress:
    with agent.network a list)."""
    from kubernetes import client, config

    api = client.AuthorizationV1Api(config.new_client_from_config())
    missing = []
    for verb, resource, sub in KUBE_VERBS + (KUBE_EGRESS_VERBS if egress else ()):
        attrs = client.V1ResourceAttributes(namespace=namespace, verb=verb, resource=resource,
                                            subresource=sub or None)
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        answer = api.create_self_subject_access_review(review, _request_timeout=DOCTOR_PROBE_SECONDS)
        if not answer.status.allowed:
            missing.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    return missing


def check(settings: AgentSettings, *, needed: bool) -> list[Check]:
    namespace = settings.kubernetes.namespace
    path = kubeconfig_path()
    if path is None:
        return [Check(NAME, False, "no kubeconfig (KUBECONFIG, ~/.kube/config)",
                      "point KUBECONFIG at the cluster's config", needed)]
    try:
        missing = _missing_rights(namespace, bool(settings.egress))
    except Exception as exc:  # the client's errors and the connection's alike: say which
        return [Check(NAME, False, f"{path}: cannot ask the cluster ({type(exc).__name__}: {exc})"[:300],
                      "check the kubeconfig's server and credentials", needed)]
    if missing:
        return [Check(NAME, False, f"{path}: in namespace {namespace} the user may not "
                      f"{', '.join(missing)}", f"grant them in {namespace} (a Role and RoleBinding)", needed)]
    return [Check(NAME, True, f"{path}: every right the backend needs in namespace {namespace}", needed=needed)]


def boxes(settings: AgentSettings) -> list[Box]:
    namespace = settings.kubernetes.namespace
    with cluster.api_errors("list the pods", namespace):
        pods = cluster.connect().list_namespaced_pod(namespace, label_selector=spec.LABEL_AGENT).items
    return [Box(NAME, p.metadata.labels.get(spec.LABEL_AGENT, "?"), f"{namespace}/{p.metadata.name}",
                (p.status.phase or "?").lower()) for p in pods]


def remove_kept(core: Any, pod: str, namespace: str) -> Iterator[str]:
    """Delete the pod's home claim and secret; yield each one deleted."""
    for kind, name, delete in (("claim", f"{pod}-home", core.delete_namespaced_persistent_volume_claim),
                               ("secret", f"{pod}-env", core.delete_namespaced_secret)):
        with cluster.api_errors(f"delete {kind} {name}", namespace), cluster.ignoring(404):
            delete(name, namespace)
            yield f"{kind} {namespace}/{name}"
