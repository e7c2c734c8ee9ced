"""agent.network a list in a deployment (claim mode, two replicas): the sandbox reaches its
listed host through the proxy of the replica that served its call; that replica killed, the
sandbox's connections close at once (closed, never open), and the next call through the
other replica carries them through its own proxy; an unlisted host is refused. The listed
host is a server of this test on the node's side of the pod network."""

from __future__ import annotations

import asyncio
import http.server
import os
import shlex
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest

import deploy_kit
import failover_kit as kit
import kube_kit

pytestmark = [*kube_kit.needs_cluster,
              pytest.mark.skipif(not os.environ.get("GUILDS_TEST_POSTGRES_URL"),
                                 reason="GUILDS_TEST_POSTGRES_URL is not set (the replicas' run record)")]
WEB = "web.test"
FETCH = ("import sys, time, urllib.request as u\n"
         "began = time.monotonic()\n"
         "try: print(u.urlopen(sys.argv[1], timeout=20).read().decode())\n"
         "except Exception as e: print(type(e).__name__, getattr(e, 'code', ''))\n"
         "print(round(time.monotonic() - began, 1))\n")
"""Fetch argv[1] through the proxy variables: the body or why not, then the seconds."""


class _Said(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"from-the-host {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    """A server on the node's side of the pod network (what the replicas' proxies reach): its port."""
    server = http.server.ThreadingHTTPServer((deploy_kit.NODE_POD_ADDRESS, 0), _Said)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, web: int) -> Iterator[deploy_kit.Deployment]:
    agent = f'network = ["{WEB}:{web}", "{deploy_kit.NODE_POD_ADDRESS}/32"]\n'
    more = f'[egress.resolve]\n"{WEB}" = "{deploy_kit.NODE_POD_ADDRESS}"\n'
    with deploy_kit.deployed(tmp_path_factory.mktemp("overlay"), agent=agent, more=more) as deployed:
        assert deploy_kit.wait_until(lambda: len(deployed.route.endpoints) == 2, 60)
        yield deployed


def fetch_through(deployment: deploy_kit.Deployment, url: str, target: str, run: str) -> list[str]:
    async def call() -> str:
        async with kit.connected(url, deployment.token) as client:
            result = await client.call_tool("shell", {"command": f"python3 -c {shlex.quote(FETCH)} {target}"},
                                            meta={kit.RUN_KEY: run})
        return "".join(getattr(block, "text", "") for block in result.content)

    return asyncio.run(call()).splitlines()


def sandbox_pod() -> str:
    import json

    listed = json.loads(deploy_kit.kubectl("get", "pods", "-o", "json"))
    running = [p["metadata"]["name"] for p in listed["items"] if p["status"].get("phase") == "Running"
               and p["metadata"]["labels"].get("app.kubernetes.io/name") != "guilds-serve"
               and "agents.x-k8s.io/claim-uid" in p["metadata"]["labels"]]
    assert len(running) == 1, running
    return running[0]


def test_a_replicas_death_closes_the_sandboxs_way_out_until_another_replica_serves_it(deployment, web):
    pods = deployment.ready_pods()
    urls = deployment.pod_urls()
    first, second = (p["metadata"]["name"] for p in pods[:2])
    run = f"mcp-egress-{uuid.uuid4().hex[:8]}"
    listed = f"http://{WEB}:{web}"
    said = fetch_through(deployment, urls[first], f"{listed}/one", run)
    assert "from-the-host /one" in said, said
    refused = fetch_through(deployment, urls[first], "http://unlisted.test/", run)
    assert any(line.startswith("HTTPError 403") for line in refused), refused

    pid = deploy_kit.host_pid(pods[0])
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the replica, and its proxy with it
    inside = deploy_kit.kubectl("exec", sandbox_pod(), "--", "python3", "-c", FETCH, f"{listed}/between",
                                timeout=60).splitlines()
    assert inside[0].split()[0] in ("URLError", "RemoteDisconnected", "ConnectionResetError"), inside
    assert float(inside[-1]) < 5  # closed at once: no hang, and never straight out

    said = fetch_through(deployment, urls[second], f"{listed}/two", run)  # its own proxy, told to the pod
    assert "from-the-host /two" in said, said
