"""agent.network a list on the kubernetes sandbox: what the pod is given (no cluster
needed), then on the test cluster, as an attacker inside the pod would try: a name
resolving to the host's loopback, a direct connection to another pod or the node,
another agent's port and credential, the proxy killed, and the repository token
looked for in everything the pod reads and in every object of the namespace.

The push and pull request through the proxy on kubernetes is test_egress_e2e's
(its ``kubernetes`` parameter). The cluster's policy controller (kube-router,
scripts/kube-test-env.sh) enforces the policies.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import socket
import time
from pathlib import Path

import pytest

import forge_kit
import kube_kit
from guilds.config.settings import AgentSettings, parse_settings
from guilds.errors import SandboxError
from guilds.sandbox.base import keep_egress
from guilds.sandbox.egress_side.proxy_process import proxy_pid
from guilds.sandbox.kubernetes import kube_egress
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes.kube_sandbox import KubernetesSandbox
from test_kubernetes_cluster import CONNECT, LISTEN, POD_PORT, from_plain_pod, node_listener, plain_pods

__all__ = ["node_listener", "plain_pods"]  # fixtures used here
TOKEN = "ghp_kubeEgressToken0123456789abcdef"
UPLOAD = "upload-secret-9f3e7a"
PLAIN = "plain-secret-41b7"
HOME = "/home/agent"


def settings_of(tmp_path: Path, *, agent: str = "", forge=None, **kube: str) -> AgentSettings:
    host = forge_kit.HOST_NAME
    data = {
        "agent": {"id": agent or f"kx{secrets.token_hex(4)}", "home": HOME, "sandbox": "kubernetes",
                  "network": [host, "loop.test", *([forge.subnet] if forge else [])]},
        "secrets": {"PLAIN": PLAIN, "UPLOAD": {"value": UPLOAD, "hosts": [host]}},
        "repos": {"work": {"path": "repos/work", "token": forge.token if forge else TOKEN, "token_hosts": [host]}},
        "egress": {"resolve": {host: forge.address if forge else "10.9.9.9", "loop.test": "127.0.0.1"}},
        "kubernetes": kube_kit.settings_table(**kube),
    }
    return parse_settings(data, tmp_path, env={})


# --- what the pod is given ------------------------------------------------------------

def test_the_pod_its_secret_and_repos_json_hold_placeholders_and_the_relay_speaks_tcp(tmp_path):
    box = KubernetesSandbox(settings_of(tmp_path), api_client=object(), data_dir=tmp_path / "data")
    pod = box._manifest()
    assert TOKEN not in json.dumps(pod) and UPLOAD not in json.dumps(pod)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert env["SSL_CERT_FILE"] == env["GIT_SSL_CAINFO"] == kube_egress.bundle_path(box.agent_id)
    assert len(env["UPLOAD"]) == len(UPLOAD) and env["UPLOAD"] != UPLOAD and "PLAIN" not in env
    assert pod["metadata"]["labels"][spec.LABEL_NETWORK] == "off"  # the deny-all policy holds it from its start
    assert kube_egress.RELAY_TCP in container["command"][4]
    assert container["command"][-2:] == [kube_egress.relay_conf(box.agent_id), "3128"]
    assert box.egress is not None and box.egress.pod_secrets() == {"PLAIN": PLAIN}
    [(_, repos, _)] = box._repos_files()
    entry = json.loads(repos)[f"{HOME}/repos/work"]  # forge.test is no github.com: gh is told the host
    assert TOKEN not in repos.decode() and entry["gh_host"] == forge_kit.HOST_NAME and len(entry["token"]) == len(TOKEN)


def test_the_policy_opens_the_proxys_port_and_nothing_else():
    policy = kube_egress.policy_manifest("ns", "guilds-a-1", "10.244.0.1", 41234, owner="u-1")
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {spec.LABEL_AGENT: "guilds-a-1"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.244.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 41234}]}]}
    assert policy["metadata"]["name"] == "guilds-a-1-egress-41234"
    assert policy["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "guilds-a-1",
                                                      "uid": "u-1"}]  # deleted with the pod by the cluster
    assert kube_egress.policy_manifest("ns", "p", "fd00::1", 1, owner="u")["spec"]["egress"][0]["to"] == [
        {"ipBlock": {"cidr": "fd00::1/128"}}]


def test_a_repository_token_names_its_hosts_on_kubernetes(tmp_path):
    data = {"agent": {"id": "k1", "home": HOME, "sandbox": "kubernetes", "network": ["github.com"]},
            "repos": {"web": {"path": "web", "token": TOKEN}}}
    with pytest.raises(SandboxError, match=r"^repos.web.token_hosts: needed on kubernetes with agent.network a list"):
        KubernetesSandbox(parse_settings(data, tmp_path, env={}), api_client=object(), data_dir=tmp_path)


def _probe_here(argv: list[str]) -> str:
    """PROBE run on this host, where nothing holds it in: what a pod of a cluster that enforces
    no policy would say."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def test_the_check_refuses_a_pod_that_reaches_more_than_its_proxy(tmp_path, monkeypatch):
    monkeypatch.setattr(kube_egress, "KUBERNETES_EGRESS_SETTLE_SECONDS", 2)
    box = KubernetesSandbox(settings_of(tmp_path), api_client=object(), data_dir=tmp_path / "data")
    assert box.egress is not None
    with socket.create_server(("127.0.0.1", 0)) as proxy:
        port = proxy.getsockname()[1]
        with pytest.raises(SandboxError, match=r"^kubernetes: the pod \S+ reached a port of 127.0.0.1 that its "
                                               "network policy does not allow: this cluster does not enforce "
                                               "NetworkPolicy"):
            box.egress.check_held("127.0.0.1", port, _probe_here)  # the canary answered


# --- on the test cluster ---------------------------------------------------------------

NO_HOSTS = forge_kit.unavailable()
cluster = [*kube_kit.needs_cluster, pytest.mark.skipif(NO_HOSTS is not None, reason=str(NO_HOSTS))]
FETCH = ("import sys, time, urllib.request as u\n"
         "began = time.monotonic()\n"
         "try: print(u.urlopen(sys.argv[1], timeout=20).status)\n"
         "except u.HTTPError as e: print(e.code, e.read().decode())\n"
         "except Exception as e: print(type(e).__name__)\n"
         "print(round(time.monotonic() - began, 1))\n")
"""Fetch argv[1] through the proxy variables: the status (and body of an error) or why not, then the seconds."""
ASK = ("import socket, sys\n"
       "try:\n"
       "    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as c:\n"
       "        c.sendall(b'GUILDS-EGRESS ' + sys.argv[3].encode() + b'\\n' + sys.argv[4].encode() + b'\\r\\n\\r\\n')\n"
       "        print(c.recv(200).decode().split('\\r\\n')[0] or 'closed')\n"
       "except OSError as exc:\n"
       "    print(type(exc).__name__)\n")
"""Connect to argv[1]:argv[2] with the credential argv[3] and the request line argv[4]: the answer's first line."""


def on_cluster(test):
    for mark in cluster:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def forge(tmp_path_factory):
    host = forge_kit.ForgeHost(tmp_path_factory.mktemp("forge"))
    try:
        yield host.open()
    finally:
        host.close()


@pytest.fixture
async def make(forge, tmp_path, monkeypatch):
    """make() -> a started kubernetes sandbox behind the proxy (its own data folder); removed at the end."""
    monkeypatch.setenv("SSL_CERT_FILE", forge.ca)  # the proxy verifies the forge by the test authority
    made: list[KubernetesSandbox] = []

    async def _make() -> KubernetesSandbox:
        data = tmp_path / f"data{len(made)}"
        box = KubernetesSandbox(settings_of(tmp_path, forge=forge), data_dir=data, idle_seconds=300)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        await asyncio.to_thread(kube_kit.remove_agent, box.pod)


async def run(box: KubernetesSandbox, *argv: str) -> str:
    result = await box.exec(list(argv), timeout=60)
    assert result.exit_code == 0, result
    return result.stdout.decode().strip()


def published(box: KubernetesSandbox) -> tuple[str, int]:
    assert box.egress is not None and box.egress.published is not None
    return box.egress.published


@on_cluster
async def test_a_name_resolving_to_the_hosts_loopback_is_refused(make):
    try:
        trap: socket.socket | None = socket.create_server(("127.0.0.1", 80))
    except OSError:  # taken: the refusal is the proxy's before any connection anyway
        trap = None
    try:
        box = await make()
        said = await run(box, "python3", "-c", FETCH, "http://loop.test/")
        assert said.startswith("403 guilds egress: loop.test") and "a loopback address" in said, said
        if trap is not None:
            trap.settimeout(0.5)
            with pytest.raises(TimeoutError):
                trap.accept()  # nothing came through
    finally:
        if trap is not None:
            trap.close()


@on_cluster
async def test_nothing_but_the_proxys_port_is_reached_from_the_pod(make, plain_pods, node_listener):
    pod_said = f"pod-{secrets.token_hex(4)}"
    _, listener = await plain_pods("listener", ["python3", "-c", LISTEN, "0.0.0.0", str(POD_PORT), pod_said])
    control, _ = await plain_pods("control", ["sleep", "600"])
    node_port, node_said = node_listener
    box = await make()
    address, port = published(box)
    targets = {(listener, POD_PORT): pod_said, (address, node_port): node_said}
    for (host, to), said in targets.items():  # the positive control: an unlabelled pod reaches both
        assert await from_plain_pod(control, host, to) == said
    for host, to in targets:
        assert await run(box, "python3", "-c", CONNECT, host, str(to)) == "ConnectionRefusedError", (host, to)
    assert await run(box, "python3", "-c", CONNECT, "10.9.9.9", "443") == "OSError"  # no route past the node
    # the proxy's port answers, and serves only after the credential
    assert await run(box, "python3", "-c", ASK, address, str(port), "0" * 64, "CONNECT forge.test:443 HTTP/1.1") \
        == "closed"
    await box.stop()  # the pod's policy goes with it: the cluster's garbage collector deletes what the pod owns
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(policies_of, box.pod) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert await asyncio.to_thread(policies_of, box.pod) == []


def policies_of(pod: str) -> list[str]:
    """The network policies of pod's agent (read as the admin: the orchestrator may not list them)."""
    return kube_kit.admin_kubectl("get", "networkpolicy", "-l", f"{spec.LABEL_AGENT}={pod}", "-o", "name").split()


@on_cluster
async def test_another_agents_port_and_credential_get_nothing(make, forge):
    mine, theirs = await make(), await make()
    address, my_port = published(mine)
    _, their_port = published(theirs)
    assert mine.egress is not None and theirs.egress is not None
    own, other = mine.egress.credential, theirs.egress.credential
    request = f"CONNECT {forge_kit.HOST_NAME}:443 HTTP/1.1"
    assert await run(mine, "python3", "-c", ASK, address, str(my_port), own, request) \
        == "HTTP/1.1 200 Connection established"  # the control: its own way out works
    assert await run(mine, "python3", "-c", ASK, address, str(their_port), other, request) \
        == "ConnectionRefusedError"  # the other agent's proxy: its policy does not open that port
    assert await run(mine, "python3", "-c", ASK, address, str(my_port), other, request) == "closed"
    log = Path(mine.egress.files.path("proxy.log")).read_text()
    assert "without this sandbox's credential was closed" in log


@on_cluster
async def test_the_proxy_killed_fails_closed_at_once_and_comes_back_on_its_port(make, forge):
    box = await make()
    api = f"https://{forge_kit.HOST_NAME}/api/v3/"
    assert (await run(box, "python3", "-c", FETCH, api)).startswith("401")  # reached the forge
    before = published(box)
    pid = proxy_pid(box.egress.files)
    assert pid is not None
    os.kill(pid, 9)
    said = (await run(box, "python3", "-c", FETCH, api)).splitlines()
    assert said[0] in ("URLError", "RemoteDisconnected", "ConnectionResetError"), said
    assert float(said[-1]) < 5  # refused at once: no hang
    assert await run(box, "python3", "-c", CONNECT, forge.address, "443") == "OSError"  # nothing else tried
    await keep_egress(box)  # what the toolbox does before each call
    assert published(box) == before and proxy_pid(box.egress.files) not in (None, pid)
    assert (await run(box, "python3", "-c", FETCH, api)).startswith("401")


FIND = ('t="$0$1"; grep -rlsF --exclude-dir=proc --exclude-dir=sys -- "$t" / ; '
        'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -lsF -- "$t" "$f"; done; echo searched')


@on_cluster
async def test_the_token_is_in_nothing_the_pod_reads_nor_in_any_object_of_the_namespace(make, forge):
    box = await make()
    for value in (forge.token, UPLOAD):
        half = len(value) // 2  # the command line never holds it whole
        result = await box.exec(["/bin/sh", "-c", FIND, value[:half], value[half:]], timeout=300)
        assert result.stdout.decode().split() == ["searched"], result
    assert PLAIN in await run(box, "/bin/sh", "-c", 'echo "$PLAIN"')  # a secret without hosts is there as before
    kinds = "pods,secrets,configmaps,persistentvolumeclaims,networkpolicies,serviceaccounts,events"
    objects = await asyncio.to_thread(kube_kit.admin_kubectl, "get", kinds, "-o", "json")
    texts = [objects]
    for item in json.loads(objects)["items"]:
        texts += [base64.b64decode(v).decode("utf-8", "replace") for v in (item.get("data") or {}).values()
                  if item["kind"] == "Secret"]
    for value in (forge.token, UPLOAD):
        assert not [t for t in texts if value in t]
    assert box.pod in objects and f"{box.pod}-env" in objects and f"{box.pod}-egress" in objects
