"""What the docker backend answers without a sandbox.

- ``check(settings, needed)``: doctor's line: an engine answers at DOCKER_HOST
  (else the local socket) and holds ``docker.image``;
- ``boxes(chosen)``: the containers labelled ``guilds.agent`` at that engine, when
  one answers there (chosen: no engine is an error, SandboxError).
"""

from __future__ import annotations

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import DOCKER_PROBE_SECONDS
from ..base import Box, Check
from . import docker_engine as engine
from .docker_spec import LABEL_AGENT

NAME = "docker"


def check(settings: AgentSettings, *, needed: bool) -> list[Check]:
    image = settings.docker.image
    reason = engine.unavailable(image)
    if reason is None:
        return [Check(NAME, True, f"engine at {engine.where(None)}, image {image}", needed=needed)]
    fix = ("build it: guilds sandbox image" if "missing" in reason
           else "start the Docker engine, or set DOCKER_HOST to one")
    return [Check(NAME, False, reason, fix, needed)]


def boxes(*, chosen: bool) -> list[Box]:
    try:
        client = engine.connect(None, timeout=DOCKER_PROBE_SECONDS)
    except Exception as exc:  # the SDK's and the socket's errors alike: no engine here
        if chosen:
            raise SandboxError(f"docker: no engine answers at {engine.where(None)} ({exc})") from None
        return []
    try:
        found = client.api.containers(all=True, filters={"label": LABEL_AGENT})
        return [Box(NAME, c["Labels"].get(LABEL_AGENT, "?"), c["Names"][0].lstrip("/"), c["Status"])
                for c in found]
    finally:
        client.close()
