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


def test_the_table_picks_each_modes_class_and_each_is_made(tmp_path):
    from guilds.sandbox import BACKENDS, backend, backends, candidates
    from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox

    made = {}
    for mode in ("pod", "claim"):
        settings = parse_settings({"agent": {"sandbox": "kubernetes"}, "kubernetes": {"mode": mode}}, tmp_path, env={})
        made[mode] = type(get_sandbox(settings, tmp_path / "data"))
        assert backend("kubernetes", settings) is made[mode] is candidates("kubernetes", settings)[0]
        assert dict(backends(settings))["kubernetes"] is made[mode]
    assert made == {"pod": KubernetesSandbox, "claim": KubeClaimSandbox}
    assert set(BACKENDS["kubernetes"]) == {"pod", "claim"}  # a class per mode, and no other
    assert backend("kubernetes") is KubernetesSandbox  # no settings: the default mode's
    assert KubeClaimSandbox.__mro__[1] is KubernetesSandbox.__mro__[1]  # siblings on one shallow base


def test_the_notes_are_private_and_a_bad_one_reads_as_none(tmp_path):
    from guilds.sandbox.kubernetes.kube_host import Notes

    note = Notes(tmp_path / "data", "agents", "a1")
    assert note.read() == {}
    note.write({"pod": "p1"})
    assert note.read() == {"pod": "p1"} and note.path.stat().st_mode & 0o777 == 0o600
    assert note.path.parent.stat().st_mode & 0o777 == 0o700
    note.path.write_text("[1, 2")
    assert note.read() == {}
    note.path.write_text("x" * 70_000)
    assert note.read() == {}
    assert note.forget() and not note.forget()
    note.path.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"pod": "theirs"}')
    with pytest.raises(SandboxError, match="cannot read"):
        note.read()


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
async def claimed(tmp_path):
    made: list[KubeClaimSandbox] = []

    async def _make(agent: str | None = None, idle_seconds: float | None = None, **kube) -> KubeClaimSandbox:
        box = get_sandbox(claim_settings(agent, **kube), tmp_path / "data", idle_seconds=idle_seconds)
        assert isinstance(box, KubeClaimSandbox)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        await asyncio.to_thread(kube_kit.remove_claimed, box.claim)


def template_name() -> str:
    return template_name_of(KubeClaimSandbox(claim_settings("x"), "/nonexistent"))


def template_name_of(box: KubeClaimSandbox) -> str:
    return str(box._template_manifest()["metadata"]["name"])


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
    changed = get_sandbox(claim_settings(box.agent_id, warm=1, memory="300Mi"), box.data_dir)
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
    said = removed.stdout.splitlines()
    assert said[1:3] == [f"removed volume claim {ns}/home-{box.claim}", f"removed sandbox {ns}/{box.claim}"]
    pool = template_name_of(box)  # left to another test's agent of that template, if one is still there
    assert set(said[3:]) <= {f"removed warm pool {ns}/{pool}", f"removed sandbox template {ns}/{pool}"}, said


NOTE_MEMORY = "236Mi"
"""A memory no other test asks for: the template and pool of the notes' test are its own."""


def claim_config(tmp_path: Path, agent: str, memory: str) -> Path:
    config = tmp_path / f"{agent}.toml"
    config.write_text(f'[agent]\nid = "{agent}"\nhome = "/home/agent"\nsandbox = "kubernetes"\n'
                      f'[kubernetes]\nnamespace = "{kube_kit.NAMESPACE}"\nimage = "{kube_kit.IMAGE}"\n'
                      f'mode = "claim"\nwarm = 1\ncpu = "{CLAIM_CPU}"\nmemory = "{memory}"\nhome_size = "1Gi"\n')
    return config


def echo_call(tmp_path: Path, config: Path, word: str, *python: str) -> subprocess.CompletedProcess:
    """`guilds call shell "echo word"` as a process of its own (python: its interpreter's options)."""
    import sys

    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, *python, "-m", "guilds.fronts.cli", "call", "shell",
                           json.dumps({"command": f"echo {word}"}), "--config", str(config)],
                          check=False, env=env, capture_output=True, timeout=300, text=True)
    assert done.returncode == 0 and word in done.stdout, (done.stdout, done.stderr[-2000:])
    return done


def gone(group: str, plural: str, name: str) -> bool:
    try:
        custom(group, plural, name)
    except Exception as exc:  # noqa: BLE001 - the client's 404
        return getattr(exc, "status", None) == 404
    return False


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
def test_a_later_process_starts_from_the_notes_and_trusts_no_deleted_claim_or_pod(tmp_path):
    agent = f"nt{secrets.token_hex(3)}"
    config, claim = claim_config(tmp_path, agent, NOTE_MEMORY), spec.object_name(agent)
    echo_call(tmp_path, config, "first")
    note = json.loads((tmp_path / "data" / "kubernetes" / "agents" / f"{agent}.json").read_text())
    pool = note["template"]
    try:
        # the template and pool noted: a later call neither reads nor makes them, nor loads the client
        kube_kit.admin_kubectl("delete", "sandboxwarmpools.extensions.agents.x-k8s.io", pool, "--wait=true")
        kube_kit.admin_kubectl("delete", "sandboxtemplates.extensions.agents.x-k8s.io", pool, "--wait=true")
        later = echo_call(tmp_path, config, "later", "-X", "importtime")
        assert "kubernetes.client" not in later.stderr and "kubernetes " not in later.stderr
        assert gone(claims.EXTENSIONS, claims.POOLS, pool) and gone(claims.EXTENSIONS, claims.TEMPLATES, pool)
        # the claim deleted behind the note (another orchestrator's stop): claimed anew, the
        # pool the note trusted made again once the claim says it is not found
        kube_kit.admin_kubectl("delete", "sandboxclaims.extensions.agents.x-k8s.io", claim, "--wait=true")
        echo_call(tmp_path, config, "reclaimed")
        renewed = json.loads((tmp_path / "data" / "kubernetes" / "agents" / f"{agent}.json").read_text())
        # a pod of the claim's own name may be made again: the pod is told apart by its uid
        assert renewed["uid"] != note["uid"] and renewed["pod_uid"] != note["pod_uid"]
        assert not gone(claims.EXTENSIONS, claims.POOLS, pool)
        # the pod deleted behind the note: not trusted either
        kube_kit.admin_kubectl("delete", "pod", renewed["pod"], "--wait=true")
        echo_call(tmp_path, config, "repodded")
        assert json.loads((tmp_path / "data" / "kubernetes" / "agents" / f"{agent}.json").read_text())[
            "pod_uid"] != renewed["pod_uid"]
    finally:
        guilds_cli(tmp_path, "sandbox", "rm", "--config", str(config))


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_a_noted_pod_is_taken_unread_and_a_stale_note_is_learned_anew(claimed, tmp_path, monkeypatch):
    """A later process (a new sandbox on the same data folder) execs on the noted pod with no
    request before it, by exec and by the resident helper; a pod without the secrets file
    (another made under the same name), a deleted pod and a deleted claim each fall back:
    the call runs, the note is learned anew."""
    from guilds.sandbox.kubernetes.kube_wire import Wire
    from guilds.toolbox.resident_channel import ResidentChannel
    from guilds.toolbox.transport import serve_argv

    first = await claimed(warm=1)
    seen: list[tuple[str, str]] = []
    request = Wire.request

    def spied(self, method, path, *args, **kwargs):
        seen.append((method, path))
        return request(self, method, path, *args, **kwargs)

    monkeypatch.setattr(Wire, "request", spied)
    note_path = tmp_path / "data" / "kubernetes" / "agents" / f"{first.agent_id}.json"

    def later() -> KubeClaimSandbox:
        return KubeClaimSandbox(first.settings, tmp_path / "data")

    async def secret_said(box: KubeClaimSandbox) -> str:
        result = await box.exec(["sh", "-c", 'echo "$C_SECRET"'], timeout=120)
        assert result.exit_code == 0, result
        return result.stdout.decode().strip()

    async def resident_says(box: KubeClaimSandbox, word: str) -> str:
        channel = await ResidentChannel.open(box, serve_argv(box, 4))
        try:
            request = {"op": "shell", "run_id": "r", "agent_id": box.agent_id, "call_id": word, "home": box.home,
                       "args": {"command": f"echo {word}"}}
            return str((await channel.call(request, 120))["text"])
        finally:
            await channel.close()

    assert await secret_said(later()) == SECRET and seen == []
    assert await resident_says(later(), "unread") == "unread" and seen == []
    pod_uid = json.loads(note_path.read_text())["pod_uid"]

    async def without_secrets_file() -> None:
        gone_file = await first.exec(["rm", claims.secrets_file(first.agent_id)], timeout=60)
        assert gone_file.exit_code == 0, gone_file

    for check in (secret_said, lambda box: resident_says(box, "again")):
        await without_secrets_file()
        seen.clear()
        assert await check(later()) in (SECRET, "again")
        assert ("GET", f"{first._objects(claims.EXTENSIONS, claims.CLAIMS)}/{first.claim}") in seen
        assert json.loads(note_path.read_text())["pod_uid"] == pod_uid  # the same pod, its files written again

    # the file gone under a sandbox that holds the pod as verified (no longer taken unread: in
    # one process a concurrent open may have found the note stale meanwhile): looked at again too
    await without_secrets_file()
    assert await secret_said(first) == SECRET

    kube_kit.admin_kubectl("delete", "pod", first.pod, "--wait=true")
    assert await secret_said(later()) == SECRET
    renewed = json.loads(note_path.read_text())
    assert renewed["pod_uid"] != pod_uid
    kube_kit.admin_kubectl("delete", "sandboxclaims.extensions.agents.x-k8s.io", first.claim, "--wait=true")
    kube_kit.admin_kubectl("wait", "--for=delete", f"pod/{renewed['pod']}", "--timeout=120s", timeout=150)
    assert await resident_says(later(), "reclaimed") == "reclaimed"
    assert json.loads(note_path.read_text())["uid"] != renewed["uid"]


RM_MEMORY = "232Mi"
"""A memory no other test asks for: the template and pool of this test's agent are its own."""


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
def test_rm_in_claim_mode_removes_the_claim_the_pool_and_the_template_and_names_each(tmp_path):
    ns, agent = kube_kit.NAMESPACE, f"rm{secrets.token_hex(3)}"
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "{agent}"\nhome = "/home/agent"\nsandbox = "kubernetes"\n'
                      f'[kubernetes]\nnamespace = "{ns}"\nimage = "{kube_kit.IMAGE}"\nmode = "claim"\n'
                      f'warm = 1\ncpu = "{CLAIM_CPU}"\nmemory = "{RM_MEMORY}"\nhome_size = "1Gi"\n')
    called = guilds_cli(tmp_path, "call", "shell", '{"command": "echo in-the-claim"}', "--config", str(config))
    assert called.returncode == 0 and "in-the-claim" in called.stdout, called.stderr
    claim = spec.object_name(agent)
    pool = json.loads((tmp_path / "data" / "kubernetes" / "agents" / f"{agent}.json").read_text())["template"]
    custom(claims.EXTENSIONS, claims.POOLS, pool)  # made by the call
    removed = guilds_cli(tmp_path, "sandbox", "rm", "--config", str(config))
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == [f"stopped the kubernetes sandbox of agent {agent}",
                                           f"removed claim {ns}/{claim}",
                                           f"removed warm pool {ns}/{pool}",
                                           f"removed sandbox template {ns}/{pool}"]
    for group, plural, name in ((claims.EXTENSIONS, claims.CLAIMS, claim), (claims.EXTENSIONS, claims.POOLS, pool),
                                (claims.EXTENSIONS, claims.TEMPLATES, pool)):
        with pytest.raises(Exception, match=r"Not Found|404"):
            custom(group, plural, name)
    assert not (tmp_path / "data" / "kubernetes" / "agents" / f"{agent}.json").exists()
    again = guilds_cli(tmp_path, "sandbox", "rm", "--config", str(config))
    assert again.stdout.splitlines() == [f"stopped the kubernetes sandbox of agent {agent}"], again.stdout


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
