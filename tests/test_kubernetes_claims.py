"""The kubernetes backend's claim mode (kubernetes-sigs/agent-sandbox): its objects by
equality, the secrets file loaded by a real shell, and on a cluster (tests marked
``kubernetes``) a claim adopting a warm pool's sandbox, no secret value in the claim,
sandbox or template objects, stop giving the sandbox back, and an agent's own Sandbox
suspended and resumed with its home and its background commands' logs kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

import kube_kit
from guilds.config.settings import AgentSettings, KubernetesSettings, Repo, parse_settings
from guilds.errors import ConfigError, SandboxError
from guilds.sandbox import _container as box_lib
from guilds.sandbox import get_sandbox
from guilds.sandbox.kubernetes import kube_claim_spec as claims
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes.kube_claims import KubeClaimSandbox
from guilds.toolbox.transport import call_helper
from kube_kit import no_pool_left  # noqa: F401 - a fixture of this module

CFG = KubernetesSettings(namespace="agents", image="reg/guilds:1", runtime_class="gvisor", cpu="500m",
                         memory="1Gi", home_size="5Gi", mode="claim", warm=3)
SECRET = "claim-secret-7d3b1f"
TOKEN = "ghp_token-9a1c0e7d"


def _template(**kw):
    return claims.template_manifest(CFG, home="/home/agent", network=False, base_env={"HOME": "/home/agent"},
                                    helpers="h1", **kw)


def test_the_template_is_todays_pod_without_an_agents_own():
    template = _template()
    pod = spec.pod_manifest(CFG, agent_id="x", home="/home/agent", network=False, idle_seconds=60,
                            base_env={"HOME": "/home/agent"}, fingerprint="")
    got, want = template["spec"]["podTemplate"]["spec"], pod["spec"]
    container, pod_container = got["containers"][0], want["containers"][0]
    assert "envFrom" not in container and container["env"] == [{"name": "HOME", "value": "/home/agent"}]
    assert container["securityContext"] == pod_container["securityContext"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"},
                                      "limits": {"cpu": "500m", "memory": "1Gi"}}
    assert got["runtimeClassName"] == "gvisor" and got["automountServiceAccountToken"] is False
    assert got["volumes"] == [{"name": "home", "emptyDir": {"sizeLimit": "5Gi"}}]
    assert container["command"] == box_lib.init_argv("python3", claims.NO_IDLE_SECONDS)
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"
    name = template["metadata"]["name"]
    assert template["spec"]["podTemplate"]["metadata"]["labels"] == {"guilds.network": "off", "guilds.template": name}


def test_the_template_is_named_by_its_spec_and_shared_by_agents_alike():
    assert _template()["metadata"]["name"] == _template()["metadata"]["name"]
    other_image = claims.template_manifest(KubernetesSettings(image="reg/guilds:2", mode="claim"), home="/home/agent",
                                           network=False, base_env={}, helpers="h1")
    other_helpers = claims.template_manifest(CFG, home="/home/agent", network=False,
                                             base_env={"HOME": "/home/agent"}, helpers="h2")
    names = {t["metadata"]["name"] for t in (_template(), other_image, other_helpers)}
    assert len(names) == 3


def test_pool_claim_and_own_sandbox():
    template = _template()
    name = template["metadata"]["name"]
    assert claims.warm_pool_manifest(template, 3)["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": name}}
    claim = claims.claim_manifest("agents", "Web_1", name)
    assert claim["metadata"]["name"] == spec.object_name("Web_1")
    assert claim["metadata"]["annotations"] == {"guilds/agent-id": "Web_1"}
    assert claim["spec"] == {"warmPoolRef": {"name": name}} and claims.pool_of(claim) == name
    own = claims.own_sandbox_manifest(CFG, template, "Web_1", 600)
    assert own["spec"]["podTemplate"]["spec"]["containers"][0]["command"] == box_lib.init_argv("python3", 600)
    assert own["spec"]["podTemplate"]["spec"]["volumes"] == []  # the controller adds home-<name>
    assert own["spec"]["volumeClaimTemplates"][0]["metadata"] == {"name": "home"}
    assert own["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] == {"requests": {"storage": "5Gi"}}
    assert own["spec"]["podTemplate"]["metadata"]["labels"]["guilds.agent"] == spec.object_name("Web_1")
    assert template["spec"]["podTemplate"]["spec"]["volumes"]  # the template itself is left as it was


@pytest.mark.parametrize("claim, bound", [
    ({}, ""),
    ({"status": {"sandbox": {"name": "s1"}}}, ""),
    ({"status": {"sandbox": {"name": "s1"}, "conditions": [{"type": "Ready", "status": "False"}]}}, ""),
    ({"status": {"sandbox": {"name": "s1"}, "conditions": [{"type": "Ready", "status": "True"}]}}, "s1"),
])
def test_bound_sandbox(claim, bound):
    assert claims.bound_sandbox(claim) == bound


def test_pod_of_a_sandbox():
    assert claims.pod_of({"metadata": {"name": "s1"}}) == "s1"
    assert claims.pod_of({"metadata": {"name": "s1", "annotations": {"agents.x-k8s.io/pod-name": "p9"}}}) == "p9"


def test_the_secrets_file_is_loaded_by_a_real_shell(tmp_path):
    value = "it's $HOME `id` \"q\"\nline2"
    text = claims.secrets_text({"API_KEY": value, "B": ""})
    agent = "a1"
    path = Path(claims.secrets_file(agent))
    argv = claims.loaded_argv(agent, ["sh", "-c", 'printf "%s|%s" "$API_KEY" "${B-unset}"'])
    assert argv[3] == str(path)
    local = tmp_path / "secrets.env"
    local.write_bytes(text)
    argv[3] = str(local)
    done = subprocess.run(argv, capture_output=True, check=True)
    assert done.stdout.decode() == f"{value}|"
    argv[3] = str(tmp_path / "missing.env")
    missing = subprocess.run(argv, capture_output=True, check=False)
    assert missing.returncode == 126 and b"has no environment file" in missing.stderr
    with pytest.raises(SandboxError, match="not a variable name"):
        claims.secrets_text({"A-B": "x"})


def test_settings_mode_warm_keep_home(tmp_path):
    got = parse_settings({"agent": {"sandbox": "kubernetes"},
                          "kubernetes": {"mode": "claim", "warm": 5, "keep_home": True}}, tmp_path, env={})
    assert (got.kubernetes.mode, got.kubernetes.warm, got.kubernetes.keep_home) == ("claim", 5, True)
    assert isinstance(get_sandbox(got, tmp_path), KubeClaimSandbox)
    assert parse_settings({}, tmp_path, env={}).kubernetes.mode == "pod"
    with pytest.raises(ConfigError, match=r"kubernetes\.mode: must be one of pod, claim"):
        parse_settings({"kubernetes": {"mode": "pool"}}, tmp_path, env={})
    with pytest.raises(ConfigError, match=r"kubernetes\.warm"):
        parse_settings({"kubernetes": {"warm": -1}}, tmp_path, env={})


# --- on a cluster ----------------------------------------------------------------------
CLAIM_CPU = "100m"


def claim_settings(agent: str | None = None, **kube) -> AgentSettings:
    plain = AgentSettings(id=agent or f"c{secrets.token_hex(4)}", home=Path("/home/agent"),
                          repos=(Repo("web", "repos/web", TOKEN),), secrets={"C_SECRET": SECRET})
    return kube_kit.kube_settings(plain, mode="claim", cpu=CLAIM_CPU, **kube)


def custom(group: str, plural: str, name: str) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(kube_kit.core().api_client).get_namespaced_custom_object(
        group, claims.VERSION, kube_kit.NAMESPACE, plural, name)


def ready_replicas(pool: str) -> int:
    try:
        return int((custom(claims.EXTENSIONS, claims.POOLS, pool).get("status") or {}).get("readyReplicas") or 0)
    except Exception:  # noqa: BLE001 - not made yet
        return 0


async def wait_pool(pool: str, replicas: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while ready_replicas(pool) < replicas:
        assert time.monotonic() < deadline, f"the warm pool {pool} has not {replicas} ready sandboxes"
        await asyncio.sleep(0.5)


@pytest.fixture
async def claimed():
    made: list[KubeClaimSandbox] = []

    async def _make(agent: str | None = None, idle_seconds: float | None = None, **kube) -> KubeClaimSandbox:
        box = get_sandbox(claim_settings(agent, **kube), "/nonexistent", idle_seconds=idle_seconds)
        assert isinstance(box, KubeClaimSandbox)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        await asyncio.to_thread(kube_kit.remove_claimed, box.claim)


def template_name() -> str:
    settings = claim_settings("x")
    box = KubeClaimSandbox(settings)
    return claims.template_manifest(settings.kubernetes, home=box.home, network=False, base_env=box._base_env,
                                    helpers=box_lib.helpers_digest())["metadata"]["name"]


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_a_new_agent_adopts_a_warm_sandbox_and_no_secret_is_in_any_object(claimed):
    first = await claimed(warm=1)  # makes the template and the pool (cold, or warm when the pool was there)
    pool = template_name()
    await wait_pool(pool, 1)
    before = time.time()
    box = await claimed(warm=1)
    sandbox = custom(claims.GROUP, claims.SANDBOXES, custom(claims.EXTENSIONS, claims.CLAIMS, box.claim)
                     ["status"]["sandbox"]["name"])
    assert sandbox["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"
    pod = kube_kit.core().read_namespaced_pod(box.pod, kube_kit.NAMESPACE)
    assert pod.metadata.creation_timestamp.timestamp() < before  # made by the pool before the claim
    assert pod.metadata.labels["guilds.network"] == "off"
    said = (await box.exec(["sh", "-c", 'echo "$C_SECRET"; id -u; stat -c %a "$0"',
                            claims.secrets_file(box.agent_id)], timeout=30)).stdout.decode().split()
    assert said == [SECRET, "65532", "600"]
    repos = await box.exec(["cat", f"{box.state_dir}/{box.agent_id}/repos.json"], timeout=30)
    assert json.loads(repos.stdout) == {"/home/agent/repos/web": TOKEN}
    objects = [custom(claims.EXTENSIONS, claims.CLAIMS, box.claim), sandbox,
               custom(claims.EXTENSIONS, claims.TEMPLATES, pool), custom(claims.EXTENSIONS, claims.POOLS, pool),
               kube_kit.core().api_client.sanitize_for_serialization(pod)]
    for obj in objects:
        text = json.dumps(obj)
        assert SECRET not in text and TOKEN not in text, obj.get("kind", obj)
    assert first.pod != box.pod


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_stop_gives_the_sandbox_back_and_the_next_call_claims_another(claimed):
    box = await claimed(warm=1)
    old = box.pod
    await box.stop()
    with pytest.raises(Exception):  # noqa: B017 - the claim is gone, whatever the client says
        custom(claims.EXTENSIONS, claims.CLAIMS, box.claim)
    assert (await box.exec(["echo", "back"], timeout=60)).stdout == b"back\n"
    assert box.pod != old


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_a_changed_spec_claims_from_the_new_pool(claimed):
    box = await claimed(warm=1)
    old = box.pod
    changed = get_sandbox(claim_settings(box.agent_id, warm=1, memory="300Mi"), "/nonexistent")
    await changed.start()
    assert changed.pod != old
    assert custom(claims.EXTENSIONS, claims.CLAIMS, box.claim)["spec"]["warmPoolRef"]["name"] != template_name()


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_an_own_sandbox_is_suspended_and_resumed_with_its_home_and_logs(claimed):
    box = await claimed(keep_home=True, warm=1)
    await box.exec(["sh", "-c", "echo kept > ~/kept.txt"], timeout=30)
    request = {"op": "shell", "args": {"command": "echo started; sleep 300", "background": True},
               "run_id": "r1", "agent_id": box.agent_id, "call_id": "c1", "home": box.home, "cwd": box.home}
    started = await call_helper(box, request, wait=60)
    assert started["ok"], started
    first_pod_uid = kube_kit.core().read_namespaced_pod(box.pod, kube_kit.NAMESPACE).metadata.uid
    await box.stop()
    sandbox = custom(claims.GROUP, claims.SANDBOXES, box.claim)
    assert sandbox["spec"]["operatingMode"] == "Suspended"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the controller deletes the pod
        pods = kube_kit.core().list_namespaced_pod(kube_kit.NAMESPACE, label_selector=f"guilds.agent={box.claim}")
        if not pods.items:
            break
        await asyncio.sleep(0.5)
    assert not pods.items
    kube_kit.core().read_namespaced_persistent_volume_claim(f"home-{box.claim}", kube_kit.NAMESPACE)  # kept
    assert (await box.exec(["cat", "/home/agent/kept.txt"], timeout=120)).stdout == b"kept\n"
    assert kube_kit.core().read_namespaced_pod(box.pod, kube_kit.NAMESPACE).metadata.uid != first_pod_uid
    status = await call_helper(box, {**request, "op": "shell_status", "args": {}, "call_id": "c2"}, wait=60)
    assert status["ok"] and " ended " in status["text"] + " ", status
    assert "started" in status["text"], status


def test_what_the_sandbox_commands_say_of_a_claim_or_an_own_sandbox():
    from guilds.sandbox.kubernetes.kube_claim_admin import ClaimBox, _box

    meta = {"name": "guilds-a-1", "annotations": {"guilds/agent-id": "a"}}
    ready = {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert _box(ready, "claim") == ClaimBox("a", "guilds-a-1", "claim", "ready")
    waiting = {"metadata": {"name": "n"}, "status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "WarmPoolNotFound", "message": "no pool"}]}}
    assert _box(waiting, "claim") == ClaimBox("n", "n", "claim", "not ready (WarmPoolNotFound: no pool)")
    suspended = {**ready, "spec": {"operatingMode": "Suspended"}}
    assert _box(suspended, "sandbox").state == "suspended"


def guilds_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    import sys

    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "guilds.fronts.cli", *args], check=False, env=env,
                          capture_output=True, timeout=300, text=True)


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_sandbox_list_stop_rm_and_doctor_know_claims(claimed, tmp_path):
    box = await claimed(keep_home=True, warm=1)
    ns = kube_kit.NAMESPACE
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "{box.agent_id}"\nhome = "/home/agent"\nsandbox = "kubernetes"\n'
                      f'[kubernetes]\nnamespace = "{ns}"\nimage = "{kube_kit.IMAGE}"\nmode = "claim"\n'
                      f'keep_home = true\nwarm = 1\ncpu = "{CLAIM_CPU}"\nmemory = "256Mi"\nhome_size = "1Gi"\n')
    doctor = guilds_cli(tmp_path, "doctor", "--config", str(config))
    claim_line = next(line for line in doctor.stdout.splitlines() if "kubernetes claims" in line)
    assert claim_line.startswith("ok"), doctor.stdout
    listed = guilds_cli(tmp_path, "sandbox", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert any(line.split()[:2] == ["kubernetes", box.agent_id] and f"{ns}/sandbox {box.claim}" in line
               and line.endswith(" ready") for line in listed.stdout.splitlines()), listed.stdout
    stopped = guilds_cli(tmp_path, "sandbox", "stop", "--config", str(config))
    assert stopped.returncode == 0, stopped.stderr
    listed = guilds_cli(tmp_path, "sandbox", "list", "--config", str(config))
    assert any(f"{ns}/sandbox {box.claim}" in line and line.endswith("suspended")
               for line in listed.stdout.splitlines()), listed.stdout
    removed = guilds_cli(tmp_path, "sandbox", "rm", "--config", str(config))
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[1:] == [f"removed sandbox {ns}/{box.claim}",
                                               f"removed volume claim {ns}/home-{box.claim}"]


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
def test_doctor_says_which_claim_rights_are_missing():
    from kubernetes import config as kube_config

    from guilds.sandbox.kubernetes import kube_claim_admin

    admin = kube_config.new_client_from_config(str(Path(os.environ["KUBECONFIG"]).with_name("admin.kubeconfig")))
    assert kube_claim_admin.problems(admin, "default") == []  # the admin: every right, the APIs served
    orchestrator = kube_kit.core().api_client
    found = kube_claim_admin.problems(orchestrator, "default")  # bound in the test namespace only
    assert len(found) == 1 and "may not get sandboxtemplates.extensions.agents.x-k8s.io" in found[0], found


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_an_own_sandbox_idle_stop_and_silent_resume(claimed):
    box = await claimed(keep_home=True, warm=1, idle_seconds=2)
    await box.exec(["sh", "-c", "echo kept > ~/kept.txt"], timeout=30)
    first = box.pod
    uid = kube_kit.core().read_namespaced_pod(first, kube_kit.NAMESPACE).metadata.uid
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        phase = kube_kit.core().read_namespaced_pod(first, kube_kit.NAMESPACE).status.phase
        if phase == "Succeeded":
            break
    assert phase == "Succeeded"  # INIT's idle stop
    box._ready = False  # as a new orchestrator process would: it looks at the pod first
    assert (await box.exec(["cat", "/home/agent/kept.txt"], timeout=120)).stdout == b"kept\n"
    assert kube_kit.core().read_namespaced_pod(box.pod, kube_kit.NAMESPACE).metadata.uid != uid
    assert custom(claims.GROUP, claims.SANDBOXES, box.claim)["spec"]["operatingMode"] == "Running"
