"""The kubernetes backend on a real cluster: pods made, found and adopted, the resident
channel over pods/exec, timeouts, cancel, idle stop, lost calls, a full disk, the
sandbox commands, what the pod cannot do, and the network policy holding it in.

The cluster is the one KUBECONFIG names, reached as a user bound only to the Role of
docs/kubernetes-role.yaml (scripts/kube-test-env.sh makes both). Skipped, saying why,
where no cluster answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from guilds.config.settings import AgentSettings, Repo
from guilds.errors import SandboxError
from guilds.record.store import Store
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox
from guilds.sandbox.process_channel import DirectProcess
from guilds.toolbox import Toolbox
from guilds.toolbox.transport import call_helper
from kube_kit import (
    NAMESPACE,
    NODE_POD_ADDRESS,
    NODE_PORTS,
    SETTINGS,
    SMALL_HOME,
    admin_kubectl,
    container_pid,
    core,
    delete_pod,
    kube_settings,
    needs_cluster,
    plain_pod,
    remove_agent,
)

pytestmark = needs_cluster
TOKEN = "ghp_token-4c8a9b0e"
SECRET = "kube-secret-5e2a91"
TRAILER = "\nremaining_tool_calls: "


def agent_settings(agent: str | None = None, **kube) -> AgentSettings:
    plain = AgentSettings(id=agent or f"k{secrets.token_hex(4)}", home=Path("/home/agent"),
                          repos=(Repo("web", "repos/web", TOKEN),), secrets={"K_SECRET": SECRET})
    return kube_settings(plain, **kube)


@pytest.fixture
async def make(tmp_path):
    """make(agent=None, idle_seconds=None, **kubernetes settings) -> a started pod; removed at the end
    (pod, claim and secret: the test volumes are few)."""
    made: list[KubernetesSandbox] = []

    async def _make(agent: str | None = None, idle_seconds: float | None = None, **kube) -> KubernetesSandbox:
        box = KubernetesSandbox(agent_settings(agent, **kube), tmp_path / "data", idle_seconds=idle_seconds)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        await asyncio.to_thread(remove_agent, box.pod)


async def sh(box, script: str, timeout: float = 30):
    return await box.exec(["bash", "-c", script], timeout=timeout)


async def out(box, script: str, timeout: float = 30) -> str:
    result = await sh(box, script, timeout)
    assert result.exit_code == 0 and not result.timed_out, result
    return result.stdout.decode()


def shell(box, command: str, call: str, **args) -> dict:
    return {"op": "shell", "args": {"command": command, **args}, "run_id": "r1",
            "agent_id": box.agent_id, "call_id": call, "home": box.home, "cwd": box.home}


def pod_uid(box) -> str:
    return core().read_namespaced_pod(box.pod, NAMESPACE).metadata.uid


async def test_the_pod_runs_as_the_agent_with_no_token_and_no_route_out(make):
    box = await make()
    said = await out(box, "id -u; id -g; ls /var/run/secrets/kubernetes.io 2>&1 | head -1; "
                          "grep -c . /proc/net/route; awk 'NR>1 && $2==\"00000000\"' /proc/net/route | wc -l; "
                          "echo \"$K_SECRET\"; tr '\\0' ' ' </proc/1/cmdline")
    uid, gid, token, routes, default_routes, secret, init = said.splitlines()
    assert (uid, gid) == ("65532", "65532")
    assert "No such file or directory" in token  # automountServiceAccountToken: false
    assert int(routes) >= 1 and default_routes == "0"  # the pod's own subnet, no way out
    assert secret == SECRET  # from the Secret, through envFrom
    assert "pause" in init or init.startswith("python3 -I -S -c")  # a shared process namespace
    pod = core().read_namespaced_pod(box.pod, NAMESPACE)
    assert pod.spec.security_context.fs_group == 65532 and pod.metadata.labels[spec.LABEL_NETWORK] == "off"
    policy = admin_kubectl("get", "networkpolicy", spec.NETWORK_POLICY, "-o", "json")
    assert json.loads(policy)["spec"]["podSelector"] == {"matchLabels": {spec.LABEL_NETWORK: "off"}}
    home = await out(box, "stat -c %g ~; touch ~/x && echo writable; [ -w / ] || echo root-read-only")
    assert home.split("\n")[:3] == ["65532", "writable", "root-read-only"]  # the claim is the fsGroup's


LISTEN = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
while True:
    conn, _ = server.accept()
    conn.sendall(sys.argv[3].encode() + b"\\n")
    conn.close()
"""
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as conn:
        print(conn.recv(64).decode().strip())
except OSError as exc:
    print(type(exc).__name__)
"""
POD_PORT = 8080
POLICY_SETTLE_SECONDS = 60
"""How long the policy controller may take to write a new pod's rules."""


@pytest.fixture
def node_listener():
    """A listener of this process on the node's pod-network address: (port, what it answers)."""
    said = f"node-{secrets.token_hex(4)}"
    try:
        server = socket.create_server((NODE_POD_ADDRESS, 0))
    except OSError as exc:
        pytest.skip(f"the node's pod-network address {NODE_POD_ADDRESS} is not this host's ({exc})")
    port = server.getsockname()[1]
    assert port not in NODE_PORTS  # those the policy controller leaves open

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(said.encode() + b"\n")

    threading.Thread(target=serve, daemon=True).start()
    yield port, said
    server.close()


@pytest.fixture
def plain_pods():
    """plain_pods(kind, argv) -> (name, address) of an unlabelled pod (no policy selects it); deleted at the end."""
    names: list[str] = []

    async def _make(kind: str, argv: list[str]) -> tuple[str, str]:
        names.append(f"guilds-plain-{kind}-{secrets.token_hex(3)}")
        return names[-1], await asyncio.to_thread(plain_pod, names[-1], argv)

    yield _make
    for name in names:
        delete_pod(name)


async def from_agent(box, host: str, port: int) -> str:
    result = await box.exec(["python3", "-c", CONNECT, host, str(port)], timeout=30)
    assert result.exit_code == 0, result
    return result.stdout.decode().strip()


async def from_plain_pod(name: str, host: str, port: int) -> str:
    said = await asyncio.to_thread(admin_kubectl, "exec", name, "--", "python3", "-c", CONNECT, host, str(port))
    return said.strip()


async def test_the_network_policy_holds_an_agent_pod_in_and_not_an_unlabelled_one(make, plain_pods, node_listener):
    pod_said = f"pod-{secrets.token_hex(4)}"
    _, listener = await plain_pods("listener", ["python3", "-c", LISTEN, "0.0.0.0", str(POD_PORT), pod_said])
    control, _ = await plain_pods("control", ["sleep", "600"])
    box = await make()
    node_port, node_said = node_listener
    targets = {(listener, POD_PORT): pod_said, (NODE_POD_ADDRESS, node_port): node_said}
    assert await asyncio.to_thread(node_reads, listener, POD_PORT) == pod_said  # it listens
    for (host, port), said in targets.items():  # the positive control: the listeners answer an unlabelled pod
        assert await from_plain_pod(control, host, port) == said
    deadline = time.monotonic() + POLICY_SETTLE_SECONDS
    while await from_agent(box, listener, POD_PORT) == pod_said and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # the controller writes a new pod's rules a moment after it starts
    for host, port in targets:
        assert await from_agent(box, host, port) == "ConnectionRefusedError", (host, port)
    # Inward too: the agent's own listener answers the node (the kubelet's side), not another pod.
    await box.write_file(f"{box.home}/listen.py", LISTEN.encode())
    agent_said = f"agent-{secrets.token_hex(4)}"
    await out(box, f"setsid python3 ~/listen.py 0.0.0.0 {POD_PORT} {agent_said} >/dev/null 2>&1 </dev/null & echo")
    agent = core().read_namespaced_pod(box.pod, NAMESPACE).status.pod_ip
    assert await asyncio.to_thread(node_reads, agent, POD_PORT) == agent_said
    assert await from_plain_pod(control, agent, POD_PORT) == "ConnectionRefusedError"
    for (host, port), said in targets.items():  # and the control still reaches both: the policy, not the network
        assert await from_plain_pod(control, host, port) == said


def node_reads(host: str, port: int, wait: float = 30) -> str:
    """What a listener at host:port answers this process (the node), once it listens."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as conn:
                return conn.recv(64).decode().strip()
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


async def test_exec_exit_codes_timeouts_and_what_escaped(make):
    box = await make()
    result = await sh(box, "echo $HOME; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"/home/agent\n", b"err\n")
    began = time.monotonic()
    timed = await box.exec(["bash", "-c", "setsid sleep 99.5 & sleep 100"], timeout=1)
    assert timed.timed_out and timed.exit_code == -signal.SIGTERM
    assert time.monotonic() - began < 10
    assert "sleep 99.5" not in await out(box, "ps -eo args")


async def test_files_go_in_through_exec_and_the_helper_answers(make):
    box = await make()
    await box.write_file(f"{box.state_dir}/requests/r1-c1.json", b"{}")
    assert await out(box, "stat -c %a /run/guilds/requests/r1-c1.json") == "600\n"
    repos = json.loads(await out(box, f"cat {box.state_dir}/{box.agent_id}/repos.json"))
    assert repos == {"/home/agent/repos/web": TOKEN}
    assert (await call_helper(box, shell(box, "echo hi", "c1"), wait=60))["text"] == "hi"


async def test_found_again_by_a_second_orchestrator_and_stop(make):
    first = await make()
    await out(first, "setsid sleep 95.5 >/dev/null 2>&1 < /dev/null & echo started")
    uid = pod_uid(first)
    second = KubernetesSandbox(first.settings, first.data_dir)
    await second.start()
    assert "sleep 95.5" in await out(second, "ps -eo args") and pod_uid(second) == uid
    await second.stop()
    assert "sleep 95.5" not in await out(first, "ps -eo args")  # a new pod, the same home
    assert pod_uid(first) != uid


async def test_a_changed_spec_replaces_the_pod(make):
    box = await make()
    uid = pod_uid(box)
    changed = KubernetesSandbox(kube_settings(box.settings, memory="300Mi"), box.data_dir)
    await changed.start()
    assert pod_uid(changed) != uid


async def test_idle_stop_and_silent_restart(make):
    box = await make(idle_seconds=2)
    uid = pod_uid(box)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        phase = core().read_namespaced_pod(box.pod, NAMESPACE).status.phase
        if phase == "Succeeded":
            break
    assert phase == "Succeeded"
    box._ready = False  # as a new orchestrator process would: it looks at the pod first
    assert await out(box, "echo back") == "back\n"
    assert pod_uid(box) != uid


async def test_a_killed_pod_fails_the_call_in_flight_and_the_next_call_gets_a_new_one(make):
    box = await make()
    started = await call_helper(box, shell(box, "sleep 300", "c1", background=True), wait=60)
    assert started["ok"], started
    in_flight = asyncio.ensure_future(sh(box, "sleep 30; echo never", timeout=60))
    await asyncio.sleep(2)
    os.kill(container_pid(box.pod), signal.SIGKILL)
    ended = f"the sandbox pod {box.pod} ended .Error, exit code 137.; its running commands ended"
    with pytest.raises(SandboxError, match=ended):  # the call in flight: the pod ended under it
        await asyncio.wait_for(in_flight, 60)
    assert (await sh(box, "echo again")).stdout == b"again\n"  # the next call: a new pod
    status = await call_helper(box, {**shell(box, "", "c2"), "op": "shell_status", "args": {}}, wait=60)
    assert status["ok"] and " ended " in status["text"] + " ", status  # the claim kept its record


async def test_a_full_disk_is_said_and_loses_nothing(make):
    box = await make(home_size=SMALL_HOME)
    await out(box, "echo kept > ~/kept.txt")
    result = await sh(box, "head -c 64M /dev/zero > ~/fill", timeout=60)
    assert result.exit_code == 1 and b"No space left on device" in result.stderr
    with pytest.raises(SandboxError, match=r"No space left on device|no space left"):
        await box.write_file(f"{box.home}/more.json", b"x" * 300_000)
    envelope = await call_helper(box, shell(box, "echo hi", "c1"), wait=60)
    assert envelope["ok"] or "space" in envelope["error"].lower(), envelope
    assert await out(box, "cat ~/kept.txt; rm ~/fill") == "kept\n"
    assert (await call_helper(box, shell(box, "echo hi", "c2"), wait=60))["text"] == "hi"


@pytest.mark.parametrize("channel", ["exec", "direct"])
async def test_the_toolbox_on_the_resident_channel_over_pods_exec_v5(make, tmp_path, channel):
    """exec: the helper's frames on the pods/exec stream (v5); direct: on TCP to the pod's IP
    (``kube_direct``), the same calls, cancel and timeout."""
    box = await make(channel=channel)
    settings = box.settings
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        toolbox = Toolbox(kube_settings(settings).__class__(**{**settings.__dict__, "transport": "resident"}),
                          box, store)
        try:
            first = await toolbox.call("r1", "shell", {"command": "mkdir -p sub && cd sub && echo $K_SECRET"})
            assert first.text.split(TRAILER)[0] == "[REDACTED]\n[working directory now: ~/sub]"
            assert not first.is_error
            assert toolbox.transport.mode == "resident"
            process = toolbox.transport.channel._process
            if channel == "exec":
                assert process.protocol == "v5.channel.k8s.io"
            else:
                assert isinstance(process, DirectProcess)
                assert process.peer == core().read_namespaced_pod(box.pod, NAMESPACE).status.pod_ip
            assert (await toolbox.call("r1", "shell", {"command": "pwd"})).text.startswith("/home/agent/sub\n")
            await toolbox.call("r1", "shell", {"command": "printf 'a\\nb\\nneedle\\n' > f.txt"})
            read = await toolbox.call("r1", "file_read", {"path": "f.txt"})
            assert "needle" in read.text and not read.is_error
            found = await toolbox.call("r1", "code_search", {"pattern": "needle"})
            assert "f.txt" in found.text
            started = await toolbox.call("r1", "shell", {"command": "sleep 60", "background": True})
            assert "b1" in started.text
            stopped = await toolbox.call("r1", "shell_status", {"id": "b1", "stop": True})
            assert not stopped.is_error
            slow = asyncio.ensure_future(toolbox.call("r1", "shell", {"command": "sleep 77.7"}))
            await asyncio.sleep(2)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            deadline = time.monotonic() + 15
            while "sleep 77.7" in await out(box, "ps -eo args") and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert "sleep 77.7" not in await out(box, "ps -eo args")
            timed = await toolbox.call("r1", "shell", {"command": "sleep 30", "timeout_seconds": 1})
            assert "timed out" in timed.text or timed.is_error
        finally:
            await toolbox.close()


RACE = """
import asyncio, sys
from pathlib import Path
from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox
from guilds.config.settings import AgentSettings, KubernetesSettings

async def main():
    settings = AgentSettings(id=sys.argv[1], home=Path("/home/agent"), sandbox="kubernetes",
                             kubernetes=KubernetesSettings(namespace=sys.argv[2], image=sys.argv[3],
                                                           memory="256Mi", home_size="1Gi"))
    result = await KubernetesSandbox(settings, sys.argv[4]).exec(["sh", "-c", "echo ok-$(id -u)"], timeout=60)
    print(result.exit_code, result.stdout.decode().strip())

asyncio.run(main())
"""
PROCESSES = 8
ROUNDS = 3


@pytest.mark.slow
async def test_eight_processes_make_one_pod_at_once(make):
    box = await make()  # the agent whose pod the rounds delete and make again
    for round_ in range(ROUNDS):
        await box.stop()
        procs = [subprocess.Popen([sys.executable, "-c", RACE, box.agent_id, NAMESPACE, SETTINGS.image,
                                   str(box.data_dir)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(PROCESSES)]
        answers = [await asyncio.to_thread(p.communicate, timeout=240) for p in procs]
        said = [(p.returncode, o.decode().strip(), e.decode()[-400:]) for p, (o, e) in zip(procs, answers, strict=True)]
        assert all(code == 0 and text == "0 ok-65532" for code, text, _ in said), (round_, said)
        pods = core().list_namespaced_pod(NAMESPACE, label_selector=f"{spec.LABEL_AGENT}={box.pod}").items
        assert len(pods) == 1, (round_, [p.metadata.name for p in pods])


def guilds_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "guilds.fronts.cli", *args], check=False, env=env, capture_output=True,
                          timeout=300, text=True)


async def test_sandbox_list_stop_rm_and_doctor_through_the_cli(make, tmp_path):
    box = await make()
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "{box.agent_id}"\nhome = "/home/agent"\nsandbox = "kubernetes"\n'
                      f'[kubernetes]\nnamespace = "{NAMESPACE}"\nimage = "{SETTINGS.image}"\n'
                      f'memory = "256Mi"\nhome_size = "1Gi"\n')
    listed = guilds_cli(tmp_path, "sandbox", "list", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert [box.pod, f"{NAMESPACE}/{box.pod}", "running"] in [line.split()[1:] for line in listed.stdout.splitlines()]
    doctor = guilds_cli(tmp_path, "doctor", "--config", str(config))
    kube_line = next(line for line in doctor.stdout.splitlines() if "kubernetes" in line)
    assert kube_line.split()[1] == "ok" or kube_line.split()[0] == "ok" or " ok " in kube_line, doctor.stdout
    stopped = guilds_cli(tmp_path, "sandbox", "stop", "--config", str(config))
    assert stopped.returncode == 0, stopped.stderr
    removed = guilds_cli(tmp_path, "sandbox", "rm", "--config", str(config))
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[1:] == [f"removed claim {NAMESPACE}/{box.pod}-home",
                                               f"removed secret {NAMESPACE}/{box.pod}-env"]
    left = core().list_namespaced_pod(NAMESPACE, label_selector=f"{spec.LABEL_AGENT}={box.pod}").items
    assert left == [] or all(p.metadata.deletion_timestamp for p in left)
