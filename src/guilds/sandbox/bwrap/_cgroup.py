"""A bwrap sandbox's own cgroup: its memory and process count bounded as a whole.

``make_cgroup(name, memory_bytes=, pids=)`` makes (or finds) ``guilds/<name>``
under the cgroup filesystem and sets its limits; it returns, per controller,
the ``cgroup.procs`` file a process writes its pid to in order to join, or {}
when none can be made here (not root, no writable cgroup filesystem, the
controllers not enabled). Both layouts:

- cgroup v2 (one hierarchy): ``/sys/fs/cgroup/guilds/<name>`` with
  ``memory.max``, ``memory.swap.max`` = 0 and ``pids.max``, after enabling the
  memory and pids controllers for ``guilds``'s children;
- cgroup v1 (a hierarchy per controller): ``/sys/fs/cgroup/memory/guilds/<name>``
  (``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap
  is accounted) and ``/sys/fs/cgroup/pids/guilds/<name>`` (``pids.max``).

``remove_cgroup(name)`` removes the folders once empty (a sandbox's stop).
"""

from __future__ import annotations

import errno
import os
import time

from ...limits import CGROUP_REMOVE_WAIT_SECONDS, GROUP_POLL_SECONDS

CGROUP_ROOT = "/sys/fs/cgroup"
PARENT = "guilds"
CONTROLLERS = ("memory", "pids")


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _v2() -> bool:
    return os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers"))


def _folders(name: str) -> dict[str, str]:
    """controller -> the sandbox's cgroup folder (the same folder for both on v2)."""
    if _v2():
        return {c: os.path.join(CGROUP_ROOT, PARENT, name) for c in CONTROLLERS}
    return {c: os.path.join(CGROUP_ROOT, c, PARENT, name) for c in CONTROLLERS}


def _limits(controller: str, folder: str, memory_bytes: int, pids: int) -> list[tuple[str, str]]:
    if controller == "pids":
        return [("pids.max", str(pids))]
    if _v2():
        return [("memory.max", str(memory_bytes)), ("memory.swap.max", "0")]
    files = [("memory.limit_in_bytes", str(memory_bytes))]
    if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):
        files.append(("memory.memsw.limit_in_bytes", str(memory_bytes)))
    return files


def _enable_v2() -> None:
    parent = os.path.join(CGROUP_ROOT, PARENT)
    os.makedirs(parent, exist_ok=True)
    for folder in (CGROUP_ROOT, parent):
        _write(os.path.join(folder, "cgroup.subtree_control"), " ".join(f"+{c}" for c in CONTROLLERS))


def make_cgroup(name: str, *, memory_bytes: int, pids: int) -> dict[str, str]:
    """controller -> the sandbox's cgroup.procs file for it (the same file for both on
    v2), its limits set; {} where no cgroup can be made."""
    if os.geteuid() != 0:
        return {}
    folders = _folders(name)
    try:
        if _v2():
            _enable_v2()
        for controller, folder in folders.items():
            os.makedirs(folder, exist_ok=True)
            for file, value in _limits(controller, folder, memory_bytes, pids):
                _write(os.path.join(folder, file), value)
    except OSError:
        return {}
    return {c: os.path.join(f, "cgroup.procs") for c, f in folders.items()}


def remove_cgroup(name: str) -> None:
    """Remove the sandbox's cgroup folders once empty; one still busy after
    guilds.limits.CGROUP_REMOVE_WAIT_SECONDS stays (the next start uses it again)."""
    deadline = time.monotonic() + CGROUP_REMOVE_WAIT_SECONDS
    for folder in set(_folders(name).values()):
        while True:
            try:
                os.rmdir(folder)
            except OSError as exc:
                if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(GROUP_POLL_SECONDS)
                    continue
            break
