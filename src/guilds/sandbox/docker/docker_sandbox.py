"""The ``docker`` backend: one container per agent, through the Docker SDK for Python.

What the container holds: ``docker_spec``; the edge with the engine:
``docker_engine``. The engine is the one DOCKER_HOST names (read when the
first call needs it), else the local socket.

Lifecycle:

- found again by name (``guilds-<agent id>``): a running container whose
  fingerprint label matches the spec (and the helpers' build) is used as it is;
  one with another fingerprint is replaced;
- created on first use: ``containers.create``, the helpers (root's, 0755,
  /usr/local/bin) and repos.json (the agent's, 0600) put in, then ``start``:
  a running container is a ready one. Any number of orchestrator processes
  may do this at once: a create refused with 409 means another made it, and the
  container is waited for until it runs (one left created and not started for
  DOCKER_CREATED_GRACE_SECONDS is taken as abandoned, removed and made again);
  containers are removed by id, never by name, so a process never removes the
  one another has just made;
- a container found ended by its idle stop is replaced silently; one found
  killed (SIGKILL, out of memory, ``docker stop``) fails that call with
  SandboxError saying so, and is removed: the next call starts a new one. The
  home (a host folder) and the state volume survive, so nothing is lost and
  background commands of the old container show ``ended``;
- exec: ``exec_create`` with the agent's environment (never argv), its stream
  read frame by frame (stdout head, stderr tail), then ``exec_inspect`` for
  the exit code. The timeout is enforced inside the
  container (``_container.exec_argv``); an exec cancelled, or silent past its
  timeout plus guilds.limits.DOCKER_DEADLINE_SLACK_SECONDS, has its processes killed by a second exec;
- stop: the container and the state volume are removed (its processes die,
  background ids begin again at b1), each named; the home stays. A container
  another process is removing (409, removal already in progress) is waited for,
  not an error. ``remove()`` has nothing more to remove.

Doctor's line and the containers ``guilds sandbox list`` shows: ``docker_admin``.

The SDK blocks: each step runs in a thread (``_container.blocking``).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import docker

from ...errors import SandboxError
from ...limits import (
    DOCKER_ADOPT_POLL_SECONDS, DOCKER_CREATED_GRACE_SECONDS, DOCKER_DEADLINE_SLACK_SECONDS,
    DOCKER_KILL_WAIT_SECONDS, DOCKER_REMOVAL_WAIT_SECONDS, DOCKER_START_SLACK_SECONDS,
    DOCKER_STOPPING_POLL_SECONDS,
)
from ...config.settings import AgentSettings
from . import docker_admin as admin
from . import docker_engine as engine
from . import docker_spec as spec
from .._host_folder import DEFAULT_PATH, agent_env, checked_id, own_tree
from .._container import (
    CLOCK, EXEC_ENV, HELPER_DIR, STATE_INSIDE, blocking, container_owner, exec_status, fingerprint,
    folders_of, helper_files, ContainerSandbox,
    helpers_digest, kill_argv, repos_file, repos_json, tar_bytes,
)
from .._spawn import KILL_GRACE_SECONDS
from ..base import Box, Check, ExecResult
from ..process_channel import DockerProcess
from .docker_fifos import ChannelFolder, FifoProcess, Fifos
from ..sandbox_user import GROUP, PASSWD, container_files
from ..egress_side import Egress

IN_CONTAINER_TRIES = 4
"""A step refused because the container is gone or not running is tried again this
many times in all (the container found, or made again, each time)."""
REQUESTS_DIR = "requests"
"""Where the transport writes request files under the state root (toolbox/transport.py)."""
CLOCK_REFRESH_FRACTION = 4
"""The idle clock is rewritten when a call comes and it is older than idle / this
(so an idle stop is at most that much early), beside the call, not before it."""
T = TypeVar("T")


class DockerSandbox(ContainerSandbox):
    name = admin.NAME
    own_networks = True
    template_builds = "image"
    state_dir = STATE_INSIDE
    python = spec.PYTHON

    def __init__(self, settings: AgentSettings, *, idle_seconds: float | None = None,
                 base_url: str | None = None, data_dir: str | os.PathLike | None = None):
        """idle_seconds: the idle stop (default docker.idle_minutes); base_url: the engine
        (default: DOCKER_HOST, else the local socket); data_dir: where the egress proxy
        keeps its files (needed when agent.network is a list)."""
        self.settings, self.config = settings, settings.docker
        self.home = settings.home_inside()
        self._host_home = str(settings.home)
        self.agent_id = checked_id(settings)
        self.container = spec.container_name(self.agent_id)
        self.idle_seconds = idle_seconds or self.config.idle_minutes * 60
        self._env = agent_env(settings, home=self.home, state_dir=STATE_INSIDE, path=DEFAULT_PATH)
        self._base_url = base_url
        self._client: docker.DockerClient | None = None
        self._cid: str | None = None
        self._owner = container_owner()
        self.home_owner: tuple[int, int] | None = self._owner if os.geteuid() == 0 else None
        self._clock_at = 0.0
        self._lock = threading.Lock()
        self._channels = None if data_dir is None else ChannelFolder(data_dir, self.agent_id, self._owner)
        """The agent's folder of direct channels (``docker_fifos``): with a data folder."""
        folder = Egress.data_folder(settings, data_dir, self.name)
        self.egress = None if folder is None else Egress(settings, folder, idle_seconds=self.idle_seconds)
        """agent.network a list: the sandbox's side of the egress proxy (None otherwise)."""
        if self.egress is not None:  # the real values never enter the commands' environment
            self._env.update(self.egress.env())

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> DockerSandbox:
        return cls(settings, idle_seconds=idle_seconds, data_dir=data_dir)

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        return admin.check(settings, needed=needed)

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        return admin.boxes(chosen=chosen)

    async def remove(self) -> list[str]:
        """The stop removes the container and the state volume; then the agent's folder of
        direct channels goes too (nothing the agent kept: not named)."""
        removed = await self.stop()
        if self._channels is not None:
            await blocking(self._channels.remove)
        return removed

    def _beside_call(self) -> Callable[[], None] | None:
        """The idle clock's move, when it is due."""
        due = time.monotonic() - self._clock_at >= self.idle_seconds / CLOCK_REFRESH_FRACTION
        return self._move_clock if due else None

    async def open_process(self, argv: Sequence[str]) -> DockerProcess | FifoProcess:
        """One exec; closing it also kills what it started (by token). Its stdin and stdout are
        FIFOs (``docker_fifos``) where the engine runs here, else its attached stream."""
        token = secrets.token_hex(8)
        return await blocking(self._open_process, list(argv), {**self._env, EXEC_ENV: token}, token)

    def _open_process(self, argv: list[str], env: dict[str, str], token: str) -> DockerProcess | FifoProcess:
        fifos: list[Fifos | None] = []  # made once, at the first try that finds the container

        def create(cid: str) -> str:
            if not fifos:
                fifos.append(self._channels.make() if self._channels and self._runs_here(cid) else None)
            run = argv if fifos[0] is None else fifos[0].argv(argv)
            kwargs = spec.exec_spec(cid, run, env=env, home=self.home, timeout=0)
            kwargs.update(cmd=run, stdin=fifos[0] is None)  # no timeout: it lives until its stdin ends
            return self.client.api.exec_create(**kwargs)["Id"]

        try:
            exec_id = self._in_container("exec", create)
            with self._engine("exec"):
                response = engine.attach(self.client.api, exec_id)
        except BaseException:
            if fifos and fifos[0] is not None:
                fifos[0].close()
            raise
        attached = DockerProcess(response, spec.split_frames, lambda: self._kill(token))
        return attached if fifos[0] is None else FifoProcess(fifos[0], attached)

    def _runs_here(self, cid: str) -> bool:
        """The container's process is one of this machine's (``cgroup_pid``): the engine runs
        here, and sees the channel folder this process made."""
        return self._cid == cid and self.cgroup_pid() is not None

    # --- blocking steps (run in the pool) -------------------------------------
    def _start(self) -> None:
        if not self._ensure_created():  # a new container got it when it was made
            files, folders = self._repos_files()
            self._put(files, "write repos.json", folders)

    def _move_clock(self) -> None:
        """Rewrite the idle clock through the engine (root's: the agent cannot touch it).
        Only in the container known now: one made meanwhile starts with a fresh clock,
        and one found gone is the call's to replace."""
        self._clock_at = time.monotonic()
        cid = self._cid
        if cid is None:
            return
        with contextlib.suppress(docker.errors.APIError, SandboxError), self._engine("idle clock"):
            self.client.api.put_archive(cid, "/", tar_bytes([(CLOCK, b"", 0o644)], mtime=int(time.time())))

    def _repos_files(self) -> tuple[list[tuple[str, bytes, int]], list[str]]:
        """repos.json (0600), the state folders above it and the requests folder
        (a missing folder would be made root's by the engine), as ``_put`` takes them."""
        name = repos_file(self.agent_id)
        folders = [*folders_of(name, STATE_INSIDE), f"{STATE_INSIDE}/{REQUESTS_DIR}"]
        entries = None if self.egress is None else self.egress.repos_entries()
        return [(name, repos_json(self.settings, self.home, entries), 0o600)], folders

    def _write(self, path: str, data: bytes) -> None:
        self._put([(path, data, 0o600)], f"write_file {path}")

    def _call(self, argv: list[str], env: dict[str, str], timeout: float, token: str) -> ExecResult:
        result = self._call_once(argv, env, timeout, token)
        if spec.not_started(result.exit_code, result.stdout):  # the container stopped under it
            self._cid = None
            result = self._call_once(argv, env, timeout, token)
        return result

    def _call_once(self, argv: list[str], env: dict[str, str], timeout: float, token: str) -> ExecResult:
        exec_id = self._exec_create(argv, {**self._env, **env, EXEC_ENV: token}, timeout)
        began = time.monotonic()
        out, err, complete = self._stream(
            exec_id, began + timeout + KILL_GRACE_SECONDS + DOCKER_DEADLINE_SLACK_SECONDS)
        raw = self._exit_code(exec_id) if complete else None
        code, timed_out = exec_status(raw, elapsed=time.monotonic() - began, timeout=timeout)
        if not complete or timed_out:
            self._kill(token)  # what escaped the process group (setsid) goes too
        if raw is None and complete or (code is not None and code < 0 and not timed_out):
            self._check_running()
        return ExecResult(code, out, err, timed_out or not complete)

    def _exec_create(self, argv: list[str], env: dict[str, str], timeout: float) -> str:
        def create(cid: str) -> str:
            kwargs = spec.exec_spec(cid, argv, env=env, home=self.home, timeout=timeout)
            return self.client.api.exec_create(**kwargs)["Id"]

        return self._in_container("exec", create)

    def _in_container(self, what: str, step: Callable[[str], T]) -> T:
        """step(container id); again, up to IN_CONTAINER_TRIES times, after finding the
        container gone or not running (``_ensure`` then says why, or makes a new one after
        an idle stop; a container still stopping is waited for a moment)."""
        for attempt in range(1, IN_CONTAINER_TRIES + 1):
            with self._engine(what):
                try:
                    return step(self._ensure())
                except docker.errors.APIError as exc:
                    if attempt == IN_CONTAINER_TRIES or exc.status_code not in (404, 409):
                        raise
            self._cid = None
            time.sleep(DOCKER_STOPPING_POLL_SECONDS * (attempt - 1))
        raise AssertionError("unreachable")

    def _stream(self, exec_id: str, deadline: float) -> tuple[bytes, bytes, bool]:
        api = self.client.api
        with self._engine("exec"):
            return engine.exec_stream(api, exec_id, deadline, lambda: engine.exited(api, exec_id))

    def _exit_code(self, exec_id: str) -> int | None:
        with self._engine("exec"):
            return engine.exit_code(self.client.api, exec_id)

    def cgroup_pid(self) -> int | None:
        """The container's first process as this machine sees it, when the engine runs here:
        its pid by the engine, taken only when that process's cgroup names the container (an
        engine elsewhere, or in a namespace of its own, gives a pid of no process here)."""
        found = self._find()
        if found is None or not found.get("State", {}).get("Running"):
            return None
        pid = int(found["State"].get("Pid") or 0)
        try:
            cgroups = Path(f"/proc/{pid}/cgroup").read_text() if pid > 0 else ""
        except OSError:
            return None
        return pid if found["Id"] in cgroups else None

    def _check_running(self) -> None:
        """After a call that ended by a signal: was it the whole container?"""
        with self._engine("inspect"):
            state = self.client.api.inspect_container(self.container)["State"]
        if not state.get("Running"):
            self._cid = None
            raise SandboxError(spec.ended_text(self.container, state, self.config))

    def _kill(self, token: str) -> None:
        with contextlib.suppress(SandboxError, docker.errors.APIError):
            exec_id = self.client.api.exec_create(self._cid or self.container, kill_argv(token))["Id"]
            self._stream(exec_id, time.monotonic() + DOCKER_KILL_WAIT_SECONDS)

    def _put(self, files: list[tuple[str, bytes, int]], what: str, folders: Sequence[str] = ()) -> None:
        """Files (and folders) the agent's, written through the engine."""
        archive = tar_bytes(files, mtime=int(time.time()), owner=self._owner, folders=folders)
        if not self._in_container(what, lambda cid: self.client.api.put_archive(cid, "/", archive)):
            raise SandboxError(f"docker: {what}: the engine refused the archive")

    def _stop(self) -> list[str]:
        removed = []
        with self._lock, self._engine("stop"):
            self._cid = None
            volume = spec.state_volume(self.agent_id)
            if self._remove_named():
                removed.append(f"container {self.container}")
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_volume(volume, force=True)
                removed.append(f"volume {volume}")
            if self.egress is not None:
                self.egress.stop()
            if self._channels is not None:
                self._channels.clear()
            self._client, client = None, self._client
            if client is not None:
                client.close()  # its pooled connections; a later call connects again
        return removed

    def _remove_named(self) -> bool:
        """Remove the agent's container (the stop); True when the engine answered this call's
        removal as done (it may answer so to more than one racing removal). One
        gone is no error, nor one another process is removing (409): that removal is
        waited for, so the state volume is no longer in use when the stop removes it."""
        try:
            self.client.api.remove_container(self.container, force=True)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or "already in progress" not in str(exc.explanation or exc):
                raise
            deadline = time.monotonic() + DOCKER_REMOVAL_WAIT_SECONDS
            while self._find() is not None:
                if time.monotonic() > deadline:
                    raise
                time.sleep(DOCKER_ADOPT_POLL_SECONDS)
            return False
        return True

    # --- finding and creating the container -----------------------------------
    def _ensure(self) -> str:
        if self._cid is None:
            self._ensure_created()
        assert self._cid is not None
        return self._cid

    def _ensure_created(self) -> bool:
        """Find the running container or make it; True when it was made now (by this process)."""
        with self._lock:
            kwargs = self._spec()
            deadline = time.monotonic() + DOCKER_CREATED_GRACE_SECONDS + DOCKER_START_SLACK_SECONDS
            while time.monotonic() < deadline:
                found = self._find()
                if found is None:
                    made = self._create(kwargs)
                    if made is not None:
                        self._cid = made
                        return True
                    continue  # another process made it meanwhile: adopt it
                if self._adopt(found, kwargs["labels"]):
                    return False
            raise SandboxError(f"docker: the container {self.container} did not start in "
                               f"{DOCKER_CREATED_GRACE_SECONDS + DOCKER_START_SLACK_SECONDS:g} s")

    def _adopt(self, found: dict[str, Any], labels: dict[str, str]) -> bool:
        """Take the found container if it runs with our spec; wait while another process
        sets it up; remove it (by id) when it ended, is stale or was abandoned."""
        state = found["State"]
        same = spec.our_labels(found) == labels
        if same and state.get("Running"):
            self._cid = found["Id"]
            return True
        if same and spec.being_set_up(found, DOCKER_CREATED_GRACE_SECONDS):
            time.sleep(DOCKER_ADOPT_POLL_SECONDS)
            return False
        self._remove(found["Id"])
        ended = found["State"].get("Status") == "exited" and not spec.idle_stopped(state)
        if ended and same:
            raise SandboxError(spec.ended_text(self.container, state, self.config))
        return False

    def _remove(self, cid: str) -> None:
        """Remove a container by id; one already gone or being removed is no error."""
        with self._engine("remove"):
            try:
                self.client.api.remove_container(cid, force=True)
            except docker.errors.APIError as exc:
                if exc.status_code not in (404, 409):
                    raise

    def _spec(self) -> dict[str, Any]:
        base_env = {k: v for k, v in self._env.items() if k not in self.settings.secrets}
        kwargs = spec.container_spec(self.config, agent_id=self.agent_id, home=self._host_home, inside=self.home,
                                     network=self.settings.network, idle_seconds=self.idle_seconds,
                                     base_env=base_env, user=self._owner,
                                     egress_dir=self.egress.files.shared if self.egress else "",
                                     channel_dir=str(self._channels.path) if self._channels else "")
        stamp = fingerprint([kwargs, helpers_digest()])
        kwargs["labels"][spec.LABEL_FINGERPRINT] = stamp
        return kwargs

    def _find(self) -> dict[str, Any] | None:
        with self._engine("inspect"):
            try:
                return self.client.api.inspect_container(self.container)
            except docker.errors.NotFound:
                return None

    def _create(self, kwargs: dict[str, Any]) -> str | None:
        """Create, fill and start the container; None when another process created it first."""
        os.makedirs(self._host_home, exist_ok=True)
        if self._channels is not None:  # before the engine binds it (it would make it root's, 0755)
            self._channels.ensure()
        if os.geteuid() == 0:
            own_tree(self._host_home, self._owner)
        with self._engine("create the container"):
            try:
                cid = self.client.containers.create(**kwargs).id
            except docker.errors.ImageNotFound:
                raise SandboxError(
                    f"docker: image {self.config.image!r} not found: build it with "
                    "`guilds sandbox image` (or pull it), or set docker.image") from None
            except docker.errors.APIError as exc:
                if exc.status_code == 409:
                    return None
                raise
            try:
                self._fill_and_start(cid)
            except docker.errors.NotFound:
                return None  # another process removed it meanwhile: look again
        self._clock_at = time.monotonic()
        return cid

    def _fill_and_start(self, cid: str) -> None:
        """The helpers and the idle clock (root's), the user's names and sudo (a template's
        user), repos.json (the agent's), then start."""
        helpers = [(f"{HELPER_DIR}/{n}", data, 0o755) for n, data in helper_files()]
        helpers.append((CLOCK, b"", 0o644))
        if self.settings.user is not None:
            passwd, group = (self._image_file(cid, path) for path in (PASSWD, GROUP))
            helpers += container_files(passwd, group, *self._owner, self.settings.user)
        self.client.api.put_archive(cid, "/", tar_bytes(helpers, mtime=int(time.time())))
        files, folders = self._repos_files()
        self.client.api.put_archive(cid, "/", tar_bytes(
            files, mtime=int(time.time()), owner=self._owner, folders=folders))
        self.client.api.start(cid)

    def _image_file(self, cid: str, path: str) -> str:
        """A text file of the created container's image ("" where it has none)."""
        try:
            stream, _ = self.client.api.get_archive(cid, path)
        except docker.errors.NotFound:
            return ""
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            found = tar.extractfile(member) if member is not None else None
            return "" if found is None else found.read().decode("utf-8", "surrogateescape")

    # --- the engine -------------------------------------------------------------
    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with self._engine("connect"):
                self._client = engine.connect(self._base_url)
        return self._client

    def _engine(self, what: str) -> contextlib.AbstractContextManager[None]:
        return engine.engine_errors(what, self._base_url)
