"""A template build whose product is a starting home: the steps run in a sandbox of the
base template, as its agent, and the home they leave is kept as the template's.

On bwrap the sandbox's root filesystem is this machine's, read-only: a build cannot change
it, so a build there makes only a home. Its base is a template (E2B's base image, ``base``, a
template the settings serve, or a template built before: its home); ``FROM`` of another image
fails at step ``base``. ``RUN`` runs ``bash -l -c`` in the working folder with the ``ENV`` so
far; ``COPY`` writes its uploaded files into place inside the sandbox, as the agent;
``WORKDIR`` makes its folder; ``USER`` names ``user`` or ``root``, and a step ``as root`` runs
as the agent (the sandbox has no root to give, as its ``sudo`` says): what needs root fails
as it fails for ``user``. A step that writes outside the home (a package install under
``/usr``) fails on its own, its output in the logs; what it writes to ``/tmp`` is not kept.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ...agents.homes import overlay_dir
from ...limits import E2B_TEMPLATE_UPLOAD_BYTES
from ...record.agent_rows import AgentRefused
from ...sandbox import Sandbox
from .connect import ConnectError
from .sandboxes import OWNER_PREFIX
from .snapshots import Snapshot, Taken
from .template_build import STEP_OUTPUT_BYTES, Build, StepFailed
from .template_steps import COPY_SCRIPT, E2B_USER, FINALIZE_STEP, Plan, Step
from .template_uploads import Uploads

if TYPE_CHECKING:
    from ...toolbox import Toolbox
    from .forks import Forks
    from .sandboxes import Sandboxes

ROOT = "root"
_IN_FOLDER = ('cd -- "$1" || exit 1; shift; "$@" 2>&1 | tail -c ' + str(STEP_OUTPUT_BYTES)
              + '; exit "${PIPESTATUS[0]}"')
"""Runs its arguments in the folder $1, their output (both streams) cut to its tail."""


@dataclass(frozen=True)
class Base:
    """What a build starts from: a template served here, a template built before, or an image."""

    template: str | None = None
    built: Snapshot | None = None
    image: str | None = None


@dataclass
class State:
    """What the steps so far set: the working folder, the environment, the user."""

    workdir: str
    envs: dict[str, str] = field(default_factory=dict)
    user: str = E2B_USER


def invalid_user(command: str, user: str) -> StepFailed:
    """E2B's error for a step run as a user that does not exist."""
    return StepFailed(f"failed to run command '{command}': command failed: unauthenticated: "
                      f"invalid username: '{user}'")


class HomeBuild:
    """One build's run, on a backend whose home is on this machine (bwrap)."""

    def __init__(self, sandboxes: Sandboxes, built: Forks, uploads: Uploads, build: Build, plan: Plan,
                 deadline: float):
        self.sandboxes, self.built, self.uploads = sandboxes, built, uploads
        self.build, self.plan, self.deadline = build, plan, deadline
        self.agent_id: str | None = None
        """The build's agent, once made: the caller removes it at the build's end."""

    async def run(self, base: Base, backend: str) -> Taken:
        """The steps run; what to keep of the home (a snapshot's ``Taken``)."""
        if base.image is not None:
            raise StepFailed(f"FROM {base.image}: a build on {backend} cannot start from an image: its sandboxes "
                             "run on this machine's root filesystem, read-only, so a build makes only a starting "
                             "home; build from the base image (Template().from_base_image()) or a template of "
                             "this server, or serve the template on docker")
        toolbox = await self._agent(base)
        sandbox = toolbox.sandbox
        state = State(sandbox.home, dict(base.built.built.get("envs", {})) if base.built else {})
        for step in self.plan.steps:
            self.build.step = step.name
            self.build.log(f"Step {step.index}/{len(self.plan.steps)}: {step.line()}")
            await self._step(sandbox, state, step)
        self.build.step = FINALIZE_STEP
        home = toolbox.settings.home
        return Taken(self.build.key_name, self.build.name, f"build-{self.build.id}", toolbox.settings.id,
                     base.built.template if base.built else str(base.template), home,
                     overlay_dir(self.sandboxes.agents.data_dir, home),
                     built={"envs": state.envs, "start_cmd": self.plan.start_cmd, "ready_cmd": self.plan.ready_cmd})

    async def _agent(self, base: Base) -> Toolbox:
        """The build's agent, of the key, made from its base (counted by the agents' caps)."""
        key = f"{OWNER_PREFIX}{self.build.key_name}"
        timeout = max(1, round(self.deadline - time.monotonic()) + 60)
        try:
            if base.built is not None:
                made = await self.built.agent_from(base.built, self.build.key_name, timeout)
            else:
                made = await self.sandboxes.agents.make(str(base.template), owner=key, expires_in=timeout)
        except AgentRefused as exc:
            raise StepFailed(f"the build's sandbox could not be made: sandbox limit reached: {exc}") from None
        except ConnectError as exc:
            raise StepFailed(f"the build's sandbox could not be made: {exc}") from None
        self.agent_id = made.id
        return await self.sandboxes.agents.toolbox(made.id)

    def _user(self, step: Step, command: str, user: str | None) -> None:
        name = user or E2B_USER
        if name not in (E2B_USER, ROOT):
            raise invalid_user(command, name)
        if name == ROOT:
            self.build.log(f"step {step.name} runs as {E2B_USER}: this sandbox has no root to give", "warn")

    async def _step(self, sandbox: Sandbox, state: State, step: Step) -> None:
        if step.kind == "ENV":
            state.envs.update(zip(step.args[::2], step.args[1::2], strict=True))
        elif step.kind == "USER":
            self._user(step, step.line(), step.args[0])
            state.user = step.args[0]
        elif step.kind == "WORKDIR":
            folder = posixpath.normpath(posixpath.join(state.workdir, step.args[0]))
            try:
                await self._run(sandbox, state, ["mkdir", "-p", "--", folder], step.line())
            except StepFailed as exc:
                if folder == sandbox.home or folder.startswith(sandbox.home + "/"):
                    raise
                raise StepFailed(f"{step.line()}: {folder} cannot be made: a build here keeps only the home "
                                 f"({sandbox.home}), the rest of the root filesystem being this machine's, "
                                 f"read-only ({str(exc).rpartition(': ')[2]})") from None
            state.workdir = folder
        elif step.kind == "RUN":
            command = step.args[0]
            self._user(step, command, step.user or state.user)
            await self._run(sandbox, state, ["/bin/bash", "-l", "-c", command], command)
        else:
            await self._copy(sandbox, state, step)

    async def _copy(self, sandbox: Sandbox, state: State, step: Step) -> None:
        self._user(step, step.line(), step.user or state.user)
        found = self.uploads.path(self.build.template_id, str(step.files_hash))
        if found is None:
            raise StepFailed(f"{step.line()}: its files were not uploaded (filesHash {step.files_hash})")
        data = await asyncio.to_thread(_read_bounded, found)
        inside = posixpath.join(sandbox.state_dir, f"e2b-copy-{step.files_hash}.tar")
        await sandbox.write_file(inside, data)
        src, dest = step.args[0], step.args[1]
        mode = step.args[3] if len(step.args) > 3 else ""
        try:
            await self._run(sandbox, state, [sandbox.python, "-I", "-c", COPY_SCRIPT, inside, src, dest, mode, ""],
                            step.line())
        finally:
            await sandbox.exec(["rm", "-f", "--", inside], timeout=30)

    async def _run(self, sandbox: Sandbox, state: State, argv: list[str], command: str) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        done = await sandbox.exec(["/bin/bash", "-c", _IN_FOLDER, "guilds-build", state.workdir, *argv],
                                  env=state.envs, timeout=left)
        self.build.output(done.stdout + done.stderr)
        if done.timed_out:
            raise TimeoutError
        if done.exit_code != 0:
            raise StepFailed(f"failed to run command '{command}': exit status {done.exit_code}"
                             + _last_line(done.stdout + done.stderr))


def _last_line(output: bytes) -> str:
    lines = [line for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""


def _read_bounded(path: Path) -> bytes:
    with open(path, "rb") as found:
        data = found.read(E2B_TEMPLATE_UPLOAD_BYTES + 1)
    if len(data) > E2B_TEMPLATE_UPLOAD_BYTES:
        raise StepFailed(f"an upload is larger than {E2B_TEMPLATE_UPLOAD_BYTES} bytes")
    return data
