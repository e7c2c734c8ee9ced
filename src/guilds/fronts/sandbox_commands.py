"""`guilds sandbox list | stop [AGENT] | rm [AGENT]`: the agents' sandboxes, ended or removed.

    list   every guilds sandbox this machine knows of, one line each: the backend, the
           agent, what it is (a bwrap process, a container, a pod) and its state.
           bwrap: the data folder's records; docker: the containers labelled
           ``guilds.agent`` at DOCKER_HOST (when an engine answers there); kubernetes:
           the pods so labelled in ``kubernetes.namespace`` (when the agent's sandbox
           is kubernetes).
    stop   the agent's sandbox ends now, as its idle stop would end it; its files stay
           (the next call starts it again). AGENT: another agent id of the same settings.
    rm     stop, then remove the sandbox's state: bwrap, the agent's files under the
           data folder (its state root went with the sandbox); local, the agent's state
           folder under the data folder; docker, the container and its state volume;
           kubernetes, the pod, its home claim and its secret. The agent's home on
           this machine stays; and for each, the egress proxy's files (agent.network a
           list). Nothing is asked; every removed thing is named.

Exit status: 0 done (also when there was nothing to stop or remove), 1 when a
backend failed (its error printed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.settings import AgentSettings
from ..errors import SandboxError
from ..limits import DOCKER_PROBE_SECONDS
from .wiring import Wired, apply_overrides, resolve, settings_options

BWRAP_FOLDER = "sandboxes"
LOCAL_STATE_FOLDER = "state"


@dataclass(frozen=True)
class Box:
    """One sandbox, as `list` shows it."""

    backend: str
    agent: str
    what: str
    state: str

    def line(self) -> str:
        return f"{self.backend:10} {self.agent:20} {self.what:32} {self.state}"


def _bwrap_boxes(data: Path) -> list[Box]:
    from ..sandbox._spawn import start_time

    boxes = []
    folder = data / BWRAP_FOLDER
    for record_file in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(record_file.read_text())
            alive = start_time(int(record["pid"])) == record.get("start")
            state = "running" if alive else "stopped"
            boxes.append(Box("bwrap", record_file.stem, f"pid {record['pid']}", state))
    listed = {box.agent for box in boxes}
    boxes.extend(Box("bwrap", clock.stem, "no process", "stopped")
                 for clock in sorted(folder.glob("*.clock")) if clock.stem not in listed)
    return boxes


def _docker_client(settings: AgentSettings, required: bool) -> Any:
    from ..sandbox import docker_engine

    try:
        return docker_engine.connect(None, timeout=DOCKER_PROBE_SECONDS)
    except Exception as exc:  # the SDK's and the socket's errors alike: no engine here
        if required:
            raise SandboxError(f"docker: no engine answers at {docker_engine.where(None)} ({exc})") from None
        return None


def _docker_boxes(settings: AgentSettings) -> list[Box]:
    from ..sandbox.docker_spec import LABEL_AGENT

    client = _docker_client(settings, settings.sandbox == "docker")
    if client is None:
        return []
    try:
        found = client.api.containers(all=True, filters={"label": LABEL_AGENT})
        return [Box("docker", c["Labels"].get(LABEL_AGENT, "?"), c["Names"][0].lstrip("/"), c["Status"])
                for c in found]
    finally:
        client.close()


def _kube_boxes(settings: AgentSettings) -> list[Box]:
    from ..sandbox import kube_cluster
    from ..sandbox.kube_spec import LABEL_AGENT

    namespace = settings.kubernetes.namespace
    with kube_cluster.api_errors("list the pods", namespace):
        pods = kube_cluster.connect().list_namespaced_pod(namespace, label_selector=LABEL_AGENT).items
    return [Box("kubernetes", p.metadata.labels.get(LABEL_AGENT, "?"), f"{namespace}/{p.metadata.name}",
                (p.status.phase or "?").lower()) for p in pods]


def list_boxes(wired: Wired) -> list[Box]:
    boxes = _bwrap_boxes(Path(wired.data_dir)) + _docker_boxes(wired.settings)
    if wired.settings.sandbox == "kubernetes":
        boxes += _kube_boxes(wired.settings)
    return boxes


def removed_files(data: Path, settings: AgentSettings, backend: str) -> Iterator[str]:
    """Remove what a stopped bwrap or local sandbox keeps in the data folder; yield each path."""
    if backend == "bwrap":
        base = data / BWRAP_FOLDER / settings.id
        paths = [base, *(base.with_name(f"{settings.id}.{ext}") for ext in ("json", "lock", "log", "clock"))]
    else:
        paths = [data / LOCAL_STATE_FOLDER / settings.id]
    yield from _removed(paths)


def _removed(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        yield str(path)


def _docker_things(sandbox: Any) -> Iterator[str]:
    """The container and volume of a docker sandbox that exist now, by name."""
    import docker

    from ..sandbox.docker_engine import engine_errors
    from ..sandbox.docker_spec import state_volume

    with engine_errors("look for the sandbox", None):
        api = sandbox.client.api
        with contextlib.suppress(docker.errors.NotFound):
            api.inspect_container(sandbox.container)
            yield f"container {sandbox.container}"
        with contextlib.suppress(docker.errors.NotFound):
            api.inspect_volume(state_volume(sandbox.agent_id))
            yield f"volume {state_volume(sandbox.agent_id)}"


def _kube_remove(sandbox: Any) -> Iterator[str]:
    """Delete the pod's home claim and secret; yield each one deleted."""
    from ..sandbox import kube_cluster

    namespace = sandbox.config.namespace
    core = kube_cluster.connect()
    for kind, name, delete in (("claim", f"{sandbox.pod}-home", core.delete_namespaced_persistent_volume_claim),
                               ("secret", f"{sandbox.pod}-env", core.delete_namespaced_secret)):
        with kube_cluster.api_errors(f"delete {kind} {name}", namespace), kube_cluster.ignoring(404):
            delete(name, namespace)
            yield f"{kind} {namespace}/{name}"


async def stop_box(wired: Wired, *, remove: bool) -> list[str]:
    """Stop the agent's sandbox (rm: and remove its state); what was stopped or removed."""
    from ..sandbox import get_sandbox

    sandbox = get_sandbox(wired.settings, wired.data_dir)
    backend = sandbox.name
    before = list(await asyncio.to_thread(lambda: list(_docker_things(sandbox)))) if backend == "docker" else []
    await sandbox.stop()
    done = [f"stopped the {backend} sandbox of agent {wired.settings.id}"]
    if backend == "docker":
        return done + [f"removed {thing}" for thing in before + (_removed_egress(wired) if remove else [])]
    if not remove:
        return done
    if backend == "kubernetes":
        gone = await asyncio.to_thread(lambda: list(_kube_remove(sandbox)))
    else:
        gone = list(removed_files(Path(wired.data_dir), wired.settings, backend))
    return done + [f"removed {thing}" for thing in gone + _removed_egress(wired)]


def _removed_egress(wired: Wired) -> list[str]:
    """The egress proxy's files of the agent (agent.network a list), removed once it is stopped."""
    return list(_removed([Path(wired.data_dir) / "egress" / wired.settings.id]))


def _parser(action: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"guilds sandbox {action}")
    if action != "list":
        parser.add_argument("agent", nargs="?", help="the agent id (default: the settings' agent.id)")
    settings_options(parser)
    return parser


def _wired(opts: argparse.Namespace, env: Mapping[str, str]) -> Wired:
    wired = resolve(opts.config, env=env, overrides={"sandbox": opts.sandbox} if opts.sandbox else None)
    agent = getattr(opts, "agent", None)
    if not agent:
        return wired
    settings = apply_overrides(wired.settings, {"id": agent})
    return Wired(settings, wired.data_dir, wired.env, wired.coding, wired.settings_file)


def main(action: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The `guilds sandbox` actions but `image`; a GuildsError goes to the CLI, which prints it."""
    opts = _parser(action).parse_args(list(argv))
    wired = _wired(opts, env)
    if action == "list":
        boxes = list_boxes(wired)
        for box in boxes:
            print(box.line())
        if not boxes:
            print("no sandboxes")
        return 0
    for line in asyncio.run(stop_box(wired, remove=action == "rm")):
        print(line)
    return 0
