"""Checkpoints on kubernetes (guilds.sandbox.kubernetes.kube_volsnap): refused in one line
that names what the cluster lacks for a VolumeSnapshot of the home, asked of the real test
cluster (scripts/kube-test-env.sh, with ``--snapshots`` for the VolumeSnapshot API): when
the agent starts with ``agent.checkpoints = true``, for a named checkpoint through the
Python API, and in ``guilds doctor``'s checkpoints line. Claim mode is refused without
asking (its home is an emptyDir)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import guilds
import kube_kit
from guilds.config.settings import AgentSettings, KubernetesSettings, parse_settings
from guilds.errors import BadInput, ConfigError
from guilds.sandbox import checkpoints_refusal
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes import kube_volsnap as volsnap
from guilds.sandbox.kubernetes.kube_wire import Wire

ROOT = Path(__file__).resolve().parents[1]
GUILDS = shutil.which("guilds", path=os.path.dirname(sys.executable)) or "guilds"
HOME_CLASS = "guilds-local"
"""The test cluster's default StorageClass (scripts/kube-test-env.sh): local volumes."""
OTHER_DRIVER = "other.csi.guilds.test"
SNAP_DRIVER = "snap.csi.guilds.test"


def agent(tmp_path: Path, agent_id: str, **kube) -> AgentSettings:
    settings = AgentSettings(id=agent_id, home=tmp_path / "home", sandbox="kubernetes", checkpoints=True)
    return kube_kit.kube_settings(settings, **kube)


def test_settings_read_them_and_claim_mode_is_refused_naming_its_empty_dir(tmp_path, monkeypatch):
    parsed = parse_settings({"agent": {"sandbox": "kubernetes", "checkpoints": True}}, tmp_path, env={})
    assert parsed.checkpoints and parsed.sandbox == "kubernetes"
    claim = replace(parsed, kubernetes=KubernetesSettings(mode="claim"))
    assert checkpoints_refusal(claim) == (
        "agent.checkpoints: not served on kubernetes here: in claim mode the home is an emptyDir of the "
        "claimed pod, gone with it: no volume to snapshot")
    kept = replace(parsed, kubernetes=KubernetesSettings(mode="claim", keep_home=True))
    assert "made and mounted by the agent-sandbox controller" in str(checkpoints_refusal(kept))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert checkpoints_refusal(parsed) == ("agent.checkpoints: not served on kubernetes here: cannot ask the cluster: "
                                       "no kubeconfig (KUBECONFIG, ~/.kube/config)")


def test_a_refused_read_names_what_and_the_role():
    assert volsnap.refused_read("/apis/storage.k8s.io/v1/storageclasses", 403, "Forbidden") == (
        "the orchestrator's user may not read /apis/storage.k8s.io/v1/storageclasses "
        "(bind docs/kubernetes-checkpoints-role.yaml to it)")
    assert volsnap.refused_read("/apis", 0, "Connection refused") == "the cluster did not answer (Connection refused)"
    assert (ROOT / volsnap.ROLE).is_file()


# --- on the test cluster -----------------------------------------------------------------


def admin_apply(text: str) -> None:
    admin = Path(os.environ["KUBECONFIG"]).with_name("admin.kubeconfig")
    subprocess.run(["kubectl", "--kubeconfig", str(admin), "apply", "-f", "-"], input=text.encode(),
                   capture_output=True, timeout=60, check=True)


def storage_classes(driver: str, name: str) -> str:
    """A StorageClass of provisioner driver and a VolumeSnapshotClass of that driver, both name."""
    return (f"apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {{name: {name}}}\n"
            f"provisioner: {driver}\nvolumeBindingMode: Immediate\n---\n"
            f"apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotClass\nmetadata: {{name: {name}}}\n"
            f"driver: {driver}\ndeletionPolicy: Delete\n")


@pytest.fixture(scope="module")
def snapshot_api():
    """The VolumeSnapshot API served (its CRDs), and a VolumeSnapshotClass of a driver that
    is no StorageClass's provisioner but this module's."""
    subprocess.run(["bash", str(ROOT / "scripts/kube-test-env.sh"), "--snapshots"], capture_output=True,
                   timeout=300, check=True)
    admin_apply(storage_classes(OTHER_DRIVER, "guilds-test-other"))


def on_cluster(test):
    """A test on the test cluster with its VolumeSnapshot API (skipped, saying why, without one)."""
    for mark in (*kube_kit.needs_cluster, pytest.mark.usefixtures("snapshot_api")):
        test = mark(test)
    return test


def served_group(group: str) -> bool:
    wire = Wire.from_kubeconfig()
    assert wire is not None
    return volsnap.wire_get(wire)(f"/apis/{group}") is not None


@on_cluster
def test_no_snapshot_api_is_named():
    """A group the cluster does not serve stands where a cluster without the CRDs stands."""
    wire = Wire.from_kubeconfig()
    assert wire is not None
    group = "snapshot.absent.guilds.test"
    assert not served_group(group) and served_group(volsnap.SNAPSHOT_GROUP)
    why = volsnap.cluster_why(volsnap.wire_get(wire), kube_kit.NAMESPACE, "guilds-none-home", group=group)
    assert why == f"no VolumeSnapshot API (the API group {group} is not served: no snapshot CRDs installed)"


@on_cluster
async def test_an_agent_with_checkpoints_is_refused_at_its_start_naming_the_home_class(tmp_path):
    settings = agent(tmp_path, "kvs-start")
    line = (f"agent.checkpoints: not served on kubernetes here: no VolumeSnapshotClass for the home's storage "
            f"class \"{HOME_CLASS}\" (provisioner kubernetes.io/no-provisioner); the cluster's are for ")
    with pytest.raises(ConfigError) as refused:
        async with guilds.open(settings, data_dir=tmp_path / "data", env={}):
            pytest.fail("the agent started")
    assert str(refused.value).startswith(line) and OTHER_DRIVER in str(refused.value)
    off = replace(settings, checkpoints=False)
    async with guilds.open(off, data_dir=tmp_path / "data", env={}) as opened:
        with pytest.raises(BadInput) as named:
            await opened.checkpoint("before")
        assert str(named.value).startswith(line.replace("agent.checkpoints", "checkpoints"))
        assert opened.toolbox.checkpoints is None


@on_cluster
def test_a_claim_of_a_class_with_snapshots_is_said_and_still_refused(tmp_path):
    """The home's claim names a StorageClass whose provisioner has a VolumeSnapshotClass: the
    line names that class, and that checkpoints are not taken as VolumeSnapshots."""
    admin_apply(storage_classes(SNAP_DRIVER, "guilds-test-snap"))
    settings = agent(tmp_path, "kvs-snapclass")
    claim = f"{spec.object_name(settings.id)}-home"
    core = kube_kit.core()
    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "guilds-test-snap",
                     "resources": {"requests": {"storage": "1Gi"}}}}
    core.create_namespaced_persistent_volume_claim(kube_kit.NAMESPACE, body)
    try:
        assert volsnap.unserved_why(settings) == (
            "the cluster offers VolumeSnapshotClass \"guilds-test-snap\" for the home's storage class "
            f"\"guilds-test-snap\" (provisioner {SNAP_DRIVER}), but checkpoints are not taken as VolumeSnapshots")
    finally:
        core.delete_namespaced_persistent_volume_claim(claim, kube_kit.NAMESPACE)


@on_cluster
def test_doctor_names_it_and_fails_only_where_they_are_asked_for(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    table = "\n".join(f'{key} = "{value}"' for key, value in kube_kit.settings_table().items())
    for checkpoints, code in (("false", 0), ("true", 1)):
        path = tmp_path / f"{checkpoints}.toml"
        path.write_text(f'[agent]\nid = "kvs-doctor"\nhome = "home"\nsandbox = "kubernetes"\n'
                        f"checkpoints = {checkpoints}\n[kubernetes]\n{table}\n")
        done = subprocess.run([GUILDS, "doctor", "--config", str(path)], check=False, capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "GUILDS_DATA": str(tmp_path / "data")})
        line = next(x for x in done.stdout.splitlines() if x[5:].startswith("checkpoints:"))
        mark = "--" if checkpoints == "false" else "no"
        assert line.startswith(f"{mark:4} checkpoints: not served on kubernetes here: no VolumeSnapshotClass for "
                               f"the home's storage class \"{HOME_CLASS}\" (provisioner kubernetes.io/no-provisioner)")
        assert ("-> turn agent.checkpoints off" in line) == (checkpoints == "true")
        assert done.returncode == code, done.stdout


@on_cluster
def test_a_user_who_may_not_read_the_storage_classes_is_told_which_read_and_the_role(tmp_path, monkeypatch):
    """The agent-sandbox controller's user of the test cluster reads claims, not StorageClasses."""
    monkeypatch.setenv("KUBECONFIG", str(Path(os.environ["KUBECONFIG"]).with_name("agent-sandbox.kubeconfig")))
    assert volsnap.unserved_why(agent(tmp_path, "kvs-forbidden")) == (
        "the orchestrator's user may not read /apis/storage.k8s.io/v1/storageclasses "
        "(bind docs/kubernetes-checkpoints-role.yaml to it)")
