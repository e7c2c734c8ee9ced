"""What ``guilds doctor`` and ``guilds sandbox list|stop|rm`` ask of the claim mode
(``[kubernetes] mode = "claim"``), through a kubernetes ``ApiClient``:

- ``problems(api, namespace)``: what keeps the claim mode from working, one line
  each: agent-sandbox's APIs not served (its CRDs not installed), a right of
  docs/kubernetes-claims-role.yaml the user lacks (SelfSubjectAccessReview), a
  warm pool the controller has not seen at its current generation (no controller
  with ``--extensions`` answering);
- ``boxes(api, namespace)``: each agent's claim or own Sandbox, its state;
- ``remove(api, namespace, name)``: an agent's claim, own Sandbox and home volume;
- ``remove_unused_template(api, namespace, template, removed)``: a template and its warm
  pool, once no claim or Sandbox is of that template;
- ``check(settings, needed)`` and ``listed(settings)``: the kubernetes backend's
  doctor lines and ``guilds sandbox list`` rows in claim mode, from these.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...config.settings import AgentSettings
from ...limits import DOCTOR_PROBE_SECONDS
from ..base import Box, Check
from . import kube_claim_spec as claims
from . import kube_cluster as cluster
from . import kube_spec as spec

NAME = "kubernetes claims"

SERVED = {claims.GROUP: (claims.SANDBOXES,), claims.EXTENSIONS: (claims.CLAIMS, claims.TEMPLATES, claims.POOLS)}
"""The resources agent-sandbox's CRDs serve, by API group (version claims.VERSION)."""
RIGHTS = tuple((verb, claims.EXTENSIONS, plural) for plural in (claims.TEMPLATES, claims.POOLS)
               for verb in ("get", "create", "patch", "delete")) + tuple(
    (verb, claims.EXTENSIONS, claims.CLAIMS) for verb in ("get", "list", "watch", "create", "delete")) + tuple(
    (verb, claims.GROUP, claims.SANDBOXES) for verb in ("get", "list", "create", "patch", "delete"))
"""What the claim mode does in its namespace (docs/kubernetes-claims-role.yaml)."""


@dataclass(frozen=True)
class ClaimBox:
    agent: str
    """The agent's id (the object's annotation), else its name."""
    name: str
    kind: str
    """"claim" or "sandbox" (an own Sandbox, keep_home)."""
    state: str


def _missing_apis(api: Any) -> list[str]:
    from kubernetes import client

    missing = []
    for group, plurals in SERVED.items():
        try:
            served = {r.name for r in client.CustomObjectsApi(api).get_api_resources(
                group, claims.VERSION, _request_timeout=DOCTOR_PROBE_SECONDS).resources}
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            served = set()
        missing += [f"{plural}.{group}/{claims.VERSION}" for plural in plurals if plural not in served]
    return missing


def _missing_rights(api: Any, namespace: str) -> list[str]:
    from kubernetes import client

    auth, missing = client.AuthorizationV1Api(api), []
    for verb, group, plural in RIGHTS:
        attrs = client.V1ResourceAttributes(namespace=namespace, verb=verb, group=group, resource=plural)
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        if not auth.create_self_subject_access_review(review, _request_timeout=DOCTOR_PROBE_SECONDS).status.allowed:
            missing.append(f"{verb} {plural}.{group}")
    return missing


def _unseen_pools(api: Any, namespace: str) -> list[str]:
    from kubernetes import client

    pools = client.CustomObjectsApi(api).list_namespaced_custom_object(
        claims.EXTENSIONS, claims.VERSION, namespace, claims.POOLS, label_selector=claims.LABEL_TEMPLATE,
        _request_timeout=DOCTOR_PROBE_SECONDS)["items"]
    return [p["metadata"]["name"] for p in pools
            if (p.get("status") or {}).get("observedGeneration") != p["metadata"].get("generation")]


def problems(api: Any, namespace: str) -> list[str]:
    """One line per thing that keeps the claim mode from working; [] when nothing does."""
    apis = _missing_apis(api)
    if apis:
        return [f"agent-sandbox's CRDs are not installed (the API server serves no {', '.join(apis)})"]
    found = []
    rights = _missing_rights(api, namespace)
    if rights:
        found.append(f"in namespace {namespace} the user may not {', '.join(rights)} "
                     "(docs/kubernetes-claims-role.yaml)")
    elif unseen := _unseen_pools(api, namespace):
        found.append(f"the warm pools {', '.join(unseen)} are not at their last generation: is agent-sandbox's "
                     "controller running with --extensions?")
    return found


def _box(obj: dict[str, Any], kind: str) -> ClaimBox:
    meta = obj["metadata"]
    ready, detail = claims.condition(obj, "Ready")
    if kind == "sandbox" and (obj.get("spec") or {}).get("operatingMode") == "Suspended":
        state = "suspended"
    elif ready == "True":
        state = "ready"
    else:
        state = f"not ready ({detail})" if detail else "not ready"
    return ClaimBox((meta.get("annotations") or {}).get(spec.ANNOTATION_AGENT, meta["name"]), meta["name"], kind, state)


def boxes(api: Any, namespace: str) -> list[ClaimBox]:
    """Every agent's claim and own Sandbox in namespace (objects labelled guilds.agent)."""
    from kubernetes import client

    custom, found = client.CustomObjectsApi(api), []
    with cluster.api_errors("list the claims", namespace):
        for group, plural, kind in ((claims.EXTENSIONS, claims.CLAIMS, "claim"),
                                    (claims.GROUP, claims.SANDBOXES, "sandbox")):
            items = custom.list_namespaced_custom_object(group, claims.VERSION, namespace, plural,
                                                         label_selector=spec.LABEL_AGENT)["items"]
            found += [_box(obj, kind) for obj in items]
    return found


def remove(api: Any, namespace: str, name: str) -> Iterator[str]:
    """Delete the agent's claim, home volume and own Sandbox (their pods go with them; the
    volume first, so that the Sandbox's garbage collection does not take it unnamed);
    yield each one deleted."""
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for kind, name_of, delete in (
            ("claim", name, lambda n: custom.delete_namespaced_custom_object(
                claims.EXTENSIONS, claims.VERSION, namespace, claims.CLAIMS, n)),
            ("volume claim", f"home-{name}", lambda n: core.delete_namespaced_persistent_volume_claim(n, namespace)),
            ("sandbox", name, lambda n: custom.delete_namespaced_custom_object(
                claims.GROUP, claims.VERSION, namespace, claims.SANDBOXES, n))):
        with cluster.api_errors(f"delete the {kind} {name_of}", namespace), cluster.ignoring(404):
            delete(name_of)
            yield f"{kind} {namespace}/{name_of}"


def remove_unused_template(api: Any, namespace: str, template: str, *, removed: str) -> Iterator[str]:
    """Delete the warm pool and the template of that name (the pool's waiting sandboxes go
    with it) unless an agent's claim or Sandbox of that template is left but the one
    named removed (being deleted); yield each one deleted."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    with cluster.api_errors(f"list the claims of the template {template}", namespace):
        for group, plural in ((claims.EXTENSIONS, claims.CLAIMS), (claims.GROUP, claims.SANDBOXES)):
            items = custom.list_namespaced_custom_object(
                group, claims.VERSION, namespace, plural,
                label_selector=f"{claims.LABEL_TEMPLATE}={template},{spec.LABEL_AGENT}")["items"]
            if any(item["metadata"]["name"] != removed for item in items):
                return
    for kind, plural in (("warm pool", claims.POOLS), ("sandbox template", claims.TEMPLATES)):
        with cluster.api_errors(f"delete the {kind} {template}", namespace), cluster.ignoring(404):
            custom.delete_namespaced_custom_object(claims.EXTENSIONS, claims.VERSION, namespace, plural, template)
            yield f"{kind} {namespace}/{template}"


def check(settings: AgentSettings, *, needed: bool) -> list[Check]:
    """Doctor's line on the claim mode: agent-sandbox installed, the rights, the controller."""
    namespace = settings.kubernetes.namespace
    try:
        found = problems(cluster.connect().api_client, namespace)
    except Exception as exc:  # noqa: BLE001 - the client's errors and the connection's alike: say which
        return [Check(NAME, False, f"cannot ask the cluster ({type(exc).__name__}: {exc})"[:300],
                      "check the kubeconfig's server and credentials", needed)]
    if found:
        return [Check(NAME, False, "; ".join(found), "install agent-sandbox with --extensions and bind "
                      "docs/kubernetes-claims-role.yaml (docs/sandboxes.md)", needed)]
    return [Check(NAME, True, f"agent-sandbox's APIs served, every right the claim mode needs in namespace "
                  f"{namespace}, the warm pools seen by its controller", needed=needed)]


def listed(settings: AgentSettings) -> list[Box]:
    namespace = settings.kubernetes.namespace
    return [Box("kubernetes", b.agent, f"{namespace}/{b.kind} {b.name}", b.state)
            for b in boxes(cluster.connect().api_client, namespace)]
