"""The sandbox seam: anything that can run an argv and write a file.

Contract every backend keeps (the conformance suite in tests/ checks it):

- ``start()`` makes the sandbox ready (idempotent; call it before the rest):
  the home exists, the helpers are installed at ``helper_path(name)``, the
  state root exists with ``<agent id>/repos.json`` (mode 0600) written. Found
  again by agent id where the backend is long-lived (a later orchestrator
  process reaches the same running sandbox); recreated by the next call if it
  ended (idle stop, machine restart).
- ``exec(argv, env=..., timeout=...)`` runs argv inside the sandbox, in the
  home, with the agent's environment (HOME, PORT, the port block, the secrets,
  GUILDS_STATE_DIR) plus ``env``; stdin closed. Past ``timeout`` seconds the
  process and its process group are killed (SIGTERM, then SIGKILL a grace
  later) and ``timed_out`` is set; a process killed by signal N has ``exit_code`` -N.
  Secret values travel in the environment, never in argv. Run the helper as
  ``[sandbox.python, "-I", "-S", sandbox.helper_path("guilds-code"), ARG]``.
- ``write_file(path, data)`` writes a file inside the sandbox (path as the
  sandbox sees it), atomically, mode 0600: the "sandbox file API".
  Only paths under the home or the state root; a link inside is never followed.
- ``open_process(argv)`` starts argv as one long-lived process inside the
  sandbox, in the home, with the agent's environment, and returns its channel
  (``process_channel.ProcessChannel``: bytes to its stdin, from its stdout).
  No timeout: the process lives until its stdin ends or the sandbox stops. The
  resident helper (``guilds-code serve``) is run this way.
- ``stop()`` ends everything inside the sandbox (a backend without isolation,
  ``local``, cannot: it documents what it leaves running) and names what it
  removed doing so (docker: the container and its state volume), each as
  ``guilds sandbox stop`` prints it; ``remove()`` stops, then removes what the
  sandbox keeps between stops, naming what the stop removed and then each
  removed thing (``guilds sandbox rm``).
- ``egress``: the sandbox's side of the egress proxy (``egress_side.Egress``) when
  ``agent.network`` is a list and the backend holds one (bwrap, docker, kubernetes;
  docs/network.md), else None. The toolbox keeps it (``Egress.keep``, which starts a
  dead proxy again) once before each call, and reads its decisions after. A backend
  that cannot hold a list has None and refuses one (``config.egress``).

What a backend answers without a sandbox (class methods, ``Backend``'s defaults
where it has nothing to say): ``check()`` its lines of ``guilds doctor``,
``can_run()`` whether those lines let it run here, ``check_agent()`` the lines
about the configured agent once it is the backend the settings pick, and
``boxes()`` the sandboxes it knows of (``guilds sandbox list``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from ..config.settings import AgentSettings
    from .egress_side import Egress
    from .process_channel import ProcessChannel


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


class Sandbox(Protocol):
    name: str
    home: str
    """The agent's home as the sandbox sees it (absolute)."""
    state_dir: str
    """The state root as the sandbox sees it (GUILDS_STATE_DIR inside)."""
    python: str
    """The python3 that runs the helpers inside the sandbox."""
    isolates: bool
    own_boot_id: bool
    own_networks: bool
    home_owner: tuple[int, int] | None
    """See ``Backend``."""

    @property
    def egress(self) -> Egress | None:
        """The sandbox's side of the egress proxy (agent.network a list), else None."""
        ...

    def helper_path(self, name: str) -> str:
        """Where the one-file helper `name` (guilds-code, guilds-harness) lives inside."""
        ...

    async def start(self) -> None: ...

    def runs_now(self) -> bool | None:
        """Whether the sandbox runs now, told from the host without a request into it and
        without starting it; None where the backend cannot tell so (only a request tells)."""
        ...

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes) -> None: ...

    def cgroup_pid(self) -> int | None:
        """A process of this machine in the running sandbox's own cgroup, or None (``Backend``)."""
        ...

    async def open_process(self, argv: Sequence[str]) -> ProcessChannel: ...

    async def stop(self) -> list[str]: ...

    async def remove(self) -> list[str]: ...


async def keep_egress(sandbox: Sandbox) -> None:
    """The one keep of a sandbox's egress proxy, once before each call (the toolbox's, and
    each command of the E2B front): ``Egress.keep`` off the event loop, which starts a dead
    proxy again; nothing without a list (no thread hop)."""
    import asyncio  # here, not at the top: `guilds mcp` answers its client before it loads asyncio

    egress = sandbox.egress
    if egress is not None:
        await asyncio.to_thread(egress.keep)


@dataclass(frozen=True)
class Check:
    """One line of ``guilds doctor``: ``needed`` False marks it ``--`` when not ok."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed: bool = True

    def line(self) -> str:
        mark = "ok" if self.ok else ("no" if self.needed else "--")
        fix = f" -> {self.fix}" if self.fix and not self.ok else ""
        return f"{mark:4} {self.name}: {self.detail}{fix}"


@dataclass(frozen=True)
class Box:
    """One sandbox, as ``guilds sandbox list`` shows it: the backend, the agent, what it
    is (a bwrap process, a container, a pod) and its state."""

    backend: str
    agent: str
    what: str
    state: str

    def line(self) -> str:
        return f"{self.backend:10} {self.agent:20} {self.what:32} {self.state}"


class Backend:
    """What every backend class answers, here with the answers of a backend that has
    nothing to say; a backend overrides what it knows."""

    name: str
    isolates = True
    """False for a backend that isolates nothing (doctor says so when ``auto`` picks it)."""
    network_true_reach = ""
    """What ``agent.network = true`` opens on this backend beyond every host, if anything."""
    network_list_held = ""
    """What holds ``agent.network`` as a list in on this backend, when the backend does
    not hold it by itself (doctor says so)."""
    own_boot_id = False
    """True for a backend whose sandbox has a kernel boot id of its own
    (``/proc/sys/kernel/random/boot_id``), new at each start of the sandbox."""
    own_networks = False
    """True for a backend whose agents' networks are each their own, so one agent's can be
    narrowed alone (the E2B front's ``allow_out``)."""
    template_builds = ""
    """What a template build makes on this backend (the E2B front's ``Template``): ``"home"``,
    a starting home made by running the steps in a sandbox whose root is read-only;
    ``"image"``, an image built on the engine from the steps; ``""``: none is served."""
    home_owner: tuple[int, int] | None = None
    """The host uid and gid the sandbox gives the agent's host home to and runs its commands
    as, where it has one of its own (bwrap and docker under a root orchestrator); an agent
    made on demand gets an overlay home only then (``guilds.agents.homes``)."""

    def runs_now(self) -> bool | None:
        """See ``Sandbox.runs_now``: here, cannot tell."""
        return None

    def cgroup_pid(self) -> int | None:
        """A process of this machine in the running sandbox's own cgroup (its metrics are read
        there: the E2B front's ``sandbox_metrics``), or None where the backend has none to name
        (blocking: it may ask an engine)."""
        return None

    @classmethod
    def for_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike, *,
                  idle_seconds: float | None) -> Sandbox:
        """The agent's sandbox (``guilds.sandbox.get_sandbox`` has checked the settings)."""
        raise NotImplementedError

    @classmethod
    def check(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, needed: bool) -> list[Check]:
        """Doctor's lines on whether this backend runs here (needed: it is the configured one)."""
        return []

    @classmethod
    def can_run(cls, checked: Sequence[Check]) -> bool:
        """Whether the lines ``check()`` gave let this backend run here."""
        return all(c.ok for c in checked)

    @classmethod
    def checkpoints_refused(cls, settings: AgentSettings) -> str | None:
        """Why this backend keeps no checkpoint of the agent's home, in a few words; None
        where it keeps them (the home is a folder on this machine). May ask a cluster."""
        return None

    @classmethod
    def check_agent(cls, settings: AgentSettings, data_dir: str | os.PathLike) -> list[Check]:
        """Doctor's lines on the agent in this backend's sandbox (asked of the backend the settings pick)."""
        return []

    @classmethod
    def boxes(cls, settings: AgentSettings, data_dir: str | os.PathLike, *, chosen: bool) -> list[Box]:
        """The sandboxes of this backend this machine knows of (chosen: the settings name it;
        a backend that cannot be reached then raises SandboxError, else has none)."""
        return []
