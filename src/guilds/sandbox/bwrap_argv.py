"""The bwrap sandbox's argv, built as pure functions of a config.

Inside: the host's ``/`` read-only; the home bound writable at its own path;
fresh ``/proc``, ``/dev``, and empty ``/tmp`` and ``/run`` (no host sockets);
the state root, a host folder, bound at ``/run/guilds``; the helpers bound
read-only at ``/usr/local/bin/<name>`` (a tmpfs there re-exposes the host's
entries, since a read-only ``/usr`` takes no new mount point); the data folder
hidden behind an empty tmpfs; own pid, ipc and uts namespaces; the network off
(``--unshare-net``) unless ``agent.network``; no capabilities.

``enter_argv`` runs a command in the running sandbox: ``nsenter`` into its
namespaces (it forks into the pid namespace), then ``setpriv`` drops every
capability and forbids new privileges.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from typing import Sequence

from ._process import succeeds

STATE_INSIDE = "/run/guilds"
HELPER_DIR = "/usr/local/bin"
DEFAULT_IDLE_SECONDS = 30 * 60
"""The sandbox ends after this long without a call (``shell`` background commands with it)."""
INIT = (
    "import os,signal,sys,time\n"
    "stamp,idle,ready=sys.argv[1],float(sys.argv[2]),int(sys.argv[3])\n"
    "def reap(*_):\n"
    " try:\n"
    "  while os.waitpid(-1,os.WNOHANG)[0]:pass\n"
    " except ChildProcessError:pass\n"
    "signal.signal(signal.SIGCHLD,reap)\n"
    "os.write(ready,b'ready\\n')\n"
    "os.close(ready)\n"
    "while time.time()-os.stat(stamp).st_mtime<idle:\n"
    " reap()\n"
    " time.sleep(min(idle/4,30))\n"
)
"""The sandbox's init, pid 1 of its namespace (``--as-pid-1``): reaps every
orphan as it ends, says "ready" on an fd (the mounts are then in place), and
lives while the stamp's mtime is younger than idle seconds. When it exits the
kernel kills every process left in the namespace."""
READY = b"ready"
NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts")
PROBE = ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *NAMESPACES,
         "--unshare-net", "--cap-drop", "ALL", "true"]
_TOOLS = ("bwrap", "nsenter", "setpriv", "setsid")


@dataclass(frozen=True)
class BwrapConfig:
    """Everything the sandbox's bwrap argv depends on."""

    home: str
    """Host folder of the home, bound writable at the same path."""
    state: str
    """Host folder of the state root, bound at /run/guilds."""
    helpers: tuple[tuple[str, str], ...]
    """(name, host file) bound read-only at /usr/local/bin/<name>."""
    python: str
    """The python3 that runs INIT (and the helpers) inside."""
    local_bin: tuple[tuple[str, str | None], ...] = ()
    """The host's /usr/local/bin entries: (name, link target, or None for a file)."""
    hidden: tuple[str, ...] = ()
    """Host folders hidden behind an empty tmpfs (the data folder)."""
    keep_run: tuple[str, ...] = ()
    """Host paths under /run bound back read-only (resolv.conf's target)."""
    network: bool = False
    idle_seconds: float = DEFAULT_IDLE_SECONDS
    info_fd: int = 3
    """The fd bwrap reports its child's pid on (--info-fd)."""
    ready_fd: int = 4
    """The fd INIT says "ready" on."""


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _tmpfs(folders: Sequence[str]) -> list[str]:
    return [arg for folder in folders for arg in ("--tmpfs", folder)]


def _local_bin(c: BwrapConfig) -> list[str]:
    argv = ["--tmpfs", HELPER_DIR]
    for name, target in c.local_bin:
        dest = f"{HELPER_DIR}/{name}"
        argv += ["--ro-bind", dest, dest] if target is None else ["--symlink", target, dest]
    for name, host in c.helpers:
        argv += ["--ro-bind", host, f"{HELPER_DIR}/{name}"]
    return argv + ["--remount-ro", HELPER_DIR]


def bwrap_argv(c: BwrapConfig) -> list[str]:
    """The argv that starts the agent's sandbox (pure)."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for path in c.keep_run:
        argv += ["--ro-bind-try", path, path]
    argv += _local_bin(c)
    holding_home = [h for h in c.hidden if _within(c.home, h)]  # hidden before the home's bind
    argv += _tmpfs(holding_home) + ["--bind", c.home, c.home, "--bind", c.state, STATE_INSIDE]
    argv += _tmpfs([h for h in c.hidden if h not in holding_home])
    argv += [*NAMESPACES, *([] if c.network else ["--unshare-net"]), "--as-pid-1", "--cap-drop", "ALL",
             "--info-fd", str(c.info_fd), "--chdir", "/", "--",
             c.python, "-I", "-S", "-c", INIT, STATE_INSIDE, f"{c.idle_seconds:g}", str(c.ready_fd)]
    return argv


def enter_argv(pid: int, wd: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs argv inside the sandbox whose init is pid, in wd (pure)."""
    return ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid",
            "--root", f"--wd={wd}", "--",
            "setpriv", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--",
            *argv]


@functools.cache
def unavailable() -> str | None:
    """Why this backend cannot run here, or None when it can (probed once)."""
    if os.geteuid() != 0:
        return "it needs root to enter the sandbox (nsenter)"
    missing = [tool for tool in _TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found"
    return None if succeeds(PROBE) else "bwrap cannot make namespaces here"


def host_local_bin(skip: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """BwrapConfig.local_bin for this host: its /usr/local/bin but the names in skip."""
    try:
        names = sorted(n for n in os.listdir(HELPER_DIR) if n not in skip)
    except OSError:
        return ()
    return tuple((n, _link_target(os.path.join(HELPER_DIR, n))) for n in names)


def _link_target(path: str) -> str | None:
    return os.readlink(path) if os.path.islink(path) else None


def keep_run() -> tuple[str, ...]:
    """BwrapConfig.keep_run for this host: resolv.conf's target when it lies in /run."""
    resolv = os.path.realpath("/etc/resolv.conf")
    return (resolv,) if _within(resolv, "/run") else ()
