"""A replica's death costs no call: guilds serve deployed with 3 replicas behind the Service
(tests/deploy_kit.py), runs calling through the MCP SDK's client while a replica is killed
with SIGKILL every 10 s (tests/failover_kit.py; bench/failover_bench.py is the same at
20 runs x 50 calls). Every call ends once: answered, or the one-line lost error; none runs
twice; the record holds each as its answer says; a background command is read and stopped
through any replica after the one that started it died."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import Iterator

import pytest

import deploy_kit
import failover_kit as kit
import kube_kit
from guilds.limits import RESIDENT_ORPHAN_EXIT_SECONDS

pytestmark = [*kube_kit.needs_cluster,
              pytest.mark.skipif(not os.environ.get("GUILDS_TEST_POSTGRES_URL"),
                                 reason="GUILDS_TEST_POSTGRES_URL is not set (the replicas' run record)")]
RUNS, CALLS, KILL_EVERY = 10, 30, 10.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[deploy_kit.Deployment]:
    with deploy_kit.deployed(tmp_path_factory.mktemp("overlay"), replicas=3) as deployed:
        assert deploy_kit.wait_until(lambda: len(deployed.route.endpoints) == 3, 60)
        yield deployed


def test_calls_through_the_service_end_once_while_replicas_are_killed(deployment):
    async def storm_and_check() -> kit.Counts:
        calls, killer, _ = await kit.storm(deployment, RUNS, CALLS, KILL_EVERY)
        return await kit.check(deployment, calls, killer)

    counts = asyncio.run(storm_and_check())
    print("\n".join(counts.lines()))
    assert counts.kills >= 1 and counts.broken >= 1, counts.lines()
    assert counts.made == RUNS * CALLS and counts.answered + counts.lost == counts.made, counts.lines()
    assert counts.errors == [] and counts.ran_twice == [] and counts.not_run == [], counts.lines()
    assert counts.wrong_status == [], counts.lines()
    # The killed replicas' helper servers in the sandbox (their exec streams' ends never reach
    # them) end without keepalives: one server a live replica is left.
    print("servers after the storm:", deployment.sandbox_servers())
    assert deploy_kit.wait_until(lambda: len(deployment.sandbox_servers()) <= 3,
                                 RESIDENT_ORPHAN_EXIT_SECONDS + 60, 5), deployment.sandbox_servers()


def test_a_background_command_is_read_and_stopped_through_any_replica_after_its_replica_died(deployment):
    """Started through one replica, which is then killed; read through another, stopped
    through the third, and read ended through the Service."""
    assert deploy_kit.wait_until(lambda: len(deployment.ready_pods()) == 3, 300)
    pods = deployment.ready_pods()
    urls = deployment.pod_urls()
    first, second, third = [p["metadata"]["name"] for p in pods]
    run = f"mcp-bg-{uuid.uuid4().hex[:8]}"

    async def through(url: str, tool: str, arguments: dict) -> tuple[str, dict]:
        async with kit.connected(url, deployment.token) as client:
            result = await client.call_tool(tool, arguments, meta={kit.RUN_KEY: run})
        text = "".join(getattr(block, "text", "") for block in result.content)
        return text, (result.meta or {}).get("guilds/meta", {})

    started, meta = asyncio.run(through(urls[first], "shell", {"command": "sleep 600", "background": True}))
    bid = meta.get("background_id")
    assert bid and started.startswith(f"started {bid} "), started
    pid = deploy_kit.host_pid(pods[0])
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    read, meta = asyncio.run(through(urls[second], "shell_status", {"id": bid}))
    assert meta["state"] == "running", read
    stopped, meta = asyncio.run(through(urls[third], "shell_status", {"id": bid, "stop": True}))
    assert meta["state"] not in ("running",), stopped

    def ended() -> bool:
        return asyncio.run(through(deployment.route.url, "shell_status", {"id": bid}))[1]["state"] not in (
            "running", "stopping")

    assert deploy_kit.wait_until(ended, 30)
