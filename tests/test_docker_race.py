"""Many orchestrator processes making one agent's container at once, on the real engine.

Each round removes the container, then PROCESSES processes start together and
make their first call; every call must answer. ROUNDS rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import docker
import pytest

from guilds.sandbox.docker.docker_engine import unavailable

IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
WHY = unavailable(IMAGE)
PROCESSES = 8
ROUNDS = 10
FIRST_CALL = """
import asyncio, sys
from pathlib import Path
from guilds.sandbox.docker.docker_sandbox import DockerSandbox
from guilds.config.settings import AgentSettings, DockerSettings

async def main():
    settings = AgentSettings(id="race1", home=Path(sys.argv[1]), sandbox="docker",
                             docker=DockerSettings(image=sys.argv[2]))
    box = DockerSandbox(settings)
    result = await box.exec(["sh", "-c", "echo ok-$(id -u)"], timeout=60)
    print(result.exit_code, result.stdout.decode().strip())

asyncio.run(main())
"""

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"docker: {WHY}")]


def _remove(client: docker.DockerClient) -> None:
    try:
        client.api.remove_container("guilds-race1", force=True)
    except docker.errors.NotFound:
        pass


def test_eight_processes_make_one_container_at_once_ten_times(tmp_path):
    client = docker.from_env(timeout=60)
    try:
        for round_ in range(ROUNDS):
            _remove(client)
            procs = [subprocess.Popen([sys.executable, "-c", FIRST_CALL, str(tmp_path / "home"), IMAGE],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for _ in range(PROCESSES)]
            answers = [p.communicate(timeout=120) for p in procs]
            said = [(p.returncode, out.decode().strip(), err.decode()[-300:])
                    for p, (out, err) in zip(procs, answers, strict=True)]
            assert all(code == 0 and out == "0 ok-65532" for code, out, _ in said), (round_, said)
    finally:
        _remove(client)
        client.close()
