"""The ``bwrap`` backend: one long-lived bubblewrap sandbox per agent, like a container.

What the sandbox holds: ``bwrap_argv``.

Host files, under the data folder::

    sandboxes/<agent id>.json    the running sandbox: pid and start time of its
                                 init, and the fingerprint of its config
    sandboxes/<agent id>.lock    held (flock) while a process finds or starts it
    sandboxes/<agent id>.log     bwrap's stderr
    sandboxes/<agent id>.clock   the idle clock: its mtime, moved by each call;
                                 read-only inside (the agent cannot keep the sandbox alive)

The state root is not among them: it is a tmpfs of ``bwrap.state_size`` at
/run/guilds in the sandbox's own mount namespace, so the agent cannot fill the
data folder's filesystem (the run record's) through it; it is new and empty
each time a sandbox starts (background ids begin again at b1) and gone when it
ends. Its pages are memory, charged to the memory cgroup of the process that
writes them (the sandbox's, for the agent's commands). The orchestrator reaches
it through ``/proc/<init pid>/root/run/guilds`` (``_state_root``): the init
checked by start time once the handle is open, and nothing there followed if
it is a link (the agent owns that tmpfs).

Who runs inside: the agent's uid (``sandbox_owner``). With a root orchestrator
it is ``bwrap.uid``, else one derived from the agent id (AGENT_UID_BASE plus a
hash: one per agent, so agents cannot read each other's files and the process
limit is the agent's own); the home and the state root are given to that uid
(``own_tree``; the state root's tmpfs by ``fchown`` once the sandbox is up) and
every file the sandbox file API writes too. With an orchestrator that is not
root it is the orchestrator's own uid, in a user namespace. Limits:
``bwrap.pids_limit`` and ``bwrap.memory`` as a cgroup where one can be made
(``_cgroup``), RLIMIT_NPROC always, RLIMIT_AS per process where no cgroup could
be made; ``bwrap.tmp_size`` for /tmp, ``bwrap.state_size`` for the state root.
The home is a host folder, bounded only by its filesystem.

Lifecycle:

- start: ``setsid --fork sh LIMITS bwrap ... python3 -c INIT``. INIT sleeps until the
  idle clock's mtime is older than the idle time, then exits; the kernel then
  kills every process left in the namespace (setsid daemons included). Once it
  is ready, the state root is given to the agent's uid (as root) and repos.json
  written into it.
- found again: any orchestrator process reads the record. Its pid counts while
  that pid's start time matches and the config fingerprint is unchanged;
  otherwise the old sandbox is killed and a new one started. The fingerprint
  holds what is hidden (``bwrap_hide``) and each hidden path's inode: an agent
  that became known, or a hidden settings file replaced on the host, starts
  the sandbox anew at its next call.
- exec: ``nsenter ...`` into the namespaces (it forks into the pid namespace),
  its rlimits and cgroup set in the spawn path's child before it runs
  (``limits_in_child``), then ``setpriv`` (the agent's uid, no capabilities), then argv;
  the agent's environment is nsenter's environment, never its argv. Each exec
  moves the idle clock. An init that ended between the call finding it and
  entering it (its idle stop at that moment): the call, which ran nothing, goes
  to a new sandbox, once (exec's nsenter and the starter's fork alike).
- stop: SIGKILL to the init; the kernel ends the rest.

Needs bwrap, and util-linux's nsenter, setpriv and setsid; as root, or where
the kernel lets unprivileged users make user namespaces. Doctor's lines and the
records ``guilds sandbox list`` shows: ``bwrap_admin``; ``remove()`` removes the
host files above.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ...errors import SandboxError
from ..helpers import CODE_HELPER, HELPER_PACKAGES, cached_helper
from ...config.agents import known as known_agents
from ...config.settings import AgentSettings
from . import _cgroup
from .bwrap_hide import Hiding, hiding, stamp
from ..sandbox_user import SUDO_NAME, sudo_file, write_readable
from .bwrap_users import GROUP, PASSWD, write_users
from .._host_folder import (
    agent_env, checked_id, locate, own_tree, real_python, removed, write_beneath, write_repos,
)
from ...procfs import running
from .._spawn import kill_and_wait, parent_pid, read_until, run_process, spawn_detached, start_time
from . import bwrap_admin as admin
from ..base import Backend, Box, Check, ExecResult
from ..process_channel import LocalProcess, StartedProcess
from .bwrap_starter import Starter, StarterFailed, starter_for
from ..egress_side import Egress
from .bwrap_argv import (
    HELPER_DIR, READY, STATE_INSIDE, BwrapConfig, Limits, bwrap_argv,
    enter_argv, host_local_bin, host_system, keep_run, limited_argv, limits_in_child, python_alias, sandbox_owner,
    sandbox_python,
    unavailable,
)
from ...limits import BWRAP_IDLE_SECONDS_DEFAULT, BWRAP_START_SECONDS

log = logging.getLogger(__name__)

class BwrapSandbox(Backend):
    name = admin.NAME
    own_networks = True
    template_builds = "home"
    own_boot_id = True
    network_true_reach = "the host's loopback services"
    state_dir = STATE_INSIDE

    def __init__(
        self, settings: AgentSettings, data_dir: str | os.PathLike, *,
        idle_seconds: float = BWRAP_IDLE_SECONDS_DEFAULT, path: str | None = None,
    ):
        """idle_seconds: the idle stop; path: the agent's PATH (default: this process's)."""
        self.settings = settings
        self.home = settings.home_inside()
        self._host_home = str(settings.home)
        self.python = sandbox_python() or real_python()
        self.idle_seconds = idle_seconds
        self.uid, self.gid, self._userns = sandbox_owner(settings)
        self._owner = None if self._userns else (self.uid, self.gid)
        self.home_owner = self._owner
        self._data = os.path.realpath(data_dir)
        base, files = admin.host_files(self._data, checked_id(settings))
        self._record, self._lock, self._log, self._clock = map(str, files)
        self._old_state = str(base)  # a host folder an earlier layout kept the state root in
        given, files = admin.host_files(data_dir, settings.id)
        self._kept = [given, *files, given.with_name(f"{settings.id}.etc")]
        """What ``remove()`` removes, named under the data folder as it was given."""
        self._cgroup_name = f"{settings.id}-{hashlib.sha256(self._old_state.encode()).hexdigest()[:8]}"
        self._limits: Limits | None = None
        self._call_limits = Limits(pids=settings.bwrap.pids_limit)
        self._enter_config: BwrapConfig | None = None
        self._env = agent_env(settings, home=self.home, state_dir=STATE_INSIDE,
                              path=path or os.environ.get("PATH"))
        self._helpers: tuple[tuple[str, str], ...] = ()
        self.egress = (Egress(settings, self._data, idle_seconds=idle_seconds, clock=self._clock)
                       if settings.egress else None)
        """agent.network a list: the sandbox's side of the egress proxy (None otherwise)."""
        if self.egress is not None:  # the real values never enter the commands' environment
            self._env.update(self.egress.env())

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> BwrapSandbox:
        """Refused (SandboxError) where bubblewrap does not work, when the settings name it
        (``auto`` has looked before it picked it)."""
        reason = unavailable() if settings.sandbox == cls.name else None
        if reason is not None:
            raise SandboxError(f"agent.sandbox = 'bwrap': bubblewrap does not work here: {reason}")
        if idle_seconds is None:
            return cls(settings, data_dir)
        return cls(settings, data_dir, idle_seconds=idle_seconds)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        return admin.check(needed=needed)

    @classmethod
    def check_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike) -> list[Check]:
        return admin.check_agent(settings, data_dir)

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        """The data folder's records, whichever backend is chosen."""
        return admin.boxes(data_dir)

    async def remove(self) -> list[str]:
        """Stop, then remove the agent's files under the data folder (its state root went
        with the sandbox)."""
        await self.stop()
        return await asyncio.to_thread(lambda: list(removed(self._kept)))

    def helper_path(self, name: str) -> str:
        if name not in HELPER_PACKAGES:
            raise SandboxError(f"no helper named {name}")
        return f"{HELPER_DIR}/{name}"

    async def start(self) -> None:
        await asyncio.to_thread(self._start)

    def init_pid(self) -> int | None:
        """The pid of the running sandbox's init (its mount namespace's), or None."""
        record = self._read_record()
        return record["pid"] if record is not None and running(record["pid"], record["start"]) else None

    def runs_now(self) -> bool:
        """The init its record names runs and is not being killed (two reads of /proc and one
        of the record: no lock, nothing started)."""
        record = self._read_record()
        return record is not None and running(record["pid"], record["start"])

    def _start(self) -> None:
        """The sandbox found or made, then repos.json written again (the tokens may have
        changed since it started). That rewrite failing (a state root the agent filled
        or tampered with) costs no call: the one written before stays, and one warning
        line says what could not be written."""
        pid, start = self._ensure_init()
        try:
            self._write_repos(pid, start)
        except SandboxError as exc:
            log.warning("bwrap: %s; the one written before stays", exc)

    async def exec(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float
    ) -> ExecResult:
        """argv run in the sandbox. An init that ends as the call comes in (its idle stop
        at that moment) never entered argv: a new sandbox runs it, once."""
        for attempt in (1, 2):
            pid, start = await asyncio.to_thread(self._ensure_init)
            result = await self._enter(pid, argv, env, timeout)
            if attempt == 2 or not _ended_before_entry(result, pid, start):
                break
            log.info("bwrap: the sandbox ended as a call came in; the call goes to a new one")
        return result

    async def _enter(self, pid: int, argv: Sequence[str], env: Mapping[str, str] | None,
                     timeout: float) -> ExecResult:
        keep_alive = asyncio.create_task(self._keep_alive())
        try:
            return await run_process(enter_argv(pid, self.home, argv, self._entering()),
                                     env={**self._env, **(env or {})}, cwd="/", timeout=timeout,
                                     in_child=limits_in_child(self._limits_of_a_call()))
        finally:
            keep_alive.cancel()
            self._touch()

    async def open_process(self, argv: Sequence[str]) -> LocalProcess | StartedProcess:
        """argv entered like exec's; the sandbox's idle clock is its own to refresh. A helper
        is forked by this process's starter where it can be (``bwrap_starter``)."""
        return await asyncio.to_thread(self._open_process, list(argv))

    def _open_process(self, argv: list[str]) -> LocalProcess | StartedProcess:
        pid, start = self._ensure_init()
        starter = self._starter(argv)
        if starter is not None:
            try:
                return self._start_by(starter, pid, start, argv)
            except StarterFailed as exc:
                starter.broken = str(exc)
                log.warning("bwrap: helpers are started through nsenter from now on: the starter failed: %s", exc)
        entered = limited_argv(self._process_limits(), enter_argv(pid, self.home, argv, self._entering()))
        return LocalProcess(entered, env=self._env, cwd="/")

    def _start_by(self, starter: Starter, pid: int, start: int, argv: list[str]) -> StartedProcess:
        """The helper forked by the starter; an init that ended as it came in (its idle
        stop at that moment): into a new sandbox, once."""
        try:
            return starter.start(self._start_request(pid, start, argv))
        except SandboxError:
            if start_time(pid) == start:
                raise
        pid, start = self._ensure_init()
        return starter.start(self._start_request(pid, start, argv))

    @property
    def forks_helpers(self) -> bool:
        """Its resident helper is forked warm by this process's starter (a root orchestrator
        with no user namespace, its starter not given up): opening one costs less than a
        one-shot helper entered through nsenter, so ``agent.transport = "auto"`` waits for
        it in the first call rather than send that call by exec (``toolbox.transport``)."""
        return self._usable_starter() is not None

    def _starter(self, argv: list[str]) -> Starter | None:
        """This process's starter of the helper argv runs, where one may start it
        (``_usable_starter``) and argv is ``python -I -S guilds-code ...``."""
        if argv[:4] != [self.python, "-I", "-S", f"{HELPER_DIR}/{CODE_HELPER}"]:
            return None
        return self._usable_starter()

    def _usable_starter(self) -> Starter | None:
        """This process's starter of guilds-code, under a root orchestrator (no user namespace
        of its own) while it has not been given up; else None."""
        if self._userns:
            return None
        starter = starter_for(self.python, self._helper_files()[CODE_HELPER])
        return None if starter.broken else starter

    def _start_request(self, pid: int, start: int, argv: list[str]) -> dict[str, Any]:
        """What the starter's fork needs to enter this sandbox as ``enter_argv`` under
        ``limited_argv`` would (``guilds_code.starter``)."""
        limits = self._process_limits()
        return {"target": pid, "start": start, "uid": self.uid, "gid": self.gid, "cwd": self.home,
                "env": self._env, "argv": argv[4:], "shown_argv": argv, "pids": limits.pids,
                "memory": limits.memory_bytes, "cgroups": list(limits.cgroup_procs)}

    async def _keep_alive(self) -> None:
        """While a call runs, the idle clock stays at zero."""
        while True:
            await asyncio.sleep(min(self.idle_seconds / 4, 60))
            self._touch()

    async def write_file(self, path: str, data: bytes) -> None:
        root, rel = locate(path, {STATE_INSIDE: STATE_INSIDE, self.home: self._host_home})

        def write() -> None:
            pid, start = self._ensure_init()  # first: the state root is the running sandbox's
            if root != STATE_INSIDE:
                write_beneath(root, rel, data, owner=self._owner)
                return
            with _state_root(pid, start) as fd:
                write_beneath(fd, rel, data, owner=self._owner, shown=STATE_INSIDE)

        await asyncio.to_thread(write)

    async def stop(self) -> list[str]:
        """SIGKILL to the init: the kernel ends the rest; nothing is removed."""
        await asyncio.to_thread(self._stop)
        return []

    # --- lifecycle (blocking; run in a thread) --------------------------------
    def _ensure_init(self) -> tuple[int, int]:
        """The running sandbox's init: (pid, start time)."""
        with self._locked():
            config = self._config()  # one for the check and the launch: it reads the known agents
            record, fingerprint = self._read_record(), self._fingerprint(config)
            if record and record["fingerprint"] == fingerprint and _alive(record):
                self._touch()
                return record["pid"], record["start"]
            if record:
                _end(record)
            return self._create(fingerprint, config)

    def _stop(self) -> None:
        with self._locked():
            record = self._read_record()
            if record:
                _end(record)
            Path(self._record).unlink(missing_ok=True)
            _cgroup.remove_cgroup(self._cgroup_name)
            if self.egress is not None:
                self.egress.stop()

    def _create(self, fingerprint: str, config: BwrapConfig) -> tuple[int, int]:
        shutil.rmtree(self._old_state, ignore_errors=True)
        os.makedirs(self._host_home, exist_ok=True)
        if self._owner is not None:
            own_tree(self._host_home, self._owner)
        Path(self._clock).touch(mode=0o644)
        pid = self._launch(config)
        outer, start = parent_pid(pid) or 0, start_time(pid)
        if start is None:
            raise SandboxError(f"bwrap sandbox ended at once: {self._log_tail()}")
        record = {"pid": pid, "start": start, "fingerprint": fingerprint,
                  "outer": [outer, start_time(outer) or 0]}
        try:
            self._give_state_root(pid, start)
        except BaseException:
            _end(record)
            raise
        write_beneath(os.path.dirname(self._record), os.path.basename(self._record),
                      json.dumps(record).encode())
        return pid, start

    def _give_state_root(self, pid: int, start: int) -> None:
        """The new state root made the agent's uid's (as root), then repos.json written."""
        if self._owner is not None:
            with _state_root(pid, start) as fd:
                os.fchown(fd, *self._owner)
        self._write_repos(pid, start)

    def _launch(self, config: BwrapConfig) -> int:
        """Start bwrap; once its init is ready, return the init's pid (bwrap's --info-fd)."""
        (info_r, info_w), (ready_r, ready_w) = os.pipe(), os.pipe()
        try:
            launch_env = {"PATH": self._env["PATH"], "LANG": self._env["LANG"]}
            spawn_detached(self._launch_argv(config, info_w, ready_w), env=launch_env,
                           log_path=self._log, pass_fds=(info_w, ready_w))
            pid = _child_pid(read_until(info_r, timeout=BWRAP_START_SECONDS))
            ready = READY in read_until(ready_r, timeout=BWRAP_START_SECONDS, stop=READY)
        finally:
            os.close(info_r)
            os.close(ready_r)
        if pid is not None and ready:
            return pid
        if pid is not None:
            kill_and_wait(pid, start_time(pid) or 0)
        raise SandboxError(f"bwrap did not start: {self._log_tail()}")

    def _entering(self) -> BwrapConfig:
        """The config as entering needs it (uid, gid, user namespace): made once."""
        if self._enter_config is None:
            self._enter_config = self._config()
        return self._enter_config

    def _launch_argv(self, config: BwrapConfig, info_fd: int, ready_fd: int) -> list[str]:
        """bwrap of config under the sandbox's limits, its init reporting on these fds (its
        /etc/passwd and /etc/group, and its boot id, written now, for it)."""
        launched = replace(config, info_fd=info_fd, ready_fd=ready_fd, users=self._users_files(write=True),
                           boot_id=self._boot_id_file(write=True))
        return limited_argv(self._process_limits(), bwrap_argv(launched))

    def _helper_files(self) -> dict[str, str]:
        """name -> the host file bound at /usr/local/bin/<name> (built into the cache once)."""
        if not self._helpers:
            cache = Path(self._data, "helpers")
            self._helpers = tuple((n, str(cached_helper(cache, n))) for n in HELPER_PACKAGES)
            if self.settings.user is not None:
                self._helpers += ((SUDO_NAME, str(sudo_file(cache))),)
        return dict(self._helpers)

    def _config(self, info_fd: int = 3, ready_fd: int = 4) -> BwrapConfig:
        self._helper_files()
        hidden = self._hiding()
        local_bin = host_local_bin(skip=[name for name, _ in self._helpers])
        if self.settings.user is not None:
            local_bin += python_alias(local_bin, self.python)
        return BwrapConfig(
            home=self._host_home, home_inside=self.home, state_bytes=self.settings.bwrap.state_size,
            clock=self._clock, helpers=self._helpers, uid=self.uid, gid=self.gid, userns=self._userns,
            system=host_system(), local_bin=local_bin,
            hidden=hidden.folders, hidden_files=hidden.files,
            keep_run=keep_run() if self.settings.network else (), network=self.settings.network,
            egress_dir=self.egress.files.shared if self.egress else "",
            tmp_bytes=self.settings.bwrap.tmp_size, python=self.python, users=self._users_files(write=False),
            boot_id=self._boot_id_file(write=False),
            idle_seconds=self.idle_seconds, info_fd=info_fd, ready_fd=ready_fd,
        )

    def _users_files(self, *, write: bool) -> tuple[str, str] | None:
        """The sandbox's /etc/passwd and /etc/group (its uid named), when the host has /etc's;
        written when ``write`` (a launch: the host's read now), else only named."""
        if not (os.path.isfile(PASSWD) and os.path.isfile(GROUP)):
            return None
        folder = Path(self._old_state + ".etc")
        if write:
            return write_users(folder, self.uid, self.gid, self.home, self.settings.user)
        return str(folder / "passwd"), str(folder / "group")

    def _boot_id_file(self, *, write: bool) -> str:
        """The sandbox's kernel boot id (a random UUID, as the kernel's); written anew when
        ``write`` (a launch: each start is a boot of its own), else only named."""
        folder = Path(self._old_state + ".etc")
        if write:
            return write_readable(folder, "boot_id", f"{uuid.uuid4()}\n")
        return str(folder / "boot_id")

    def _hiding(self) -> Hiding:
        """What the sandbox hides: the data folder, and every known agent's home and settings."""
        return hiding(self._host_home, self._data, known_agents(Path(self._data)), host_system())

    def _process_limits(self) -> Limits:
        """The limits every process of the sandbox starts under (the cgroup made
        again when a stop, maybe another process's, removed it)."""
        if self._limits is None or not all(map(os.path.exists, self._limits.cgroup_procs)):
            cfg = self.settings.bwrap
            procs = _cgroup.make_cgroup(self._cgroup_name, memory_bytes=cfg.memory, pids=cfg.pids_limit)
            self._limits = Limits(pids=cfg.pids_limit, memory_bytes=0 if procs else cfg.memory,
                                  cgroup_procs=tuple(sorted(set(procs.values()))))
            self._call_limits = replace(self._limits, cgroup_procs=tuple(
                path for controller, path in procs.items() if controller == "memory"))
        return self._limits

    def _limits_of_a_call(self) -> Limits:
        """A call joins only the memory cgroup: each join costs the kernel a few ms, and
        the process count is already the agent's own by RLIMIT_NPROC (its uid is its own);
        the sandbox's init and all its descendants are in the pids cgroup too."""
        self._process_limits()
        return self._call_limits

    def _fingerprint(self, config: BwrapConfig) -> str:
        """What makes a running sandbox of config still the right one (host /usr/local/bin aside)."""
        stable = replace(config, local_bin=())
        cfg = self.settings.bwrap
        hidden = stamp(Hiding(stable.hidden, stable.hidden_files))
        return hashlib.sha256(json.dumps([bwrap_argv(stable), cfg.pids_limit, cfg.memory, hidden]).encode()).hexdigest()

    def _read_record(self) -> dict | None:
        try:
            record = json.loads(Path(self._record).read_bytes())
            ok = all(isinstance(record.get(k), int) for k in ("pid", "start"))
            return record if ok and isinstance(record.get("fingerprint"), str) else None
        except (OSError, ValueError, AttributeError):
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """An exclusive flock: one process at a time finds, starts or stops the sandbox."""
        os.makedirs(os.path.dirname(self._lock), mode=0o700, exist_ok=True)
        with open(self._lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _touch(self) -> None:
        try:
            os.utime(self._clock)
        except OSError:
            pass

    def _write_repos(self, pid: int, start: int) -> None:
        entries = None if self.egress is None else self.egress.repos_entries()
        with _state_root(pid, start) as fd:
            write_repos(self.settings, state_root=fd, home=self.home, owner=self._owner, shown=STATE_INSIDE,
                        entries=entries)

    def _log_tail(self) -> str:
        try:
            return " ".join(Path(self._log).read_text(errors="replace").splitlines()[-3:])
        except OSError:
            return "(no log)"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def _state_root(pid: int, start: int) -> Iterator[int]:
    """A handle on the state root of the sandbox whose init is pid, started at ``start``:
    /run/guilds in its mount namespace, through ``/proc/<pid>/root``.

    pid is checked to be that init once its root is open (a pid reused meanwhile is
    refused: the handle then cannot be another process's); ``run`` and ``guilds``
    are opened without following a link. SandboxError when it cannot be reached.
    """
    fd = _open_state_root(pid, start)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_state_root(pid: int, start: int) -> int:
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"the bwrap sandbox's state root is out of reach: {exc.strerror}") from exc
    try:
        if start_time(pid) != start:
            raise SandboxError("the bwrap sandbox ended before its state root could be written")
        for part in STATE_INSIDE.strip("/").split("/"):
            fd, parent = os.open(part, _DIR_FLAGS, dir_fd=fd), fd
            os.close(parent)
    except OSError as exc:
        os.close(fd)
        raise SandboxError(f"the bwrap sandbox's state root is out of reach: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ended_before_entry(result: ExecResult, pid: int, start: int) -> bool:
    """nsenter found no namespaces to enter: the init (pid, start) had ended; argv never ran."""
    return (result.exit_code == 1 and not result.stdout and result.stderr.startswith(b"nsenter: cannot open /proc/")
            and start_time(pid) != start)


def _alive(record: dict) -> bool:
    return start_time(record["pid"]) == record["start"]


def _end(record: dict) -> None:
    """Kill the init (the kernel then kills the namespace), then bwrap's outer process."""
    kill_and_wait(record["pid"], record["start"])
    outer = record.get("outer")
    if isinstance(outer, list) and len(outer) == 2 and all(isinstance(n, int) for n in outer):
        kill_and_wait(*outer)


def _child_pid(info: bytes) -> int | None:
    try:
        pid = json.loads(info)["child-pid"]
    except (ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) else None
