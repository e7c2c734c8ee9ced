"""What the container backends (docker, kubernetes) share, as pure functions.

Inside every agent container:

- the container's main process is INIT: it lives while a call is running or
  the idle clock is younger than the idle time, then exits (the idle stop);
  the container's init (docker's ``--init``, the pod's shared pid namespace)
  reaps orphans meanwhile;
- the idle clock: in docker, CLOCK, a root-owned file the engine rewrites
  (``put_archive``) as calls come, which the agent's uid cannot touch; in
  kubernetes, whose writes go through an exec as the agent, no file (the agent
  could touch any such file forever): the last call INIT saw running;
- each call runs as ``exec_argv(argv, timeout)``: ``sh``, then
  ``timeout`` runs argv in a process group of its own, sends
  that group SIGTERM at ``timeout`` seconds and SIGKILL KILL_GRACE_SECONDS
  later. The call's environment carries ``EXEC_ENV=token``, so
  ``kill_argv(token)`` finds every process of the call, setsid escapees too;
- files reach the container as a tar archive (``tar_bytes``): the helpers
  (``helper_files``, root's, read-only to the agent) and repos.json
  (``repos_json``, the agent's) when it is created;
- every process of the agent runs as CONTAINER_UID (``container_owner``), never
  root: the home and the state root are given to that uid.

The container SDKs block: ``blocking`` runs their calls in a thread of a pool
of POOL_THREADS, so that many agents' calls proceed at once.

``exec_status`` turns the exec's raw exit status into the Sandbox contract's:
a process killed by signal N exits 128+N inside a container and is reported
-N (so is a command that *exits* 129..192: the exec API cannot tell them apart).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import json
import os
import posixpath
import secrets
import shlex
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from guilds_code import limits

from ..config.settings import AgentSettings
from ..limits import CONTAINER_CLOCK_POLL_SECONDS, CONTAINER_SEEN_POLL_SECONDS
from ._host_folder import locate
from ._spawn import KILL_GRACE_SECONDS
from .base import Backend
from .helpers import HELPER_PACKAGES, build_bytes, source_digest

STATE_INSIDE = limits.DEFAULT_STATE_DIR
HELPER_DIR = "/usr/local/bin"


def helper_path(name: str) -> str:
    """Where the one-file helper `name` lives inside a container or pod."""
    if name not in HELPER_PACKAGES:
        from ..errors import SandboxError

        raise SandboxError(f"no helper named {name}")
    return f"{HELPER_DIR}/{name}"
CONTAINER_UID = 65532
"""The agent's uid and gid in a container under a root orchestrator: a high uid
no distribution gives a user (distroless images call it "nonroot")."""


def container_owner() -> tuple[int, int]:
    """(uid, gid) of the agent's processes in a container: CONTAINER_UID under a root
    orchestrator, else the orchestrator's own (so that the home it made stays writable)."""
    if os.geteuid() == 0:
        return CONTAINER_UID, CONTAINER_UID
    return os.getuid(), os.getgid()


def folders_of(path: str, root: str) -> list[str]:
    """The folders from root (included) down to path's parent, as tar names (pure)."""
    rel = posixpath.relpath(posixpath.dirname(path), root)
    names, at = [root], root
    for part in ([] if rel == "." else rel.split("/")):
        at = posixpath.join(at, part)
        names.append(at)
    return names


CLOCK = "/run/guilds-clock/active"
"""docker: its mtime is the idle clock, a root-owned file rewritten through the engine."""
EXEC_ENV = "GUILDS_EXEC_ID"
POOL_THREADS = 64
"""Container calls in flight at once across all sandboxes of this process."""
TIMEOUT_EXIT = 124
"""coreutils ``timeout``'s status when it stopped the command with SIGTERM."""
INIT = (
    "import os,sys,time\n"
    "stamp,idle,poll=sys.argv[1],float(sys.argv[2]),float(sys.argv[3])\n"
    "began=seen=time.time()\n"
    "def busy():\n"
    " skip=(1,os.getpid())\n"
    " for p in os.listdir('/proc'):\n"
    "  if p.isdigit() and int(p) not in skip:\n"
    "   try:\n"
    "    with open('/proc/'+p+'/stat','rb') as f:\n"
    "     if f.read().rsplit(b')',1)[1].split()[1]==b'0':return True\n"
    "   except (OSError,IndexError):pass\n"
    " return False\n"
    "def age():\n"
    " if not stamp:return time.time()-seen\n"
    " try:return time.time()-max(os.stat(stamp).st_mtime,began)\n"
    " except OSError:return 0\n"
    "if stamp:\n"
    " try:\n"
    "  open(stamp,'a').close()\n"
    "  os.utime(stamp)\n"
    " except OSError:pass\n"
    "while True:\n"
    " if busy():seen=time.time()\n"
    " elif age()>=idle:break\n"
    " time.sleep(min(idle/4,poll))\n"
)
"""The container's main process. A call is a process whose parent is outside
the container (ppid 0: an exec), so a call longer than the idle time is never
cut; orphans and background commands have a parent inside and do not count.

The idle clock: with a clock file (docker's CLOCK, which only the engine
writes), its mtime; a clock older than INIT's own start counts from that start
(a clock written with whole seconds cannot end a new container at once).
Without one (kubernetes, where every process, the calls' wrapper too, is the
agent's, so any file the wrapper could touch the agent could touch forever),
the last moment INIT saw a call running, looked for every ``poll`` seconds: a
call shorter than that may go unseen, which can only bring the idle stop
earlier, never keep the sandbox."""
_KILL = (
    'pids() { for d in /proc/[0-9]*; do grep -qxzF -- "$0" "$d/environ" 2>/dev/null '
    '&& echo "${d#/proc/}"; done; }; '
    'sig() { for p in $(pids); do kill -s "$1" -- "-$p" 2>/dev/null; kill -s "$1" "$p" 2>/dev/null; '
    'done; }; '
    'sig TERM; n=0; while [ -n "$(pids)" ] && [ "$n" -lt "$1" ]; do sleep 0.1; n=$((n+1)); done; '
    'sig KILL; true'
)


def seconds(value: float) -> str:
    """A duration as coreutils reads it: plain decimal, at most millisecond precision."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def init_argv(python: str, idle_seconds: float, clock: str = "", *, relay: bool = False,
              relay_with: tuple[str, Sequence[str]] | None = None) -> list[str]:
    """The container's command: INIT with the idle clock's file ("": none, the calls
    seen), the idle time and how often it looks; with relay (agent.network a list),
    the egress relay first (``egress_side.relay.RELAY``), or relay_with's (code, its argv[4:])."""
    poll = CONTAINER_CLOCK_POLL_SECONDS if clock else CONTAINER_SEEN_POLL_SECONDS
    if relay or relay_with:
        from .egress_side.relay import RELAY, init_args  # an egress list only: a later call imports none of it

        code, args = relay_with or (RELAY, init_args())
        return [python, "-I", "-S", "-c", code + INIT, clock, seconds(idle_seconds), seconds(poll), *args]
    return [python, "-I", "-S", "-c", INIT, clock, seconds(idle_seconds), seconds(poll)]


def exec_argv(argv: Sequence[str], timeout: float, *, token: str | None = None) -> list[str]:
    """argv wrapped for one call: run under ``timeout``.

    With token (argv's EXEC_ENV value), a call that ran out of time also stops what
    escaped its group (setsid) by that token, before the wrapper exits with timeout's
    status: an exec whose output an escaped process still holds open would otherwise
    never end (kubernetes ends an exec only when every holder of its output closed it).
    """
    run = f'timeout -k {seconds(KILL_GRACE_SECONDS)} {seconds(timeout)} "$@"'
    if token is None:
        return ["/bin/sh", "-c", f"exec {run}", "sh", *argv]
    grace = round(KILL_GRACE_SECONDS * 10)
    reap = (f'{run}; s=$?; case $s in {TIMEOUT_EXIT}|{128 + signal.SIGKILL}) '
            f'/bin/sh -c {shlex.quote(_KILL)} {EXEC_ENV}={token} {grace} </dev/null >/dev/null 2>&1;; esac; '
            'exit $s')
    return ["/bin/sh", "-c", reap, "sh", *argv]


def kill_argv(token: str) -> list[str]:
    """Stop every process (and its group) whose environment holds EXEC_ENV=token:
    SIGTERM, then SIGKILL to what is left KILL_GRACE_SECONDS later."""
    return ["/bin/sh", "-c", _KILL, f"{EXEC_ENV}={token}", str(round(KILL_GRACE_SECONDS * 10))]


def ending_argv(argv: Sequence[str], token: str) -> list[str]:
    """argv run with EXEC_ENV=token in its environment under a shell that, once argv
    exits, stops what is left with that token (``kill_argv``, on its own: the shell
    exits with argv's status at once, holding none of the exec's streams). The shell's
    own environment has no token, so the stop spares it. A long-lived process so run
    ends what it started when its stdin ends, with no second exec to find it."""
    stop = shlex.join(kill_argv(token))
    return ["/bin/sh", "-c", f'"$@"; s=$?; {stop} </dev/null >/dev/null 2>&1 & exit $s',
            "sh", "env", f"{EXEC_ENV}={token}", *argv]


def exec_status(raw: int | None, *, elapsed: float, timeout: float) -> tuple[int | None, bool]:
    """(exit_code, timed_out) from the exec's raw status and how long it took."""
    if raw is None:
        return None, False
    code = -(raw - 128) if 128 < raw <= 128 + 64 else raw
    timed_out = elapsed >= timeout and code in (TIMEOUT_EXIT, -signal.SIGKILL)
    return (-signal.SIGTERM if code == TIMEOUT_EXIT and timed_out else code), timed_out


def tar_bytes(files: Sequence[tuple[str, bytes, int]], *, mtime: int,
              owner: tuple[int, int] = (0, 0), folders: Sequence[str] = ()) -> bytes:
    """A tar of (name relative to /, data, mode) files owned by owner (uid, gid),
    after an entry (mode 0700, same owner) for each of folders; other missing
    folders are made by the extracting side."""
    import tarfile  # files written into a sandbox: a later call writes none

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in folders:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, mtime
            info.uid, info.gid = owner
            tar.addfile(info)
        for name, data, mode in files:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, mtime
            info.uid, info.gid = owner
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def fingerprint(spec: Any) -> str:
    """A short hash of a JSON-able spec: a running container is still right while it matches."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def repos_file(agent_id: str) -> str:
    """repos.json as the sandbox sees it."""
    return f"{STATE_INSIDE}/{agent_id}/repos.json"


def repos_json(settings: AgentSettings, home: str, entries: Mapping[str, Any] | None = None) -> bytes:
    """repos.json: each repository's folder inside -> its token (tokenless ones left out),
    or the entries given (behind the egress proxy, ``Egress.repos_entries``)."""
    tokens = entries if entries is not None else {
        posixpath.join(home, r.path): r.token for r in settings.repos if r.token}
    return json.dumps(tokens, indent=1, sort_keys=True).encode()


@functools.cache
def helper_files() -> tuple[tuple[str, bytes], ...]:
    """(name, script bytes) of each helper, built once per process."""
    return tuple((name, build_bytes(pkg)) for name, pkg in sorted(HELPER_PACKAGES.items()))


@functools.cache
def helpers_digest() -> str:
    """A hash of the helpers' sources (not of a build: nothing is built to be hashed)."""
    digests = "".join(f"{name}:{source_digest(pkg)};" for name, pkg in sorted(HELPER_PACKAGES.items()))
    return hashlib.sha256(digests.encode()).hexdigest()[:16]


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="guilds-container")


async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in the container pool's thread; awaiting it can be cancelled (fn runs on)."""
    return await asyncio.get_running_loop().run_in_executor(_pool(), fn, *args)


class ContainerSandbox(Backend):
    """What the docker and kubernetes sandboxes share: the helpers' place inside,
    and the Sandbox methods, each running the backend's blocking step in the pool:

    - ``exec``: a fresh token (EXEC_ENV) per call, ``_call(argv, env, timeout,
      token)`` beside what ``_beside_call()`` asks for (docker's idle clock);
      cancelled, ``_kill(token)`` stops what the call started before the
      cancellation goes on;
    - ``write_file``: the path checked to lie under the home or the state root,
      then ``_write(path, data)``;
    - ``start`` and ``stop``: ``_start()`` and ``_stop()`` (which names what it removed).
    """

    home: str

    def helper_path(self, name: str) -> str:
        return helper_path(name)

    async def start(self) -> None:
        await blocking(self._start)

    async def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float) -> Any:
        token = secrets.token_hex(8)
        steps = [blocking(self._call, list(argv), dict(env or {}), timeout, token)]
        beside = self._beside_call()
        if beside is not None:
            steps.append(blocking(beside))
        try:
            return (await asyncio.gather(*steps))[0]
        except asyncio.CancelledError:
            await asyncio.shield(blocking(self._kill, token))
            raise

    async def write_file(self, path: str, data: bytes) -> None:
        root, rel = locate(path, {STATE_INSIDE: STATE_INSIDE, self.home: self.home})
        await blocking(self._write, f"{root}/{rel}", data)

    async def stop(self) -> list[str]:
        return await blocking(self._stop)

    def _beside_call(self) -> Callable[[], Any] | None:
        """A blocking step to run beside a call, or None (the default)."""
        return None

    def _start(self) -> None:
        raise NotImplementedError

    def _call(self, argv: list[str], env: dict[str, str], timeout: float, token: str) -> Any:
        raise NotImplementedError

    def _kill(self, token: str) -> None:
        raise NotImplementedError

    def _write(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def _stop(self) -> list[str]:
        raise NotImplementedError
