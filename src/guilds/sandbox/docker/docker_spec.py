"""The docker sandbox's container, exec and error texts, built as pure functions.

The container (``container_spec``, keyword arguments of the SDK's
``containers.create``): the configured image; its command INIT (the idle
stop, see ``_container``); docker's init as pid 1 reaping zombies; the home, a
host folder, bound at its own path; the state root a named volume
``guilds-<agent id>-state`` at /run/guilds, so background records outlive a
container (a command that was running in a killed container shows ``ended``);
the agent's folder of direct channels (``docker_fifos``) bound read-only when
the sandbox has a data folder; the memory and pids limits; ``network_mode`` "none" unless ``agent.network`` is
true, then the configured Docker network (a list: "none", the egress proxy's
socket folder bound read-only and INIT running the relay); the agent's uid (``user``, never root), no
capabilities, no new privileges. Its environment holds no
secret: the agent's environment travels with each exec (``exec_spec``).

``split_frames`` reads the exec API's multiplexed stream: frames of an 8-byte
header (stream 1 stdout or 2 stderr, three zero bytes, big-endian length) and
the payload.
"""

from __future__ import annotations

import struct
import time
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from ...config.settings import DockerSettings
from .._container import CLOCK, STATE_INSIDE, exec_argv, init_argv
from ..egress_side.files import EGRESS_INSIDE
from .docker_fifos import CHANNEL_INSIDE

LABEL_AGENT = "guilds.agent"
LABEL_FINGERPRINT = "guilds.fingerprint"
PYTHON = "python3"
"""The interpreter inside the image (found on the exec's PATH)."""
IDLE_EXIT = 0
"""INIT's status when it ended on idle: the container is simply started anew."""
STDOUT, STDERR = 1, 2
_HEADER = struct.Struct(">BxxxL")


def container_name(agent_id: str) -> str:
    return f"guilds-{agent_id}"


def state_volume(agent_id: str) -> str:
    return f"guilds-{agent_id}-state"


def container_spec(
    cfg: DockerSettings, *, agent_id: str, home: str, network: bool, idle_seconds: float,
    base_env: Mapping[str, str], user: tuple[int, int], egress_dir: str = "", inside: str = "",
    channel_dir: str = "",
) -> dict[str, Any]:
    """``containers.create`` keyword arguments for the agent's container (pure).

    base_env: the environment without secrets (PATH, LANG, HOME, ...); user: (uid, gid);
    egress_dir (agent.network a list): the host folder of the egress proxy's socket,
    bound read-only at EGRESS_INSIDE, with INIT running the relay (network "none");
    inside: where the home (a host folder) is bound, its commands' folder (default: home);
    channel_dir: the host folder of the agent's direct channels (``docker_fifos``), bound
    read-only at CHANNEL_INSIDE.
    """
    inside = inside or home
    volumes = {home: {"bind": inside, "mode": "rw"},
               state_volume(agent_id): {"bind": STATE_INSIDE, "mode": "rw"}}
    if egress_dir:
        volumes[egress_dir] = {"bind": EGRESS_INSIDE, "mode": "ro"}
    if channel_dir:
        volumes[channel_dir] = {"bind": CHANNEL_INSIDE, "mode": "ro"}
    return {
        "image": cfg.image,
        "command": init_argv(PYTHON, idle_seconds, CLOCK, relay=bool(egress_dir)),
        "name": container_name(agent_id),
        "labels": {LABEL_AGENT: agent_id},
        "environment": dict(base_env),
        "working_dir": inside,
        "volumes": volumes,
        "init": True,
        "mem_limit": cfg.memory,
        "memswap_limit": cfg.memory,
        "pids_limit": cfg.pids_limit,
        "network_mode": cfg.network if network else "none",
        "user": f"{user[0]}:{user[1]}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
    }


def exec_spec(container: str, argv: Sequence[str], *, env: Mapping[str, str], home: str,
              timeout: float) -> dict[str, Any]:
    """``api.exec_create`` keyword arguments for one call (pure): no stdin, no tty."""
    return {"container": container, "cmd": exec_argv(argv, timeout), "environment": dict(env),
            "workdir": home, "stdin": False, "stdout": True, "stderr": True, "tty": False}


def our_labels(inspected: Mapping[str, Any]) -> dict[str, str]:
    """The guilds labels of an inspected container (to compare with a spec's)."""
    labels = (inspected.get("Config") or {}).get("Labels") or {}
    return {k: v for k, v in labels.items() if k in (LABEL_AGENT, LABEL_FINGERPRINT)}


def split_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Complete (stream, payload) frames at the start of buf, and the bytes left over."""
    frames, at = [], 0
    while len(buf) - at >= _HEADER.size:
        stream, size = _HEADER.unpack_from(buf, at)
        if len(buf) - at - _HEADER.size < size:
            break
        frames.append((stream, bytes(buf[at + _HEADER.size: at + _HEADER.size + size])))
        at += _HEADER.size + size
    return frames, bytes(buf[at:])


RUNTIME_REFUSED_EXIT = 126
RUNTIME_REFUSED = b"OCI runtime exec failed"


def not_started(exit_code: int | None, stdout: bytes) -> bool:
    """The runtime refused to start the exec (the container stopped meanwhile, e.g. at
    its idle stop): the command never ran, so the call may be made again (pure)."""
    return exit_code == RUNTIME_REFUSED_EXIT and stdout.startswith(RUNTIME_REFUSED)


def idle_stopped(state: Mapping[str, Any]) -> bool:
    """A container that ended by its idle stop (not killed, not out of memory)."""
    return not state.get("OOMKilled") and state.get("ExitCode") == IDLE_EXIT


def being_set_up(inspected: Mapping[str, Any], grace_seconds: float, now: float | None = None) -> bool:
    """A container created and not started yet, less than grace_seconds ago: another
    process is putting its files in and will start it (pure but for the clock)."""
    state = inspected.get("State") or {}
    if state.get("Status") != "created":
        return False
    made = _parse_time(str(inspected.get("Created", "")))
    return made is not None and (time.time() if now is None else now) - made < grace_seconds


def _parse_time(text: str) -> float | None:
    """Docker's RFC 3339 time with nanoseconds -> seconds since the epoch."""
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        whole = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return whole.timestamp() + float(f"0.{frac or 0}")


def ended_text(name: str, state: Mapping[str, Any], cfg: DockerSettings) -> str:
    """Why a container is no longer running, for the call that finds it so (pure)."""
    code = state.get("ExitCode")
    if state.get("OOMKilled"):
        why = f"was killed: out of memory (docker.memory = {cfg.memory!r})"
    elif code == 137:
        why = "was killed (SIGKILL)"
    else:
        why = f"stopped with status {code}"
    return (f"the sandbox container {name} {why}; its running commands ended. "
            "Nothing in the home was lost; the next call starts a new container")


def api_error_text(what: str, status: int | None, explanation: str) -> str:
    """The one-line error for a refused engine request (pure)."""
    low = explanation.lower()
    if "no space left" in low:
        return f"docker: {what}: the sandbox's disk is full ({explanation})"
    return f"docker: {what}: {explanation}" + (f" (HTTP {status})" if status else "")
