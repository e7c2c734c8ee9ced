"""The bwrap sandbox's argv, built as pure functions of a config.

Inside (each with its reason in docs/sandboxes.md):

- only what a toolchain needs of the host, read-only: ``/usr``, ``/etc``,
  ``/opt`` and ``/nix`` where they exist, and ``/bin``, ``/sbin``, ``/lib*``
  (links into ``/usr`` on a merged-/usr host); not ``/root``, ``/home``,
  ``/var``, ``/srv``, ``/mnt``, ``/tmp`` nor ``/run`` of the host, so no data
  folder, no other agent and no host socket is there to be reached; what the
  bound folders hold of the agents (the data folder, other agents' homes, every
  settings file) hidden behind an empty tmpfs or /dev/null (``bwrap_hide``);
- the home bound writable at its own path (or at ``home_inside``: a template's user,
  ``AgentSettings.user``); the state root at ``/run/guilds``, a
  tmpfs of ``state_bytes`` in the sandbox's own mount namespace (off the data
  folder's filesystem, gone with the sandbox); the idle clock, a host file,
  read-only at ``/run/guilds-clock``;
- fresh ``/proc`` with ``/proc/sys`` (and ``/proc/sysrq-trigger``) bound
  read-only over it, and the sandbox's own kernel boot id (a host file written
  anew at each start) read-only over ``/proc/sys/kernel/random/boot_id``;
  ``/dev`` with the usual device nodes; sized tmpfs ``/tmp`` and ``/dev/shm``;
  ``/``, ``/dev`` and ``/run`` remounted read-only;
- the helpers read-only at ``/usr/local/bin/<name>`` (a tmpfs there
  re-exposes the host's entries);
- own pid, ipc and uts namespaces; the network off (``--unshare-net``) unless
  ``agent.network`` is true; with a list, the egress proxy's socket folder
  read-only at ``/run/guilds-egress`` and INIT running the relay to it
  (``egress_side.relay.RELAY``);
- every process runs as ``uid``/``gid`` on the host, with no capabilities and
  no new privileges. Two ways, by who the orchestrator is:
  *root*: bwrap runs privileged (no user namespace) and ``setpriv`` drops to
  the agent's own uid before INIT and before each command;
  *not root* (``userns``): bwrap makes a user namespace mapping only the
  orchestrator's uid, and every process inside is that uid.

``limited_argv`` puts a command under the sandbox's limits: RLIMIT_NPROC
(and RLIMIT_AS where no memory cgroup exists), then into its cgroups.
``enter_argv`` runs a command in the running sandbox: ``nsenter`` into its
namespaces (it forks into the pid namespace), then ``setpriv``.
"""

from __future__ import annotations

import functools
import os
import posixpath
import shutil
from dataclasses import dataclass
from typing import Collection, Sequence

from ...config.settings import AgentSettings
from ...config.uids import AGENT_UID_BASE as AGENT_UID_BASE
from ...config.uids import AGENT_UID_SPAN as AGENT_UID_SPAN
from ...config.uids import agent_uid
from ...limits import BWRAP_IDLE_SECONDS_DEFAULT
from .._spawn import succeeds
from ..egress_side.files import EGRESS_INSIDE
from ..egress_side.relay import RELAY, init_args

STATE_INSIDE = "/run/guilds"
BOOT_ID_INSIDE = "/proc/sys/kernel/random/boot_id"
"""The kernel's boot id; a sandbox's own there, new at each start (a boot of its own)."""
CLOCK_INSIDE = "/run/guilds-clock"
"""The idle clock inside: a host file bound read-only, so the agent cannot move it."""
HELPER_DIR = "/usr/local/bin"
SYSTEM_DIRS = ("/usr", "/etc", "/opt", "/nix")
"""Host folders a toolchain needs, bound read-only where they exist."""
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Bound as they are on the host: a link (merged /usr) or a folder."""
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
"""Device nodes of the user-namespace sandbox's /dev (bwrap's --dev needs a
second user namespace there, which nsenter could not enter whole)."""
SHM_BYTES = 64 << 20
"""/dev/shm: as much as Docker gives a container."""
SMALL_TMPFS_BYTES = 1 << 20
"""/run and /dev hold only mount points and nodes; read-only once made."""
INIT = (
    "import _signal,posix,sys,time\n"
    "clock,idle,ready=sys.argv[1],float(sys.argv[2]),int(sys.argv[3])\n"
    "try:\n"
    " import _ctypes\n"
    " _ctypes.call_function(_ctypes.dlsym(_ctypes.dlopen(None),'prctl'),(4,0,0,0,0))\n"
    "except AttributeError:\n"
    " import ctypes\n"
    " ctypes.CDLL(None).prctl(4,0,0,0,0)\n"
    "def reap(*_):\n"
    " try:\n"
    "  while posix.waitpid(-1,posix.WNOHANG)[0]:pass\n"
    " except ChildProcessError:pass\n"
    "_signal.signal(_signal.SIGCHLD,reap)\n"
    "posix.write(ready,b'ready\\n')\n"
    "posix.close(ready)\n"
    "while time.time()-posix.stat(clock).st_mtime<idle:\n"
    " reap()\n"
    " time.sleep(min(idle/4,30))\n"
)
"""The sandbox's init, pid 1 of its namespace (``--as-pid-1``): made
undumpable (prctl PR_SET_DUMPABLE 0: the agent's processes, of the same uid,
cannot ptrace it), reaps every orphan as it ends, says "ready" on an fd (the
mounts are then in place), and lives while the clock's mtime is younger than
idle seconds. When it exits the kernel kills every process left in the namespace.

It imports only modules built into the interpreter (``_signal``, ``posix``,
``_ctypes``; ``ctypes`` itself only where ``_ctypes`` lacks ``call_function``):
``signal``, ``os`` and ``ctypes`` would cost each idle sandbox about 1.5 MiB
more (``enum`` and the rest they import)."""
READY = b"ready"
NAMESPACES = ("--unshare-pid", "--unshare-ipc", "--unshare-uts")
ROOT_CAPS = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
             "--cap-add", "CAP_SETPCAP")
"""What INIT keeps as root, only to become the agent's uid at once (setpriv)."""
LIMITS_SCRIPT = (
    'ulimit -p "$1" || exit 125; [ "$2" = 0 ] || ulimit -v "$2" || exit 125; shift 2; '
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
)
"""sh: RLIMIT_NPROC, RLIMIT_AS (KiB; 0: none), join each cgroup.procs given, exec the rest."""
_TOOLS = ("bwrap", "nsenter", "setpriv", "setsid")


@dataclass(frozen=True)
class BwrapConfig:
    """Everything the sandbox's bwrap argv depends on."""

    home: str
    """Host folder of the home, bound writable at the same path (or at home_inside)."""
    state_bytes: int
    """The size of the state root, a tmpfs at /run/guilds (0700; the orchestrator gives
    it to the agent's uid once the sandbox is up: bwrap cannot name an owner)."""
    clock: str
    """Host file of the idle clock, bound read-only at /run/guilds-clock."""
    helpers: tuple[tuple[str, str], ...]
    """(name, host file) bound read-only at /usr/local/bin/<name>."""
    python: str
    """The python3 that runs INIT (and the helpers) inside."""
    uid: int
    gid: int
    """The host uid and gid of every process inside."""
    userns: bool = False
    """True when the orchestrator is not root: a user namespace maps only uid."""
    system: tuple[tuple[str, str | None], ...] = ()
    """The host's SYSTEM_DIRS and SYSTEM_LINKS that exist: (path, link target or None)."""
    local_bin: tuple[tuple[str, str | None], ...] = ()
    """The host's /usr/local/bin entries: (name, link target, or None for a file)."""
    hidden: tuple[str, ...] = ()
    """Host folders hidden behind an empty tmpfs where a bound folder holds them: the data
    folder, other agents' homes, folders of settings files (``bwrap_hide``)."""
    hidden_files: tuple[str, ...] = ()
    """Host files hidden behind /dev/null (settings files ``bwrap_hide`` cannot hide by folder)."""
    keep_run: tuple[str, ...] = ()
    """Host paths under /run bound back read-only (resolv.conf's target)."""
    network: bool = False
    egress_dir: str = ""
    """agent.network a list: the host folder of the egress proxy's socket, bound read-only
    at EGRESS_INSIDE, and INIT runs the relay to it (the network stays off)."""
    users: tuple[str, str] | None = None
    """Host files bound read-only over /etc/passwd and /etc/group (``bwrap_users``), or none."""
    home_inside: str = ""
    """Where the home is inside; empty: its host path."""
    boot_id: str = ""
    """Host file bound read-only over BOOT_ID_INSIDE; empty: the machine's is seen."""

    @property
    def inside(self) -> str:
        """The home's path inside."""
        return self.home_inside or self.home
    tmp_bytes: int = 1 << 30
    """The size of /tmp."""
    idle_seconds: float = BWRAP_IDLE_SECONDS_DEFAULT
    info_fd: int = 3
    """The fd bwrap reports its child's pid on (--info-fd)."""
    ready_fd: int = 4
    """The fd INIT says "ready" on."""


@dataclass(frozen=True)
class Limits:
    """What ``limited_argv`` puts a command under."""

    pids: int
    """RLIMIT_NPROC: processes of the uid (per agent: its uid or its user namespace is its own)."""
    memory_bytes: int = 0
    """RLIMIT_AS per process; 0 where a memory cgroup bounds the whole sandbox instead."""
    cgroup_procs: tuple[str, ...] = ()
    """cgroup.procs files the command joins (pids and memory), when they could be made."""


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _tmpfs(folders: Sequence[str]) -> list[str]:
    return [arg for folder in folders for arg in ("--tmpfs", folder)]


def _sized(path: str, size: int, perms: str = "0755") -> list[str]:
    return ["--perms", perms, "--size", str(size), "--tmpfs", path]


def _system(c: BwrapConfig) -> list[str]:
    argv: list[str] = []
    for path, target in c.system:
        argv += ["--ro-bind", path, path] if target is None else ["--symlink", target, path]
    return argv


def _dev(c: BwrapConfig) -> list[str]:
    if not c.userns:
        return ["--dev", "/dev"]
    argv = _sized("/dev", SMALL_TMPFS_BYTES)
    for name in DEVICES:
        argv += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        argv += ["--symlink", target, f"/dev/{name}"]
    return argv


def _kernel(c: BwrapConfig) -> list[str]:
    """Fresh /proc; its knobs read-only (the uid alone already cannot write them)."""
    own_boot_id = ["--ro-bind", c.boot_id, BOOT_ID_INSIDE] if c.boot_id else []
    return ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
            "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger", *own_boot_id]


_MOUNTED = ("/", "/tmp", "/run", "/dev", "/dev/shm", "/proc", HELPER_DIR)


def parent_folders(home: str, system: Sequence[tuple[str, str | None]]) -> list[str]:
    """The home's parent folders the sandbox makes 0755 itself, outermost first: those
    neither mounted fresh (``/tmp``, ``/run``...) nor under a bound system folder."""
    if not posixpath.isabs(home):
        raise ValueError(f"the home must be an absolute path, got {home!r}")
    parents: list[str] = []
    path = posixpath.dirname(home.rstrip("/"))
    while path not in _MOUNTED and not any(_within(path, p) for p, _ in system):
        parents.insert(0, path)
        path = posixpath.dirname(path)
    return parents


def made_anew(home: str, system: Sequence[tuple[str, str | None]]) -> tuple[str, ...]:
    """The folders on the way to the home whose host modes do not count inside (the sandbox
    makes them: fresh mounts and ``parent_folders``); every other folder on the way is
    the host's, bound with its host mode, which the agent's uid must be able to pass."""
    return (*_MOUNTED, *parent_folders(home, system))


def _parents(c: BwrapConfig) -> list[str]:
    """The home's parent folders made 0755 (bwrap would copy the host's modes,
    and a 0700 parent of root's would shut the agent's uid out of its home)."""
    return [arg for p in parent_folders(c.inside, c.system) for arg in ("--perms", "0755", "--dir", p)]


def _local_bin(c: BwrapConfig) -> list[str]:
    argv = ["--tmpfs", HELPER_DIR]
    for name, target in c.local_bin:
        dest = f"{HELPER_DIR}/{name}"
        argv += ["--ro-bind", dest, dest] if target is None else ["--symlink", target, dest]
    for name, host in c.helpers:
        argv += ["--ro-bind", host, f"{HELPER_DIR}/{name}"]
    return argv + ["--remount-ro", HELPER_DIR]


def drop_argv(c: BwrapConfig) -> list[str]:
    """setpriv: to the agent's uid (as root), no capabilities, no new privileges."""
    if c.userns:  # the uid is already the agent's; an exec as it drops every capability
        return ["setpriv", "--no-new-privs", "--inh-caps=-all", "--"]
    return ["setpriv", f"--reuid={c.uid}", f"--regid={c.gid}", "--clear-groups",
            "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"]


def bwrap_argv(c: BwrapConfig) -> list[str]:
    """The argv that starts the agent's sandbox (pure)."""
    argv = ["bwrap", *(["--unshare-user"] if c.userns else []), *_system(c), *_dev(c),
            *_sized("/dev/shm", SHM_BYTES, "1777"), *_kernel(c),
            *_sized("/tmp", c.tmp_bytes, "1777"), *_sized("/run", SMALL_TMPFS_BYTES)]
    for path in c.keep_run:
        argv += ["--ro-bind-try", path, path]
    if c.egress_dir:
        argv += ["--ro-bind", c.egress_dir, EGRESS_INSIDE]
    argv += _local_bin(c)
    holding_home = [h for h in c.hidden if _within(c.home, h)]  # hidden before the home's bind
    argv += _tmpfs(holding_home) + _parents(c) + [
        "--bind", c.home, c.inside, *_sized(STATE_INSIDE, c.state_bytes, "0700"),
        "--ro-bind", c.clock, CLOCK_INSIDE]
    if c.users is not None:
        argv += ["--ro-bind", c.users[0], "/etc/passwd", "--ro-bind", c.users[1], "/etc/group"]
    argv += _tmpfs([h for h in c.hidden if h not in holding_home])
    for path in c.hidden_files:
        argv += ["--ro-bind", "/dev/null", path]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/run", "--remount-ro", "/"]
    argv += [*NAMESPACES, *([] if c.network else ["--unshare-net"]), "--as-pid-1",
             *(["--cap-drop", "ALL"] if c.userns else ROOT_CAPS),
             "--info-fd", str(c.info_fd), "--chdir", "/", "--", *drop_argv(c),
             c.python, "-I", "-S", "-c", RELAY + INIT if c.egress_dir else INIT,
             CLOCK_INSIDE, f"{c.idle_seconds:g}", str(c.ready_fd), *(init_args() if c.egress_dir else [])]
    return argv


def limits_in_child(limits: Limits):
    """What ``limited_argv`` does, as a function for the child of the spawn path to run
    before exec (no ``sh`` to start for each call): the rlimits, then each cgroup joined.
    A cgroup gone meanwhile (a stop elsewhere) is skipped: the rlimits still hold."""
    import resource

    def in_child() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.pids, limits.pids))
        if limits.memory_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        pid = str(os.getpid()).encode()
        for procs in limits.cgroup_procs:
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)
            except OSError:
                pass

    return in_child


DIE_WITH_PARENT = ("setpriv", "--pdeathsig=TERM", "--")
"""Run what follows with SIGTERM as its parent-death signal."""


def limited_argv(limits: Limits, argv: Sequence[str]) -> list[str]:
    """argv under the limits: ``sh`` sets the rlimits, joins the cgroups, then execs argv (pure)."""
    return ["/bin/sh", "-c", LIMITS_SCRIPT, "guilds-limits", str(limits.pids),
            str(limits.memory_bytes // 1024), *limits.cgroup_procs, "--", *argv]


def enter_argv(pid: int, wd: str, argv: Sequence[str], c: BwrapConfig) -> list[str]:
    """The argv that runs argv inside the sandbox whose init is pid, in wd (pure).

    After the drop to the agent's uid (which clears a parent-death signal), a second
    ``setpriv`` asks for SIGTERM when nsenter ends: nsenter itself gets one when the
    orchestrator dies (the spawn path's), so the helper and its command stop with it."""
    user = ["--user", "--preserve-credentials"] if c.userns else []
    return ["nsenter", f"--target={pid}", *user, "--mount", "--uts", "--ipc", "--net", "--pid",
            "--root", f"--wdns={wd}", "--", *drop_argv(c), *DIE_WITH_PARENT, *argv]


@functools.cache
def unavailable() -> str | None:
    """Why this backend cannot run here, or None when it can (probed once).

    As root, privileged bwrap; otherwise bwrap in a user namespace, which the
    kernel must allow to unprivileged users.
    """
    missing = [tool for tool in _TOOLS if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not found"
    if not succeeds(probe_argv(userns=os.geteuid() != 0)):
        return "bwrap cannot make namespaces here" + (
            "" if os.geteuid() == 0 else " (unprivileged user namespaces are off)")
    return None


def probe_argv(*, userns: bool) -> list[str]:
    return ["bwrap", *(["--unshare-user"] if userns else []), "--ro-bind", "/", "/",
            "--proc", "/proc", *NAMESPACES, "--unshare-net", "--cap-drop", "ALL", "true"]


def host_system() -> tuple[tuple[str, str | None], ...]:
    """BwrapConfig.system for this host: which of SYSTEM_DIRS and SYSTEM_LINKS exist, and how."""
    found: list[tuple[str, str | None]] = []
    for path in (*SYSTEM_DIRS, *SYSTEM_LINKS):
        if os.path.islink(path):
            found.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((path, None))
    return tuple(found)


def host_local_bin(skip: Collection[str]) -> tuple[tuple[str, str | None], ...]:
    """BwrapConfig.local_bin for this host: its /usr/local/bin but the names in skip."""
    try:
        names = sorted(n for n in os.listdir(HELPER_DIR) if n not in skip)
    except OSError:
        return ()
    return tuple((n, _link_target(os.path.join(HELPER_DIR, n))) for n in names)


def python_alias(local_bin: tuple[tuple[str, str | None], ...], python: str | None,
                 system_bins: Sequence[str] = ("/usr/bin", "/bin")) -> tuple[tuple[str, str | None], ...]:
    """``python`` as a link to the sandbox's python3 in /usr/local/bin, where the host has no
    ``python`` of its own there or in system_bins (E2B's user expects one: its images have it)."""
    if python is None or any(name == "python" for name, _ in local_bin) \
            or any(os.path.lexists(os.path.join(folder, "python")) for folder in system_bins):
        return ()
    return (("python", python),)


def _link_target(path: str) -> str | None:
    return os.readlink(path) if os.path.islink(path) else None


def keep_run() -> tuple[str, ...]:
    """BwrapConfig.keep_run for this host: resolv.conf's target when it lies in /run."""
    resolv = os.path.realpath("/etc/resolv.conf")
    return (resolv,) if _within(resolv, "/run") else ()


def sandbox_python(candidates: Sequence[str] = ("/usr/bin/python3", "/usr/local/bin/python3")) -> str | None:
    """A python3 under the bound system folders (the orchestrator's own may live in a
    home the agent's uid cannot enter), as a path that resolves inside; None if none."""
    for path in candidates:
        real = os.path.realpath(path)
        if os.access(real, os.X_OK) and any(_within(real, d) for d in SYSTEM_DIRS):
            return path
    return None


def sandbox_owner(settings: AgentSettings) -> tuple[int, int, bool]:
    """(uid, gid, user namespace?) of the agent's processes."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid(), True
    uid = settings.bwrap.uid or agent_uid(settings.id)
    return uid, uid, False
