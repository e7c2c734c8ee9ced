"""The kubernetes backend without a cluster: its objects by equality, the file framing run
for real, exit statuses, pod phases, and error mapping against a local HTTP server.

Tests marked ``kubernetes`` need a cluster: they run where KUBECONFIG points at
one that can pull (or has) the sandbox image, and are skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import kube_kit
from guilds.config.settings import E2B_USER, AgentSettings, KubernetesSettings, Repo
from guilds.errors import SandboxError
from guilds.sandbox import _container as box_lib
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox
from guilds.sandbox.kubernetes.kube_user import with_user
from guilds.sandbox.sandbox_user import SUDO, users_texts
from guilds.toolbox.transport import call_helper
from kube_kit import no_pool_left  # noqa: F401 - a fixture of this module

CFG = KubernetesSettings(namespace="agents", image="reg/guilds:1", runtime_class="gvisor",
                         cpu="500m", memory="1Gi", service_account="guilds-none", home_size="5Gi")


def test_object_names_are_dns_labels_and_distinct():
    assert spec.object_name("agent1") == "guilds-agent1-" + spec.hashlib.sha256(b"agent1").hexdigest()[:8]
    names = {spec.object_name(a) for a in ("Web_1", "web-1", "web.1", "x" * 128)}
    assert len(names) == 4
    for name in names:
        assert len(name + "-home") <= 63 and spec.re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name)


def test_a_user_s_pod_gets_its_names_and_sudo_from_an_init_container_mounted_read_only():
    """kube_user.with_user: nothing without a user; with one, the init container runs as the
    sandbox does (same image, uid, limits) and the three files are read-only mounts."""
    pod = spec.pod_manifest(CFG, agent_id="a", home="/home/user", network=False, idle_seconds=600,
                            base_env={}, fingerprint="")
    assert with_user(pod["spec"], None) is pod["spec"]
    got = with_user(pod["spec"], E2B_USER)
    assert "initContainers" not in pod["spec"] and len(pod["spec"]["volumes"]) == 1  # a copy was changed
    sandbox, (init,) = got["containers"][0], got["initContainers"]
    assert (init["image"], init["securityContext"], init["resources"]) == (
        sandbox["image"], sandbox["securityContext"], sandbox["resources"])
    assert init["command"][:3] == ["python3", "-I", "-c"] and init["command"][4:] == [
        "/guilds-user", "user", "/home/user", "65532", "65532"]
    assert {"name": "guilds-user", "emptyDir": {"sizeLimit": "1Mi"}} in got["volumes"]
    mounts = {m["mountPath"]: m for m in sandbox["volumeMounts"] if m["name"] == "guilds-user"}
    assert {path: (m["subPath"], m["readOnly"]) for path, m in mounts.items()} == {
        "/etc/passwd": ("passwd", True), "/etc/group": ("group", True),
        "/usr/local/bin/sudo": ("sudo", True)}


def test_the_init_container_s_script_names_the_uid_as_users_texts_does(tmp_path, monkeypatch):
    """The script run for real over a copy of an image's files: what sandbox_user.users_texts gives."""
    base_passwd = ["root:x:0:0:root:/root:/bin/bash", "guilds:x:65532:65532:guilds agent:/nonexistent:/bin/sh",
                   "user:x:1000:1000::/home/old:/bin/sh", "nobody:x:65534:65534:nobody:/nonexistent:/bin/false"]
    base_group = ["root:x:0:", "guilds:x:65532:", "user:x:1000:", "nogroup:x:65534:"]
    init = with_user({"containers": [{"image": "i"}]}, E2B_USER)["initContainers"][0]
    script = init["command"][3].replace("/etc/passwd", str(tmp_path / "passwd")).replace(
        "/etc/group", str(tmp_path / "group"))
    (tmp_path / "passwd").write_text("\n".join(base_passwd) + "\n")
    (tmp_path / "group").write_text("\n".join(base_group) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {init["env"][0]["name"]: init["env"][0]["value"]}
    subprocess.run([sys.executable, "-I", "-c", script, str(out), *init["command"][5:]], env=env, check=True)
    assert ((out / "passwd").read_text(), (out / "group").read_text()) == users_texts(
        base_passwd, base_group, 65532, 65532, E2B_USER, "/bin/sh")
    assert (out / "sudo").read_text() == SUDO and (out / "sudo").stat().st_mode & 0o777 == 0o755


def test_pod_manifest():
    got = spec.pod_manifest(CFG, agent_id="Web_1", home="/home/agent", network=False, idle_seconds=600,
                            base_env={"HOME": "/home/agent", "PORT": "20000"}, fingerprint="f00")
    name = spec.object_name("Web_1")
    resources = {"cpu": "500m", "memory": "1Gi"}
    assert got == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "agents",
                     "labels": {"guilds.agent": name, "guilds.network": "off"},
                     "annotations": {"guilds/agent-id": "Web_1", "guilds/fingerprint": "f00"}},
        "spec": {
            "restartPolicy": "Never",
            "shareProcessNamespace": True,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "runtimeClassName": "gvisor",
            "serviceAccountName": "guilds-none",
            "containers": [{
                "name": "sandbox",
                "image": "reg/guilds:1",
                "command": ["python3", "-I", "-S", "-c", box_lib.INIT, "", "600", "0.25"],
                "workingDir": "/home/agent",
                "env": [{"name": "HOME", "value": "/home/agent"}, {"name": "PORT", "value": "20000"}],
                "envFrom": [{"secretRef": {"name": f"{name}-env"}}],
                "resources": {"requests": resources, "limits": resources},
                "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                                    "runAsUser": 65532, "runAsGroup": 65532,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [
                    {"name": "home", "mountPath": "/home/agent", "subPath": "home"},
                    {"name": "home", "mountPath": "/run/guilds", "subPath": "state"},
                ],
            }],
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": f"{name}-home"}}],
            "securityContext": {"fsGroup": 65532},
        },
    }
    plain = spec.pod_manifest(KubernetesSettings(), agent_id="a", home="/h", network=True,
                              idle_seconds=60, base_env={}, fingerprint="")
    assert "runtimeClassName" not in plain["spec"] and "serviceAccountName" not in plain["spec"]
    assert plain["metadata"]["labels"]["guilds.network"] == "on"


def test_the_images_helpers_are_checked_against_this_build():
    expected = {"/usr/local/bin/guilds-code": "aa", "/usr/local/bin/guilds-harness": "bb"}
    assert spec.helpers_check_argv(list(expected)) == ["sha256sum", "--", *expected]
    same = b"aa  /usr/local/bin/guilds-code\nbb  /usr/local/bin/guilds-harness\n"
    assert spec.helpers_mismatch(same, expected) == []
    assert spec.helpers_mismatch(b"aa  /usr/local/bin/guilds-code\ncc  /usr/local/bin/guilds-harness\n",
                                 expected) == ["/usr/local/bin/guilds-harness"]
    assert spec.helpers_mismatch(b"", expected) == list(expected)


def test_secret_claim_and_network_policy():
    name = spec.object_name("a")
    assert spec.secret_manifest(CFG, name, {"API_KEY": "v" * 12}) == {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": f"{name}-env", "namespace": "agents", "labels": {"guilds.agent": name}},
        "stringData": {"API_KEY": "v" * 12}}
    assert spec.claim_manifest(CFG, name)["spec"] == {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}}
    assert spec.network_policy_manifest("agents") == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "guilds-network-off", "namespace": "agents"},
        "spec": {"podSelector": {"matchLabels": {"guilds.network": "off"}},
                 "policyTypes": ["Ingress", "Egress"]}}


def test_per_call_variables_go_through_env():
    assert spec.with_env(["python3", "x"], {}) == ["python3", "x"]
    assert spec.with_env(["python3", "x"], {"A": "1"}) == ["env", "A=1", "python3", "x"]


def test_files_go_in_as_a_tar_on_stdin_then_renamed(tmp_path):
    files = [("state/a/repos.json", b'{"x": 1}', 0o600), ("bin/guilds-code", b"#!zip", 0o755)]
    staged = [(f"{n}.t1.tmp", d, m) for n, d, m in files]
    archive = box_lib.tar_bytes(staged, mtime=0)
    moves = [(str(tmp_path / s[0]), str(tmp_path / f[0])) for s, f in zip(staged, files, strict=True)]
    argv = spec.untar_argv(len(archive), moves, root=str(tmp_path))
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:5] == [str(len(archive)), str(tmp_path)]
    # More bytes than the archive on stdin: `head -c` stops at its end, stdin is never closed early.
    done = subprocess.run(argv, check=False, input=archive + b"x" * 5000, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    found = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert found == ["bin/guilds-code", "state/a/repos.json"]
    assert (tmp_path / "state/a/repos.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "bin/guilds-code").stat().st_mode & 0o777 == 0o755
    assert subprocess.run(spec.untar_argv(10, [], root=str(tmp_path)), check=False, input=b"not a tar",
                          capture_output=True, timeout=30).returncode != 0


@pytest.mark.parametrize("status, expected", [
    ('{"metadata":{},"status":"Success"}', (0, "")),
    ((b'{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":'
     b'[{"reason":"ExitCode","message":"137"}]},"message":"command terminated with non-zero exit code"}'),
     (137, "")),
    ('{"status":"Failure","message":"container not found (\\"sandbox\\")"}',
     (None, 'container not found ("sandbox")')),
    ("", (None, "no exit status from the exec")),
])
def test_exit_status(status, expected):
    assert spec.exit_status(status) == expected


def _pod(phase, *states):
    return {"status": {"phase": phase, "containerStatuses": [{"state": s} for s in states]}}


@pytest.mark.parametrize("pod, expected", [
    (_pod("Running", {"running": {}}), ("running", "")),
    (_pod("Pending", {"waiting": {"reason": "ContainerCreating"}}), ("pending", "ContainerCreating")),
    (_pod("Pending"), ("pending", "")),
    (_pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "pull x: not found"}}),
     ("image", "pull x: not found")),
    (_pod("Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed"}}), ("idle", "")),
    (_pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
     ("ended", "OOMKilled, exit code 137")),
    ({"status": {"phase": "Failed", "reason": "Evicted"}}, ("ended", "Evicted")),
])
def test_pod_phase(pod, expected):
    assert spec.pod_phase(pod) == expected


@pytest.mark.parametrize("status, body, expected", [
    (0, None, "kubernetes: read the pod: the cluster is not reachable (refused); check KUBECONFIG"),
    (403, '{"message":"pods is forbidden"}', ("kubernetes: read the pod: forbidden in namespace 'ns' "
     "(pods is forbidden); the orchestrator needs rights on pods, pods/exec, secrets, "
     "persistentvolumeclaims and networkpolicies there, and in claim mode on agent-sandbox's "
     "sandboxes, sandboxclaims, sandboxtemplates and sandboxwarmpools")),
    (404, '{"message":"namespaces \\"ns\\" not found"}',
     'kubernetes: read the pod: not found (namespaces "ns" not found)'),
    (422, '{"message":"bad quantity"}',
     "kubernetes: read the pod: the cluster refused the spec (bad quantity)"),
    (500, "not json", "kubernetes: read the pod: refused (HTTP 500)"),
])
def test_api_error_text(status, body, expected):
    assert spec.api_error_text("read the pod", status, "refused", body, "ns") == expected


# --- error mapping through the real client, against a local API server ----------
class _Forbidding(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                           "message": "pods \"x\" is forbidden: no rights"}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _client(host: str):
    from kubernetes import client

    config = client.Configuration()
    config.host = host
    config.retries = 0
    return client.ApiClient(config)


def _settings(tmp_path, **kw) -> AgentSettings:
    return AgentSettings(id="agent1", home=tmp_path / "home", sandbox="kubernetes",
                         kubernetes=KubernetesSettings(namespace="ns"), **kw)


async def test_forbidden_is_said_with_the_namespace(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forbidding)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = _client(f"http://127.0.0.1:{server.server_address[1]}")
    try:
        box = KubernetesSandbox(_settings(tmp_path), tmp_path / "data", api_client=api)
        with pytest.raises(SandboxError, match="kubernetes: read the pod: forbidden in namespace 'ns' "
                                               r'\(pods "x" is forbidden: no rights\)'):
            await box.start()
    finally:
        api.close()
        server.shutdown()
        server.server_close()


async def test_cluster_not_reachable(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the with ends: nothing listens there
    api = _client(f"http://127.0.0.1:{port}")
    try:
        box = KubernetesSandbox(_settings(tmp_path), tmp_path / "data", api_client=api)
        with pytest.raises(SandboxError, match="kubernetes: read the pod: the cluster is not reachable"):
            await box.start()
    finally:
        api.close()


async def test_a_secret_never_rides_the_command_line(tmp_path):
    box = KubernetesSandbox(_settings(tmp_path, secrets={"API_KEY": "k" * 16}), tmp_path / "data", api_client=object())
    with pytest.raises(SandboxError, match="a secret cannot travel as a per-call variable"):
        await box.exec(["true"], env={"X": "k" * 16}, timeout=5)


# --- with a cluster ----------------------------------------------------------------


@pytest.fixture(params=["pod", "claim"])
async def pod(request, tmp_path):
    """A started sandbox in each mode: a pod of its own, and a claim from a warm pool."""
    from dataclasses import replace

    from guilds.sandbox import get_sandbox

    kube = replace(kube_kit.SETTINGS, mode=request.param, cpu="200m", warm=1)
    settings = AgentSettings(id=f"t{secrets.token_hex(4)}", home=Path("/home/agent"), sandbox="kubernetes",
                             repos=(Repo("web", "repos/web", "ghp_token-4c8a9b0e"),), kubernetes=kube)
    box = get_sandbox(settings, tmp_path / "data")
    try:
        await box.start()
        yield box
    finally:
        await box.stop()
        if request.param == "claim":
            await asyncio.to_thread(kube_kit.remove_claimed, box.claim)
        else:
            await asyncio.to_thread(kube_kit.remove_agent, box.pod)


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_cluster_exec_files_and_the_helper(pod):
    result = await pod.exec(["bash", "-c", "echo $HOME; echo err >&2; exit 3"], timeout=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"/home/agent\n", b"err\n")
    timed = await pod.exec(["bash", "-c", "sleep 60"], timeout=1)
    assert timed.timed_out and timed.exit_code == -15
    await pod.write_file(f"{pod.state_dir}/requests/r1-c1.json", b"{}")
    listing = await pod.exec(["bash", "-c", "stat -c %a /run/guilds/requests/r1-c1.json"], timeout=30)
    assert listing.stdout == b"600\n"
    request = {"op": "shell", "args": {"command": "echo hi"}, "run_id": "r1", "agent_id": pod.agent_id,
               "call_id": "c1", "home": pod.home, "cwd": pod.home}
    assert (await call_helper(pod, request, wait=60))["text"] == "hi"


# --- the resident helper over pods/exec, against a local server speaking its framing --
@pytest.fixture
def built_helper(tmp_path):
    from guilds.sandbox.helpers import build_helper

    return str(build_helper(tmp_path / "helper" / "guilds-code"))


@pytest.mark.parametrize("server_protocols, spoken", [
    (["v5.channel.k8s.io", "v4.channel.k8s.io"], "v5.channel.k8s.io"),
    (["v4.channel.k8s.io"], "v4.channel.k8s.io"),
])
async def test_the_resident_helper_over_pods_exec(tmp_path, built_helper, server_protocols, spoken):
    import sys

    from guilds.sandbox.kubernetes import kube_cluster as cluster
    from guilds.sandbox.process_channel import KubeProcess
    from guilds.toolbox.resident_channel import ResidentChannel
    from kube_exec_server import ExecServer

    home, state = tmp_path / "home", tmp_path / "state"
    home.mkdir()
    state.mkdir()

    def run_as(command):  # the pod's helper path and python, as this machine has them
        env_args = list(command[1:command.index("python3")]) if command[0] == "env" else []
        rest = command[command.index("python3") + 1:]
        rest[rest.index("/usr/local/bin/guilds-code")] = built_helper
        return ["env", f"HOME={home}", f"GUILDS_STATE_DIR={state}", "PATH=/usr/bin:/bin", *env_args,
                sys.executable, *rest]

    server = ExecServer(server_protocols, run_as)
    api = _client(f"http://127.0.0.1:{server.port}")
    api.configuration.api_key = {"BearerToken": "tok-123"}
    api.configuration.api_key_prefix = {"BearerToken": "Bearer"}
    try:
        core = cluster.connect(api)
        command = spec.with_env(["python3", "-I", "-S", "/usr/local/bin/guilds-code", "serve"],
                                {"GUILDS_EXEC_ID": "t1"})
        ws = await asyncio.to_thread(cluster.open_exec, core, "pod-a", "ns", command)
        process = KubeProcess(ws)
        assert process.protocol == spoken
        seen = server.seen[0]
        assert seen["path"] == "/api/v1/namespaces/ns/pods/pod-a/exec"
        assert seen["query"]["command"] == command and seen["query"]["stdin"] == ["true"]
        assert seen["query"]["container"] == [spec.CONTAINER]
        assert seen["authorization"] == "Bearer tok-123"
        channel = ResidentChannel(process)
        await asyncio.to_thread(channel._hello_seen.wait, 30)
        request = {"op": "shell", "run_id": "r", "agent_id": "a", "home": str(home)}
        slow = asyncio.ensure_future(channel.call({**request, "call_id": "c1",
                                                   "args": {"command": "sleep 1.5; echo slow"}}, 30))
        fast = await channel.call(
            {**request, "call_id": "c2", "args": {"command": "echo fast; echo $GUILDS_EXEC_ID"}}, 30
        )
        assert fast["text"] == "fast\nt1" and not slow.done()
        assert (await slow)["text"] == "slow"
        big = "x" * 200_000  # frames longer than one websocket frame's 16-bit size
        echoed = await channel.call({**request, "call_id": "c3", "args": {"command": f"echo {big} | wc -c"}}, 30)
        assert echoed["text"] == "200001"
        await channel.close()
        proc = server.procs[0]
        assert await asyncio.to_thread(proc.wait, 10) == 0  # stdin ended: the server went
    finally:
        api.close()
        server.close()


@pytest.mark.parametrize("server_protocols, kill_execs", [
    (["v5.channel.k8s.io", "v4.channel.k8s.io"], 0),  # stdin closed alone: the exec is seen to end
    (["v4.channel.k8s.io"], 1),  # closing stdin closes the stream: a kill exec makes sure
])
async def test_the_sandbox_opens_its_process_over_pods_exec(tmp_path, built_helper, server_protocols, kill_execs):
    """KubernetesSandbox.open_process end to end: the pod read (running, same fingerprint),
    the exec websocket under a shell that, once the helper's stdin ends and it exits, ends
    what is left with its token; closing waits for that (v5), or makes a kill exec (v4). A
    background command carries no token: it outlives the exec, as it outlives its server."""
    import sys

    from guilds.toolbox.resident_channel import ResidentChannel
    from guilds.toolbox.transport import serve_argv
    from kube_exec_server import ExecServer

    home, state = tmp_path / "home", tmp_path / "state"
    home.mkdir()
    state.mkdir()
    mark = f"sleep 97.{secrets.randbelow(10**6)}"

    def run_as(command):  # the pod's python and helper path, as this machine has them
        mapped = [sys.executable if a == "python3" else built_helper if a == "/usr/local/bin/guilds-code" else a
                  for a in command]
        return ["env", f"HOME={home}", f"GUILDS_STATE_DIR={state}", "PATH=/usr/bin:/bin", *mapped]

    settings = AgentSettings(id="kres", home=home, sandbox="kubernetes", kubernetes=KubernetesSettings(namespace="ns"))
    probe = KubernetesSandbox(settings, tmp_path / "data", api_client=object())
    pod = probe._manifest()
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": "sandbox", "image": "guilds-sandbox:latest", "imageID": "sha256:0", "ready": True,
        "restartCount": 0, "state": {"running": {}}}]}
    server = ExecServer(server_protocols, run_as, {f"/api/v1/namespaces/ns/pods/{probe.pod}": pod})
    api = _client(f"http://127.0.0.1:{server.port}")
    try:
        box = KubernetesSandbox(settings, tmp_path / "data", api_client=api)
        channel = await ResidentChannel.open(box, serve_argv(box, 8))
        request = {"op": "shell", "run_id": "r", "agent_id": "kres", "call_id": "c1", "home": str(home),
                   "args": {"command": "echo over the websocket; echo $GUILDS_EXEC_ID"}}
        said = (await channel.call(request, 30))["text"].split("\n")
        assert said[0] == "over the websocket"
        command = next(s for s in server.seen if s["path"].endswith("/exec"))["query"]["command"]
        assert command[:2] == ["/bin/sh", "-c"] and f"GUILDS_EXEC_ID={said[1]}" in command
        started = await channel.call({**request, "call_id": "c2", "args": {"command": mark, "background": True}}, 30)
        assert "b1" in started["text"]
        assert await _seen(mark, running=True)
        await channel.close()
        kills = [s for s in server.seen if s["path"].endswith("/exec")][1:]
        assert len(kills) == kill_execs
        assert await asyncio.to_thread(server.procs[0].wait, 10) == 0
        await asyncio.sleep(0.5)
        assert await _seen(mark, running=True)  # a background command is the sandbox's: it outlives the exec
    finally:
        subprocess.run(["pkill", "-f", f"^{mark}$"], check=False)
        api.close()
        server.close()


async def _seen(args: str, *, running: bool, seconds: float = 10) -> bool:
    """Whether a process of exactly args is running (or not), within seconds."""
    deadline = time.monotonic() + seconds
    while True:
        found = bool(subprocess.run(["pgrep", "-f", f"^{args}$"], capture_output=True, check=False).stdout)
        if found == running or time.monotonic() > deadline:
            return found == running
        await asyncio.sleep(0.1)


# --- the fingerprint annotation, keyed --------------------------------------------------
FINGER_SECRET = "493817"
"""A secret of six digits: a million guesses, tried in seconds against an unkeyed hash."""


def _annotation(tmp_path: Path, data: str, secret: str) -> tuple[dict, str]:
    box = KubernetesSandbox(_settings(tmp_path, secrets={"PIN": secret}), tmp_path / data, api_client=object())
    pod = box._manifest()
    return pod, pod["metadata"]["annotations"][spec.ANNOTATION_FINGERPRINT]


def _unkeyed_guess(pod: dict, guess: str) -> str:
    """What a reader of the pod computes: the annotation's recipe with a guessed secret."""
    from guilds.sandbox._container import helpers_digest

    bare = json.loads(json.dumps(pod))
    bare["metadata"]["annotations"][spec.ANNOTATION_FINGERPRINT] = ""
    return box_lib.fingerprint([bare, {"PIN": guess}, helpers_digest()])


def test_the_fingerprint_cannot_be_recomputed_from_the_pod_and_the_secret(tmp_path):
    pod, stamp = _annotation(tmp_path, "data", FINGER_SECRET)
    guesses = {_unkeyed_guess(pod, guess) for guess in ("000000", "123456", FINGER_SECRET)}
    assert stamp not in guesses and stamp not in {g[:16] for g in guesses}
    assert _annotation(tmp_path, "data", FINGER_SECRET)[1] == stamp  # stable under the same key
    assert _annotation(tmp_path, "data", "493818")[1] != stamp  # a changed secret still changes it
    assert _annotation(tmp_path, "other-data", FINGER_SECRET)[1] != stamp  # another key, another stamp
    key = tmp_path / "data" / "kubernetes" / "fingerprint.key"
    assert len(key.read_bytes()) == 32 and key.stat().st_mode & 0o777 == 0o600
    assert key.parent.stat().st_mode & 0o777 == 0o700
    assert key.read_bytes().hex() not in json.dumps(pod)


KEY_RACE = """
import sys
from guilds.sandbox.kubernetes.kube_host import fingerprint_key
print(fingerprint_key(sys.argv[1]).hex())
"""


def test_processes_making_the_key_at_once_share_one(tmp_path):
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", KEY_RACE, str(tmp_path / "data")], stdout=subprocess.PIPE)
             for _ in range(8)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and all(p.returncode == 0 for p in procs)
    assert bytes.fromhex(keys.pop().decode()) == (tmp_path / "data" / "kubernetes" / "fingerprint.key").read_bytes()


def test_a_key_file_not_of_a_key_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "data" / "kubernetes"
    folder.mkdir(parents=True)
    (folder / "fingerprint.key").write_bytes(b"short")
    with pytest.raises(SandboxError, match=r"fingerprint\.key is not a key of 32 bytes; delete it"):
        _annotation(tmp_path, "data", FINGER_SECRET)
    (folder / "fingerprint.key").unlink()
    (folder / "fingerprint.key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SandboxError, match=r"cannot read .*fingerprint\.key"):
        _annotation(tmp_path, "data", FINGER_SECRET)


def test_a_starts_requests_share_one_connection_and_a_closed_one_is_taken_anew():
    """Wire.kept(): the requests in it go over one connection; one the server closed
    between two requests is replaced, the request answered; outside it, one each."""
    from guilds.sandbox.kubernetes.kube_wire import Wire

    peers: list[int] = []

    class Answer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            peers.append(self.client_address[1])
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            if self.path == "/close":
                self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(body)
            if self.path == "/drop":  # closed after answering, without saying so: as an idle timeout does
                self.close_connection = True

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wire = Wire(f"http://127.0.0.1:{server.server_port}", None, {})
        with wire.kept():
            assert [wire.request("GET", "/a"), wire.request("GET", "/b")] == [{"ok": True}] * 2
            assert wire.request("GET", "/close") == {"ok": True}  # the server ends it: the next takes another
            assert wire.request("GET", "/drop") == {"ok": True}
            time.sleep(0.2)
            assert wire.request("GET", "/c") == {"ok": True}  # the kept one is gone: once more, on a new one
        assert len(set(peers[:3])) == 1 and peers[3] != peers[2] and peers[4] != peers[3]
        assert [p for p in peers if p == peers[4]] == [peers[4]]  # /c's first try never reached the server
        wire.request("GET", "/d")
        wire.request("GET", "/e")
        assert len(set(peers)) == len(peers) - 2  # outside kept(): a connection each
    finally:
        server.shutdown()
        server.server_close()
