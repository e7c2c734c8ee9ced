"""``kubernetes.channel = "direct"`` on the test cluster (``kube_direct``, ``guilds_code.direct``):
the helper's channel on TCP to the pod's IP, and what cannot get it: a connection from inside
the pod with another token, another agent's pod, a token looked for in everything the pod can
read; the channel's end ending the helper; the exec's stream kept when no connection is made.
The calls themselves on it: tests/test_kubernetes_cluster.py (the toolbox on each channel)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from guilds.config.settings import AgentSettings
from guilds.record.store import Store
from guilds.sandbox._container import HELPER_DIR
from guilds.sandbox.kubernetes import kube_direct
from guilds.sandbox.kubernetes.kube_pod import KubePodSandbox
from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox
from guilds.sandbox.process_channel import DirectProcess, KubeProcess
from guilds.toolbox import Toolbox
from kube_kit import NAMESPACE, NODE_POD_ADDRESS, admin_kubectl, core, kube_settings, needs_cluster, remove_agent

pytestmark = needs_cluster
TRAILER = "\nremaining_tool_calls: "
CONNECT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
    s.sendall(sys.argv[3].encode() + b"\\n")
    s.settimeout(float(sys.argv[4]))
    print("answer", s.recv(200))
except OSError as exc:
    print("no connection", type(exc).__name__)
"""
"""In a pod: connect to address:port, name a token, print what comes back."""
LISTENING = ("python3 -I -S -c \"print(sum(line.split()[3] == '0A' for name in ('/proc/net/tcp', '/proc/net/tcp6') "
             "for line in open(name).readlines()[1:]))\"")
"""In a pod: how many TCP sockets listen in its network namespace."""
FIND = """
import os, sys
token = sys.argv[1][::-1].encode()  # given reversed: no argv holds it
places = [f"/proc/{p}/{n}" for p in os.listdir("/proc") if p.isdigit() for n in ("cmdline", "environ")]
for top in ("/run", "/tmp", "/home", "/etc"):
    places += [os.path.join(d, f) for d, _, files in os.walk(top) for f in files]
for place in places:
    try:
        with open(place, "rb") as fh:
            if token in fh.read(1 << 24):
                print(place)
    except OSError:
        pass
"""
"""In a pod: every process's argv and environment, and every file it may keep, that hold
the token given (reversed)."""


@pytest.fixture
async def agents(tmp_path):
    """agents(network=False) -> (sandbox, toolbox) of a new agent on the direct channel;
    all closed and removed at the end."""
    made: list[tuple[KubernetesSandbox, Toolbox]] = []
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:

        async def _agent(network: bool = False) -> tuple[KubernetesSandbox, Toolbox]:
            plain = AgentSettings(id=f"d{secrets.token_hex(4)}", home=Path("/home/agent"), network=network,
                                  transport="resident")
            settings = kube_settings(plain, channel="direct")
            box = KubernetesSandbox(settings, tmp_path / "data")
            toolbox = Toolbox(settings, box, store)
            made.append((box, toolbox))
            await box.start()
            return box, toolbox

        yield _agent
        for box, toolbox in made:
            await toolbox.close()
            await box.stop()
            await asyncio.to_thread(remove_agent, box.pod)


async def shell(toolbox: Toolbox, command: str) -> str:
    result = await toolbox.call("r1", "shell", {"command": command})
    assert not result.is_error, result.text
    return result.text.split(TRAILER)[0]


def pod_ip(box: KubernetesSandbox) -> str:
    return str(core().read_namespaced_pod(box.pod, NAMESPACE).status.pod_ip)


def offered(box: KubernetesSandbox) -> tuple[KubeProcess, int]:
    """A resident helper started in box's pod with its channel offered and not taken: its
    exec, and the port its hello names."""
    argv = [box.python, "-I", "-S", f"{HELPER_DIR}/guilds-code", "serve"]
    process = KubePodSandbox._open_process(box, kube_direct.offering(argv))
    assert isinstance(process, KubeProcess)
    hello = json.loads(process.first_line(time.monotonic() + 30) or b"{}")
    assert isinstance(hello.get("direct"), int), hello
    return process, hello["direct"]


async def test_the_channel_is_a_connection_to_the_pod_and_its_policy_admits_this_host_only(agents):
    box, toolbox = await agents()
    assert await shell(toolbox, "echo over tcp") == "over tcp"
    process = toolbox.transport.channel._process
    assert isinstance(process, DirectProcess) and process.peer == pod_ip(box)
    policy = json.loads(admin_kubectl("get", "networkpolicy", kube_direct.policy_name(box.pod), "-o", "json"))
    pod = core().read_namespaced_pod(box.pod, NAMESPACE)
    assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [pod.metadata.uid]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"guilds.agent": box.pod}}
    assert policy["spec"]["ingress"] == [{"from": [{"ipBlock": {"cidr": f"{NODE_POD_ADDRESS}/32"}}],
                                          "ports": [{"protocol": "TCP"}]}]


async def test_no_listener_is_left_and_the_token_is_nowhere_the_pod_reads(agents, monkeypatch):
    tokens: list[str] = []

    def token_hex(n: int) -> str:
        tokens.append(secrets.token_hex(n))
        return tokens[-1]

    monkeypatch.setattr(kube_direct, "secrets", SimpleNamespace(token_hex=token_hex))
    box, toolbox = await agents()
    assert await shell(toolbox, "echo up") == "up"
    assert len(tokens) == 1 and isinstance(toolbox.transport.channel._process, DirectProcess)
    assert await shell(toolbox, LISTENING) == "0"  # the helper's listener closed once its connection was taken
    found = await box.exec(["python3", "-I", "-S", "-c", FIND, tokens[0][::-1]], timeout=60)
    assert found.exit_code == 0 and found.stdout == b"", found


async def test_another_token_from_inside_and_another_agents_pod_get_no_channel(agents):
    box, _ = await agents()
    intruder, _ = await agents(network=True)  # no deny-all of its own: only the victim's policy stands
    process, port = offered(box)
    process.send(json.dumps({"v": 1, "direct": "ab" * 32}).encode() + b"\n")  # as the orchestrator does
    try:
        inside = await box.exec(["python3", "-I", "-S", "-c", CONNECT, "127.0.0.1", str(port), "0" * 64, "3"],
                                timeout=30)
        assert inside.stdout.decode().strip() == "answer b''", inside  # closed, no hello
        beside = await intruder.exec(["python3", "-I", "-S", "-c", CONNECT, pod_ip(box), str(port), "0" * 64, "2"],
                                     timeout=30)
        assert beside.stdout.decode().startswith("no connection"), beside  # the victim's policy drops it
        said = await box.exec(["python3", "-I", "-S", "-c", CONNECT, "127.0.0.1", str(port), "ab" * 32, "3"],
                              timeout=30)
        assert '"hello"' in said.stdout.decode()  # the token sent on stdin is what opens it
    finally:
        process.close()


async def test_the_channels_end_ends_the_helper_and_a_killed_helper_is_replaced(agents):
    box, toolbox = await agents()
    assert await shell(toolbox, "echo up") == "up"
    await toolbox.close()
    deadline = time.monotonic() + 20
    while "guilds-code serve" in (left := (await box.exec(["ps", "-eo", "args"], timeout=30)).stdout.decode()):
        assert time.monotonic() < deadline, left
        await asyncio.sleep(0.3)
    assert await shell(toolbox, "echo again") == "again"
    channel = toolbox.transport.channel
    server = channel.pid
    await box.exec(["kill", "-9", str(server)], timeout=30)
    deadline = time.monotonic() + 20
    while not channel.dead:  # its connection's end, seen by the reader
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert await shell(toolbox, "echo after") == "after"  # the channel's end seen, a new one opened
    assert toolbox.transport.channel.pid != server


async def test_no_connection_keeps_the_exec_stream(agents, monkeypatch, caplog):
    box, toolbox = await agents()
    monkeypatch.setattr(kube_direct, "KUBERNETES_DIRECT_SECONDS", 1.0)
    monkeypatch.setattr(box, "_direct_address", lambda: NODE_POD_ADDRESS)  # nothing of the pod's there
    with caplog.at_level(logging.WARNING):
        assert await shell(toolbox, "echo on the exec") == "on the exec"
    assert isinstance(toolbox.transport.channel._process, KubeProcess)
    assert "stays on the exec" in caplog.text and NODE_POD_ADDRESS in caplog.text
    assert await shell(toolbox, LISTENING) == "0"
