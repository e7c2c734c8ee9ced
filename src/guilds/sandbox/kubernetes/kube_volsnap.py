"""Whether a kubernetes agent's home could be kept as a VolumeSnapshot, asked of the cluster.

A checkpoint on kubernetes would be a VolumeSnapshot of the home's claim
(``<name>-home``), which needs the cluster's snapshot API
(``snapshot.storage.k8s.io``, the CRDs of kubernetes-csi's external-snapshotter) and
a VolumeSnapshotClass whose ``driver`` is the provisioner of the claim's
StorageClass. ``unserved_why(settings)`` asks the cluster, in this order, and
names the first thing missing:

- claim mode: the home is an emptyDir of a pooled pod (or, with ``keep_home``, a
  claim the agent-sandbox controller makes and mounts): refused without asking;
- the home's StorageClass: the claim's ``storageClassName`` when the claim is
  there, else the cluster's default StorageClass;
- the snapshot API group, through discovery;
- a VolumeSnapshotClass for that StorageClass's provisioner.

Where all of these are there, the line says that the cluster offers them and
that checkpoints are not taken as VolumeSnapshots: none is served on kubernetes.
The StorageClasses and VolumeSnapshotClasses are cluster-wide: reading them needs
docs/kubernetes-checkpoints-role.yaml bound to the orchestrator's user.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ...config.settings import AgentSettings
from ...errors import SandboxError
from . import kube_spec as spec
from .kube_wire import Wire, WireError

SNAPSHOT_GROUP = "snapshot.storage.k8s.io"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ROLE = "docs/kubernetes-checkpoints-role.yaml"

Get = Callable[[str], "dict[str, Any] | None"]
"""A GET of an API path: its JSON, None when it is not there (404)."""


def claim_mode_why(settings: AgentSettings) -> str | None:
    """Why claim mode serves no checkpoint (pure); None in pod mode."""
    kube = settings.kubernetes
    if kube.mode != "claim":
        return None
    if kube.keep_home:
        return ("in claim mode the kept home's claim is made and mounted by the agent-sandbox controller "
                "(a Sandbox's volumeClaimTemplates), which would have to restart the sandbox on a restored one")
    return "in claim mode the home is an emptyDir of the claimed pod, gone with it: no volume to snapshot"


def _is_default(storage_class: dict[str, Any]) -> bool:
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return annotations.get(DEFAULT_CLASS) == "true"


def home_class(get: Get, namespace: str, claim: str) -> tuple[str, str] | str:
    """(the home's StorageClass, its provisioner), or why there is none."""
    found = get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    name = ((found or {}).get("spec") or {}).get("storageClassName")
    if found is not None and not name:
        return f"the home's claim {claim} has no storage class (a volume bound by hand)"
    if name:
        storage_class = get(f"/apis/storage.k8s.io/v1/storageclasses/{name}")
        if storage_class is None:
            return f'the home\'s storage class "{name}" does not exist'
    else:
        listed = (get("/apis/storage.k8s.io/v1/storageclasses") or {}).get("items") or []
        defaults = [c for c in listed if _is_default(c)]
        if not defaults:
            return "the cluster has no default StorageClass for the home's claim"
        storage_class = defaults[0]
        name = storage_class["metadata"]["name"]
    return name, str(storage_class.get("provisioner") or "")


def snapshot_why(get: Get, storage_class: str, provisioner: str, group: str = SNAPSHOT_GROUP) -> str:
    """What the cluster lacks to snapshot a volume of storage_class, or what it offers."""
    if get(f"/apis/{group}") is None:
        return f"no VolumeSnapshot API (the API group {group} is not served: no snapshot CRDs installed)"
    classes = (get(f"/apis/{group}/v1/volumesnapshotclasses") or {}).get("items") or []
    fitting = sorted(c["metadata"]["name"] for c in classes if c.get("driver") == provisioner)
    if not fitting:
        others = sorted({str(c.get("driver")) for c in classes})
        besides = f"; the cluster's are for {', '.join(others)}" if others else ""
        return (f'no VolumeSnapshotClass for the home\'s storage class "{storage_class}" '
                f"(provisioner {provisioner}){besides}")
    return (f'the cluster offers VolumeSnapshotClass "{fitting[0]}" for the home\'s storage class '
            f'"{storage_class}" (provisioner {provisioner}), but checkpoints are not taken as VolumeSnapshots')


def cluster_why(get: Get, namespace: str, claim: str, group: str = SNAPSHOT_GROUP) -> str:
    """Why the home of claim in namespace is not checkpointed, as the cluster answers."""
    found = home_class(get, namespace, claim)
    if isinstance(found, str):
        return found
    return snapshot_why(get, *found, group=group)


class Unreadable(Exception):
    """A read the cluster refused or did not answer; its message is the reason."""


def refused_read(path: str, status: int, reason: str) -> str:
    """The reason for a read of path the cluster refused (status 0: it did not answer; pure)."""
    if status == 0:
        return f"the cluster did not answer ({reason})"
    if status in (401, 403):
        return f"the orchestrator's user may not read {path} (bind {ROLE} to it)"
    return f"reading {path} failed: {status} {reason}"


def wire_get(wire: Wire) -> Get:
    """A Get on wire: 404 is None; any other refusal raises Unreadable."""

    def get(path: str) -> dict[str, Any] | None:
        try:
            return wire.request("GET", path)
        except WireError as exc:
            if exc.status == 404:
                return None
            raise Unreadable(refused_read(path, exc.status, exc.reason)) from exc

    return get


def connect_wire(namespace: str) -> Wire:
    """The kubeconfig's cluster as a Wire (else the kubernetes client's configuration, in a
    pod too); Unreadable when there is none."""
    from . import kube_admin, kube_cluster

    wire = Wire.from_kubeconfig()
    if wire is not None:
        return wire
    if kube_admin.kubeconfig_path() is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise Unreadable("cannot ask the cluster: no kubeconfig (KUBECONFIG, ~/.kube/config)")
    try:
        with kube_cluster.api_errors("load the kubeconfig", namespace):
            return Wire.from_configuration(kube_cluster.connect().api_client.configuration)
    except SandboxError as exc:
        raise Unreadable(f"cannot ask the cluster ({str(exc).removeprefix('kubernetes: ')})") from exc


def unserved_why(settings: AgentSettings, wire: Wire | None = None) -> str:
    """Why the agent's checkpoints are not served on kubernetes here, in a few words
    (asks the cluster in pod mode; blocking)."""
    why = claim_mode_why(settings)
    if why is not None:
        return why
    namespace = settings.kubernetes.namespace
    try:
        wire = wire or connect_wire(namespace)
        with wire.kept():
            return cluster_why(wire_get(wire), namespace, f"{spec.object_name(settings.id)}-home")
    except Unreadable as exc:
        return str(exc)
