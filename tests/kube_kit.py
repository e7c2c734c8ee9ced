"""What the tests on a real cluster share: whether one answers, its settings, its node.

The cluster is the one KUBECONFIG names (scripts/kube-test-env.sh starts a
single-node one and exports KUBECONFIG, GUILDS_TEST_KUBE_IMAGE and
GUILDS_TEST_KUBE_NAMESPACE); the image must be on the node under a tag other
than ``latest`` (a ``latest`` tag is always pulled, and no registry is reachable).
Without a cluster that answers, the tests say why and are skipped.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from guilds.config.settings import AgentSettings, KubernetesSettings

IMAGE = os.environ.get("GUILDS_TEST_KUBE_IMAGE", "guilds-sandbox:kube-test")
NAMESPACE = os.environ.get("GUILDS_TEST_KUBE_NAMESPACE", "guilds-test")
CONTAINERD = os.environ.get("GUILDS_TEST_KUBE_CONTAINERD", "/tmp/guilds-kube/containerd/containerd.sock")
SETTINGS = KubernetesSettings(namespace=NAMESPACE, image=IMAGE, cpu="500m", memory="256Mi", home_size="1Gi")
SMALL_HOME = "32Mi"
"""The size of the sized-tmpfs volumes the test cluster keeps for the full-disk cases."""
POD_PIDS_LIMIT = 256
"""The test kubelet's podPidsLimit (scripts/kube-test-env.sh)."""


def _unavailable() -> str | None:
    if not os.environ.get("KUBECONFIG"):
        return "KUBECONFIG is not set (scripts/kube-test-env.sh starts a cluster)"
    try:
        from guilds.sandbox.kubernetes import kube_cluster

        kube_cluster.connect().list_namespaced_pod(NAMESPACE, limit=1, _request_timeout=5)
    except Exception as exc:  # noqa: BLE001 - any failure is the reason to skip
        return f"the cluster at KUBECONFIG does not answer ({type(exc).__name__}: {str(exc)[:200]})"
    return None


WHY = _unavailable()
needs_cluster = [pytest.mark.kubernetes, pytest.mark.skipif(WHY is not None, reason=f"kubernetes: {WHY}")]
PARAM = pytest.param("kubernetes", id="kubernetes", marks=needs_cluster)
CLAIM_PARAM = pytest.param("kubernetes-claim", id="kubernetes-claim", marks=needs_cluster)
"""The kubernetes backend in claim mode (a warm pool of 0: every test's home differs, so
each has a template of its own), for suites parametrized by backend name."""


def kube_settings(settings: AgentSettings, **kw: Any) -> AgentSettings:
    """settings on the test cluster: its namespace and image, a 1Gi home (kw: other keys)."""
    return replace(settings, sandbox="kubernetes", kubernetes=replace(SETTINGS, **kw))


def backend_settings(settings: AgentSettings) -> AgentSettings:
    """settings for the backend their ``sandbox`` names: kubernetes on the test cluster,
    kubernetes-claim in claim mode there; any other as they are."""
    if settings.sandbox == "kubernetes-claim":
        return kube_settings(settings, mode="claim", warm=0, cpu="200m")
    return kube_settings(settings) if settings.sandbox == "kubernetes" else settings


def settings_table(**kw: str) -> dict[str, str]:
    """SETTINGS as a ``[kubernetes]`` table of a settings document (kw: keys replaced)."""
    table = {"namespace": NAMESPACE, "image": IMAGE, "cpu": SETTINGS.cpu, "memory": SETTINGS.memory,
             "home_size": SETTINGS.home_size}
    return {**table, **kw}


def image_with_gh() -> str:
    """IMAGE with the host's gh (forge_kit.image_with_gh), imported into the node's containerd,
    tagged after IMAGE's id (a tag the node has seen is never taken for a newer build)."""
    import docker

    import forge_kit

    client = docker.from_env()
    base_id = client.images.get(IMAGE).id.split(":")[-1][:12]
    tag = f"{IMAGE.rsplit(':', 1)[0]}-gh:{base_id}"
    forge_kit.image_with_gh(IMAGE, tag)
    with tempfile.TemporaryFile() as said:
        ctr = subprocess.Popen(["ctr", "-a", CONTAINERD, "-n", "k8s.io", "images", "import", "-"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=said)
        assert ctr.stdin is not None
        try:
            for chunk in client.images.get(tag).save(named=tag):
                ctr.stdin.write(chunk)
        finally:
            ctr.stdin.close()
            client.close()
        if ctr.wait(300) != 0:
            said.seek(0)
            raise RuntimeError(f"ctr import of {tag}: {said.read().decode(errors='replace')}")
    return tag


def core() -> Any:
    from guilds.sandbox.kubernetes import kube_cluster

    return kube_cluster.connect()


def admin_kubectl(*args: str, timeout: float = 60) -> str:
    """kubectl with the cluster admin's kubeconfig beside the orchestrator's (for what the
    orchestrator's Role may not do: deleting a pod's container from the node, reading nodes)."""
    admin = Path(os.environ["KUBECONFIG"]).with_name("admin.kubeconfig")
    done = subprocess.run(["kubectl", "--kubeconfig", str(admin), "-n", NAMESPACE, *args],
                          capture_output=True, timeout=timeout, check=True)
    return done.stdout.decode()


def container_pid(pod: str) -> int:
    """The host pid of the sandbox container's first process, from containerd."""
    status = core().read_namespaced_pod(pod, NAMESPACE).status
    container_id = status.container_statuses[0].container_id.split("://", 1)[1]
    listing = subprocess.run(["ctr", "-a", CONTAINERD, "-n", "k8s.io", "tasks", "ls"],
                             capture_output=True, check=True, timeout=30).stdout.decode()
    for line in listing.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == container_id:
            return int(fields[1])
    raise LookupError(f"no task of container {container_id} in containerd")


REMOVE_WAIT_SECONDS = 120


def remove_agent(pod: str) -> None:
    """Delete an agent's pod, home claim and secret, and wait until the claim is gone (a
    claim still being deleted cannot be made again under its name)."""
    import time

    from kubernetes.client import ApiException

    api = core()
    for delete, name, kw in ((api.delete_namespaced_pod, pod, {"grace_period_seconds": 0}),
                             (api.delete_namespaced_persistent_volume_claim, f"{pod}-home", {}),
                             (api.delete_namespaced_secret, f"{pod}-env", {})):
        try:
            delete(name, NAMESPACE, **kw)
        except ApiException as exc:
            if exc.status != 404:
                raise
    deadline = time.monotonic() + REMOVE_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            api.read_namespaced_persistent_volume_claim(f"{pod}-home", NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.5)
    raise TimeoutError(f"the claim {pod}-home was not gone after {REMOVE_WAIT_SECONDS} s")


def templates_noted(base: Path) -> set[str]:
    """The templates the data folders under base noted as made (``kube_host``'s notes)."""
    return {note.stem for note in base.glob("**/kubernetes/templates/*.json")}


@pytest.fixture(scope="module", autouse=True)
def no_pool_left(tmp_path_factory):
    """Claim mode: the warm pools and templates this module's tests made (noted in their
    data folders, under this session's temporary folder) are deleted after them (their
    pods would hold the node's cpu); another process's are left to it."""
    base = tmp_path_factory.getbasetemp()
    before = templates_noted(base)
    yield
    made = sorted(templates_noted(base) - before)
    if WHY is None and made:
        for kind in ("sandboxwarmpools.extensions.agents.x-k8s.io", "sandboxtemplates.extensions.agents.x-k8s.io"):
            admin_kubectl("delete", kind, *made, "--ignore-not-found", "--wait=false")


def remove_claimed(name: str) -> None:
    """Delete a claim-mode agent's claim or own Sandbox (its pod goes with it) and its home
    volume, without waiting (the test volumes are few; a pool's sandbox is not kept)."""
    from kubernetes.client import ApiException

    for kind in ("sandboxclaims.extensions.agents.x-k8s.io", "sandboxes.agents.x-k8s.io"):
        admin_kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")
    try:
        core().delete_namespaced_persistent_volume_claim(f"home-{name}", NAMESPACE)
    except ApiException as exc:
        if exc.status != 404:
            raise


NODE_POD_ADDRESS = os.environ.get("GUILDS_TEST_KUBE_NODE_ADDRESS", "10.244.0.1")
"""The node's side of the test cluster's pod network: the bridge's address (scripts/kube-test-env.sh)."""
NODE_PORTS = range(30000, 32768)
"""The node-port range kube-router's policy controller leaves open on the node's addresses."""
PLAIN_POD_WAIT_SECONDS = 120


def plain_pod(name: str, argv: list[str]) -> str:
    """An unlabelled pod of the test image running argv as the image's agent uid, made with the
    orchestrator's rights; waits until it runs and answers its address (the caller deletes it)."""
    import time

    api = core()
    api.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "terminationGracePeriodSeconds": 0, "enableServiceLinks": False,
                 "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
                 "containers": [{"name": "main", "image": IMAGE, "command": argv,
                                 "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                                 "securityContext": {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}}]}})
    deadline = time.monotonic() + PLAIN_POD_WAIT_SECONDS
    while time.monotonic() < deadline:
        status = api.read_namespaced_pod(name, NAMESPACE).status
        if status.phase == "Running" and status.pod_ip:
            return str(status.pod_ip)
        time.sleep(0.5)
    raise TimeoutError(f"the pod {name} was not running after {PLAIN_POD_WAIT_SECONDS} s")


def delete_pod(name: str) -> None:
    from kubernetes.client import ApiException

    try:
        core().delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise
