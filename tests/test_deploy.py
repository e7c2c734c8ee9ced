"""guilds serve deployed from deploy/kubernetes on the test cluster, two replicas behind
the Service (tests/deploy_kit.py): the E2B SDK, the MCP SDK's client and guilds.open
against it, each request going to whichever replica its connection lands on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import deploy_kit
import kube_kit

pytestmark = [*kube_kit.needs_cluster,
              pytest.mark.skipif(not os.environ.get("GUILDS_TEST_POSTGRES_URL"),
                                 reason="GUILDS_TEST_POSTGRES_URL is not set (the replicas' run record)")]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[deploy_kit.Deployment]:
    with deploy_kit.deployed(tmp_path_factory.mktemp("overlay")) as deployed:
        yield deployed


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 - http to the test's own route
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def e2b_env(monkeypatch: pytest.MonkeyPatch, url: str, key: str) -> None:
    for name, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", key)):
        monkeypatch.setenv(name, value)


def test_the_replicas_are_up_behind_the_service_with_their_probes(deployment):
    pods = deployment.pods()
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    # a running pod joins the Service's endpoints once its readiness probe has passed
    assert deploy_kit.wait_until(lambda: len(deployment.route.endpoints) == 2, 60), deployment.route.endpoints
    before = len(deployment.route.relay.connections)
    answers = [get(f"{deployment.route.url}/readyz") for _ in range(4)]
    assert answers == [(200, "ready\n")] * 4
    assert set(deployment.route.relay.connections[before:]) == set(deployment.route.endpoints)
    for url in deployment.pod_urls().values():  # a probe carries no token and the pod's address as Host
        assert get(f"{url}/healthz") == (200, "ok\n")
    assert get(f"{deployment.route.url}/runs")[0] == 401  # everything else keeps the token


def test_the_e2b_sdk_through_the_service(deployment, monkeypatch):
    from e2b import Sandbox

    e2b_env(monkeypatch, deployment.route.url, deployment.e2b_key)
    box = Sandbox.create(timeout=300)
    try:
        box.files.write("note.txt", "made through the Service\n")
        ran = box.commands.run("cat note.txt")
        assert ran.exit_code == 0 and ran.stdout == "made through the Service\n"
        assert box.is_running()
    finally:
        box.kill()


def test_an_e2b_sandbox_is_served_by_either_replica(deployment, monkeypatch):
    """Made through one replica, used, timed and killed through the other (--e2b-shared); a
    command of one reached through the other."""
    from e2b import Sandbox

    first, second = sorted(deployment.pod_urls().values())
    there = {"api_url": second, "sandbox_url": second}
    e2b_env(monkeypatch, first, deployment.e2b_key)
    made = Sandbox.create(timeout=300)
    try:
        made.files.write("one.txt", "from the first replica\n")
        other = Sandbox.connect(made.sandbox_id, **there)
        assert other.commands.run("cat one.txt").stdout == "from the first replica\n"
        assert other.files.read("one.txt") == "from the first replica\n"
        reader = made.commands.run("cat", background=True, stdin=True)  # the first replica's command
        assert reader.pid in {process.pid for process in other.commands.list()}
        other.commands.send_stdin(reader.pid, "through the second\n")  # sent on to the first replica
        other.commands.close_stdin(reader.pid)
        assert reader.wait().stdout == "through the second\n"
        before = Sandbox.get_info(made.sandbox_id).end_at
        other.set_timeout(900)
        assert Sandbox.get_info(made.sandbox_id).end_at > before  # the first replica reads the second's end
        other.kill()
        assert not made.is_running()
        assert made.sandbox_id not in [box.sandbox_id for box in Sandbox.list().next_items()]
    finally:
        made.kill()


USE_IN_ITS_OWN_PROCESS = """
import sys
from e2b import Sandbox
box = Sandbox.connect(sys.argv[1])
box.files.write(f"turn{sys.argv[2]}.txt", sys.argv[2] + "\\n")
print(box.commands.run("cat turn*.txt").stdout, end="")
"""


def test_one_e2b_sandbox_through_the_service_from_one_process_after_another(deployment, monkeypatch):
    """Each use a program of its own (its own connections: the Service hands them to either
    replica in turn), as programs sharing a sandbox would."""
    from e2b import Sandbox

    e2b_env(monkeypatch, deployment.route.url, deployment.e2b_key)
    made = Sandbox.create(timeout=300)
    try:
        before = len(deployment.route.relay.connections)
        for turn in range(4):
            done = subprocess.run([sys.executable, "-c", USE_IN_ITS_OWN_PROCESS, made.sandbox_id, str(turn)],
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
            assert done.stdout == "".join(f"{n}\n" for n in range(turn + 1))
        assert set(deployment.route.relay.connections[before:]) == set(deployment.route.endpoints)
    finally:
        made.kill()


async def mcp_call(deployment: deploy_kit.Deployment, tool: str, args: dict) -> tuple[str, dict]:
    """One call by a client of its own (its own connections: the Service hands them out in
    turn): the result's text and guilds/meta."""
    headers = {"Authorization": f"Bearer {deployment.token}"}
    async with httpx.AsyncClient(headers=headers, timeout=120) as http, \
            Client(streamable_http_client(f"{deployment.route.url}/mcp", http_client=http),
                   read_timeout_seconds=120) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.content[0].text, (result.meta or {})["guilds/meta"]


def test_the_mcp_client_continues_one_run_on_either_replica(deployment):
    """A call a client: the run passed back, its working directory, its numbering and its
    background commands go on, whichever replica each call lands on."""
    async def calls() -> tuple[list[dict], list[str]]:
        _, first = await mcp_call(deployment, "shell", {"command": "mkdir -p deep/er && cd deep/er"})
        run = first["run"]
        metas = [first, *[(await mcp_call(deployment, "shell", {"command": "pwd", "run": run}))[1]
                          for _ in range(3)]]
        await mcp_call(deployment, "shell", {"command": "sleep 1; echo done", "background": True, "run": run})
        states = []
        for _ in range(30):
            states.append((await mcp_call(deployment, "shell_status", {"id": "b1", "run": run}))[0])
            if "exited 0" in states[-1]:
                break
            await asyncio.sleep(0.5)
        return metas, states

    before = len(deployment.route.relay.connections)
    metas, states = asyncio.run(calls())
    assert [m["seq"] for m in metas] == [1, 2, 3, 4]
    assert {m["cwd"] for m in metas[1:]} == {"/home/agent/deep/er"}
    assert "exited 0" in states[-1] and "done" in states[-1]
    assert set(deployment.route.relay.connections[before:]) == set(deployment.route.endpoints)


def test_a_session_of_the_older_handshake_goes_on_on_either_replica(deployment):
    """Claude Code's kind of client: a session opened on one replica, each of its requests
    on a connection of its own (the Service hands them out in turn): one run, its working
    directory kept, no new handshake."""
    async def calls() -> list:
        headers = {"Authorization": f"Bearer {deployment.token}"}
        async with httpx.AsyncClient(headers=headers, timeout=120,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as http, \
                Client(streamable_http_client(f"{deployment.route.url}/mcp", http_client=http), mode="legacy",
                       read_timeout_seconds=120) as client:
            return [await client.call_tool("shell", {"command": command})
                    for command in ["mkdir -p older/hand && cd older/hand", *["pwd"] * 5]]

    before = len(deployment.route.relay.connections)
    results = asyncio.run(calls())
    assert not any(r.is_error for r in results), [r.content for r in results]
    metas = [(r.meta or {})["guilds/meta"] for r in results]
    assert len({m["run"] for m in metas}) == 1 and {m["cwd"] for m in metas[1:]} == {"/home/agent/older/hand"}
    assert set(deployment.route.relay.connections[before:]) == set(deployment.route.endpoints)


def test_guilds_open_shares_the_record_and_the_sandbox_of_the_replicas(deployment, monkeypatch, tmp_path):
    """The servers' own agent, written to through the Service over MCP, is the agent
    guilds.open opens here on the same record and cluster: the same claim, the same files."""
    import guilds

    async def through_the_service() -> str:
        _, meta = await mcp_call(deployment, "shell", {"command": "echo written over MCP > /home/agent/from-mcp.txt"})
        return meta["run"]

    async def here() -> tuple[str, list[str]]:
        env = {"GUILDS_DATA": str(tmp_path / "data"), "GUILDS_DATABASE_URL": deployment.database_url}
        async with guilds.open(str(settings), env=env) as agent:
            result = await agent.call("py-deploy", "shell", {"command": "cat /home/agent/from-mcp.txt"})
            runs = [run.id for run in await agent.toolbox.store.list_runs("serve")]
            return result.text, runs

    monkeypatch.setenv("KUBECONFIG", str(deploy_kit.admin_config()))
    settings = tmp_path / "settings.toml"
    settings.write_text(deployment.settings)
    run = asyncio.run(through_the_service())
    text, runs = asyncio.run(here())
    assert "written over MCP" in text
    assert run in runs and "py-deploy" in runs


def test_the_network_policy_lets_only_sandboxes_reach_a_replicas_other_ports(deployment):
    """A listener in a replica on a port other than http (where an egress proxy listens):
    a pod labelled as a sandbox reaches it, another pod does not, and reaches http."""
    pod = deployment.pods()[0]
    address = pod["status"]["podIP"]
    deploy_kit.kubectl("exec", pod["metadata"]["name"], "-c", "serve", "--", "sh", "-c",
                       "nohup python3 -c \"import socket; s = socket.create_server(('0.0.0.0', 20999)); "
                       "[s.accept()[0].close() for _ in iter(int, 1)]\" >/dev/null 2>&1 &")
    # Each port tried for up to 8 s: the policy controller lets a new pod's address in a
    # moment after the pod starts, so a first refusal may be that moment's.
    probe = ("import socket, sys, time\n"
             "for port in sys.argv[2:]:\n"
             "    deadline, said = time.monotonic() + 8, 'closed'\n"
             "    while said == 'closed' and time.monotonic() < deadline:\n"
             "        try:\n"
             "            socket.create_connection((sys.argv[1], int(port)), 2).close(); said = 'open'\n"
             "        except OSError:\n"
             "            time.sleep(0.5)\n"
             "    print(port, said)\n")

    def reached(name: str, labels: dict[str, str]) -> dict[str, str]:
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
                    "spec": {"restartPolicy": "Never", "enableServiceLinks": False,
                             "automountServiceAccountToken": False,
                             "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                             "containers": [{"name": "probe", "image": deploy_kit.PROBE_IMAGE,
                                             "command": ["python3", "-c", probe, address, "8765", "20999"]}]}}
        deploy_kit.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        assert deploy_kit.wait_until(
            lambda: deploy_kit.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") in ("Succeeded", "Failed"),
            120)
        said = deploy_kit.kubectl("logs", name)
        deploy_kit.kubectl("delete", "pod", name, "--wait=false")
        return dict(line.split() for line in said.splitlines())

    assert reached("probe-sandbox", {"guilds.network": "probe"}) == {"8765": "open", "20999": "open"}
    assert reached("probe-other", {"app": "other"}) == {"8765": "open", "20999": "closed"}


def test_a_rolling_restart_keeps_the_e2b_sandboxes(deployment, monkeypatch):
    """Every replica replaced, one at a time: a sandbox made before is served after."""
    from e2b import Sandbox

    e2b_env(monkeypatch, deployment.route.url, deployment.e2b_key)
    made = Sandbox.create(timeout=600)
    try:
        made.files.write("before.txt", "made before the restart\n")
        before = {p["metadata"]["name"] for p in deployment.pods()}
        deploy_kit.kubectl("rollout", "restart", "deployment/guilds-serve")
        deploy_kit.rollout()
        assert deploy_kit.wait_until(lambda: not before & {p["metadata"]["name"] for p in deployment.pods()}, 120)

        def routed_to_the_new_pods() -> bool:
            new = {(p["status"].get("podIP"), 8765) for p in deployment.pods()}
            return len(deployment.route.endpoints) == 2 and set(deployment.route.endpoints) <= new

        assert deploy_kit.wait_until(routed_to_the_new_pods, 60)
        done = subprocess.run([sys.executable, "-c", USE_IN_ITS_OWN_PROCESS, made.sandbox_id, "9"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "9\n"
        assert Sandbox.connect(made.sandbox_id).files.read("before.txt") == "made before the restart\n"
    finally:
        made.kill()
