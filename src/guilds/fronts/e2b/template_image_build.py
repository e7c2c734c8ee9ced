"""A template build on docker: an image built from the steps, on the base template's image
(guilds' sandbox image, or an image the engine holds), and its home.

The steps become a Dockerfile (``dockerfile``) that the engine builds with no pull: ``FROM``
the base, E2B's user ``user`` (the sandbox's uid) and its home ``/home/user``; ``RUN`` as
``bash -l -c`` as the step's user (``root`` is root here), with no network unless the
template's is the whole network; ``ENV``, ``WORKDIR``, ``USER`` as Docker takes them; ``COPY``
of an uploaded archive by ``COPY_SCRIPT`` (Docker's rules, ``mode`` and the owner applied);
then the helpers and the agent's user as guilds' sandbox image ends
(``guilds.sandbox.image.helper_lines``), so no step replaces them. The engine's log lines
are the build's log entries as they come, each of a Dockerfile line the step it is of.

A sandbox's home is bound over ``/home/user``: what the steps left there is copied out of the
image (at most ``E2B_TEMPLATE_HOME_BYTES``) and kept as the template's starting home, as a
home build's is; the rest of the image is the sandbox's root filesystem.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from ...limits import E2B_TEMPLATE_HOME_BYTES
from ...sandbox.image import CONTAINER_UID, engine_client, helper_files, helper_lines
from .snapshots import Taken
from .template_build import Build, StepFailed
from .template_home_build import Base, State, invalid_user
from .template_steps import BASE_STEP, COPY_SCRIPT, E2B_USER, FINALIZE_STEP, Plan, Step
from .template_uploads import Uploads

HOME = "/home/user"
COPY_FOLDER = "/.guilds-e2b-copy"
"""Where a COPY's archive and the copy script stand in the image while it runs (then removed)."""
IMAGE_REPO = "guilds-e2b-template"
_PRELUDE = (f"sed -i '/^guilds:/d;/^{E2B_USER}:/d' /etc/passwd /etc/group && "
            f"echo '{E2B_USER}:x:{CONTAINER_UID}:{CONTAINER_UID}::{HOME}:/bin/bash' >> /etc/passwd && "
            f"echo '{E2B_USER}:x:{CONTAINER_UID}:' >> /etc/group && mkdir -p {HOME} && "
            f"chown {CONTAINER_UID}:{CONTAINER_UID} {HOME}")
"""E2B's user named for the sandbox's uid (guilds' own name for it comes back at the end)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STEP_LINE = re.compile(r"Step (\d+)/\d+ : ")


def _literal(value: str, what: str) -> str:
    """value as a Dockerfile word of ENV or WORKDIR: quoted, no variable expanded."""
    if "\n" in value or "\r" in value:
        raise StepFailed(f"{what}: a line break is not served in a Dockerfile")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def dockerfile(base_image: str, plan: Plan, helpers: list[str], *,
               home: bool = False) -> tuple[str, list[str], dict[str, str]]:
    """The Dockerfile (pure), the step each of its instructions is of, and the ENV set;
    home: the context's ``home/`` (the base template's starting home) copied to /home/user."""
    lines: list[tuple[str, str]] = [(f"FROM {base_image}", BASE_STEP), ("USER root", BASE_STEP),
                                    (f"RUN {json.dumps(['/bin/sh', '-c', _PRELUDE])}", BASE_STEP),
                                    (f"ENV HOME={HOME}", BASE_STEP), (f"WORKDIR {HOME}", BASE_STEP)]
    if home:
        lines.append((f"COPY --chown={CONTAINER_UID}:{CONTAINER_UID} home/ {HOME}/", BASE_STEP))
    state = State(HOME)
    for step in plan.steps:
        lines += [(line, step.name) for line in _lines(step, state)]
    lines += [(line, FINALIZE_STEP) for line in ["USER root", *helper_lines(helpers)]]
    return "\n".join(line for line, _ in lines) + "\n", [name for _, name in lines], state.envs


def _lines(step: Step, state: State) -> list[str]:
    if step.kind == "ENV":
        pairs = list(zip(step.args[::2], step.args[1::2], strict=True))
        for name, _ in pairs:
            if not _ENV_NAME.fullmatch(name):
                raise StepFailed(f"ENV {name[:40]!r}: not a variable name")
        state.envs.update(pairs)
        return [f"ENV {' '.join(f'{n}={_literal(v, step.line())}' for n, v in pairs)}"]
    if step.kind == "USER":
        state.user = step.args[0]
        return []
    if step.kind == "WORKDIR":  # a folder made there is the step's user's, as the steps after it write there
        made = ["/bin/sh", "-c", '[ -d "$1" ] || { mkdir -p -- "$1" && chown "$2" "$1"; }', "workdir", step.args[0],
                state.user]
        return ["USER root", f"RUN {json.dumps(made)}", f"WORKDIR {_literal(step.args[0], step.line())}"]
    user = step.user or state.user
    if step.kind == "RUN":
        return [f"USER {user}", f"RUN {json.dumps(['/bin/bash', '-l', '-c', step.args[0]])}"]
    mode = step.args[3] if len(step.args) > 3 else ""
    archive = f"{COPY_FOLDER}/{step.files_hash}"
    run = ["/bin/sh", "-c", f'python3 -I {COPY_FOLDER}/copy-files "$@"; s=$?; rm -rf {COPY_FOLDER}; exit $s', "copy",
           archive, step.args[0], step.args[1], mode, user]
    return ["USER root", f"COPY copy-files files/{step.files_hash} {COPY_FOLDER}/", f"RUN {json.dumps(run)}"]


class ImageBuild:
    """One build's run on docker."""

    def __init__(self, uploads: Uploads, build: Build, plan: Plan, deadline: float):
        self.uploads, self.build, self.plan, self.deadline = uploads, build, plan, deadline
        self.tag = f"{IMAGE_REPO}:{build.template_id}-{build.id.replace('-', '')[:12]}"
        self._scratch: Path | None = None
        self.network = False

    async def run(self, base: Base, base_image: str, template: str, data_dir: Path, home: Path | None,
                  network: bool) -> Taken:
        """The image built and its home copied out; home: the base template's starting home,
        copied to /home/user first (None: the base image's own); network: the steps reach the
        engine's network (the template's ``agent.network = true``), else none at all."""
        self.network = network
        import docker

        client = await asyncio.to_thread(engine_client, max(30, self.deadline - time.monotonic()))
        try:
            image = base.image or base_image
            if base.image is not None:
                await asyncio.to_thread(_held, client, base.image)
            self.build.log(f"Building image {self.tag} on {image}")
            text, steps, envs = dockerfile(image, self.plan, [name for name, _ in helper_files()],
                                           home=home is not None)
            with tempfile.TemporaryFile() as context:
                await asyncio.to_thread(self._context, text, context, home)
                await asyncio.wait_for(asyncio.to_thread(self._built, client, context, steps),
                                       max(1, self.deadline - time.monotonic()))
            self.build.step = FINALIZE_STEP
            self._scratch = Path(tempfile.mkdtemp(prefix=".e2b-template-", dir=data_dir))
            made = await asyncio.to_thread(_home_of, client, self.tag, self._scratch)
        except docker.errors.DockerException as exc:
            raise StepFailed(f"docker: {exc}") from None
        finally:
            client.close()
        inherited = dict(base.built.built.get("envs", {})) if base.built else {}
        return Taken(self.build.key_name, self.build.name, f"build-{self.build.id}", f"build-{self.build.id}",
                     template, made, None, built={"image": self.tag, "envs": {**inherited, **envs},
                                                  "start_cmd": self.plan.start_cmd,
                                                  "ready_cmd": self.plan.ready_cmd})

    def _context(self, text: str, out: Any, home: Path | None) -> None:
        """The build context written to out: the Dockerfile, the helpers, the copy script,
        the starting home (its links kept as links) and each COPY's archive."""
        with tarfile.open(fileobj=out, mode="w") as tar:
            if home is not None:
                tar.add(home, arcname="home")
            files = [("Dockerfile", text.encode(), 0o644), ("copy-files", COPY_SCRIPT.encode(), 0o644),
                     *((name, data, 0o755) for name, data in helper_files())]
            for name, data, mode in files:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
            for step in self.plan.steps:
                if step.files_hash is None:
                    continue
                found = self.uploads.path(self.build.template_id, step.files_hash)
                if found is None:
                    self.build.step = step.name
                    raise StepFailed(f"{step.line()}: its files were not uploaded (filesHash {step.files_hash})")
                tar.add(found, arcname=f"files/{step.files_hash}")
        out.seek(0)

    def _built(self, client: Any, context: Any, steps: list[str]) -> None:
        """The engine's build, its lines logged as they come; StepFailed naming the step."""
        for chunk in client.api.build(fileobj=context, custom_context=True, tag=self.tag, rm=True, forcerm=True,
                                      pull=False, decode=True, nocache=self.plan.force,
                                      network_mode=None if self.network else "none"):
            if "error" in chunk:
                raise StepFailed(self._failure(str(chunk["error"]).strip()))
            for line in str(chunk.get("stream", "")).splitlines():
                found = _STEP_LINE.match(line)
                if found and int(found.group(1)) <= len(steps):
                    self._begun(steps[int(found.group(1)) - 1])
                elif line.strip() and not line.startswith((" --->", "Removing intermediate", "Successfully")):
                    self.build.log(line)

    def _begun(self, name: str) -> None:
        """The step a Dockerfile line is of, under way: its entry in the logs when it begins."""
        if name != self.build.step and name.isdigit():
            step = self.plan.steps[int(name) - 1]
            self.build.log(f"Step {name}/{len(self.plan.steps)}: {step.line()}")
        self.build.step = name

    def _failure(self, error: str) -> str:
        step = next((s for s in self.plan.steps if s.name == self.build.step), None)
        if step is None or step.kind != "RUN":
            return f"{step.line() if step else self.plan.base_line}: {error}"
        user = re.search(r"unable to find user ([^:\s]+)", error)
        if user:
            return str(invalid_user(step.args[0], user.group(1)))
        code = re.search(r"non-zero code: (\d+)", error)
        return f"failed to run command '{step.args[0]}': " + (f"exit status {code.group(1)}" if code else error)

    def ended(self, failed: bool) -> None:
        """Its scratch folder removed; a failed build's image too."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if failed:
            from .template_homes import remove_image

            remove_image(self.tag)


def _held(client: Any, image: str) -> None:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise StepFailed(f"FROM {image}: the image is not on this machine's docker engine, and this server pulls "
                         "from no registry: load it there first (docker load), or build from the base image "
                         "(Template().from_base_image())") from None


def _home_of(client: Any, tag: str, scratch: Path) -> Path:
    """The image's /home/user copied out into scratch (its size bounded): the folder."""
    container = client.containers.create(tag, command=["true"])
    try:
        stream, _ = container.get_archive(HOME)
        with tempfile.TemporaryFile(dir=scratch) as archive:
            size = 0
            for chunk in stream:
                size += len(chunk)
                if size > E2B_TEMPLATE_HOME_BYTES:
                    raise StepFailed(f"the home the steps left is larger than {E2B_TEMPLATE_HOME_BYTES} bytes "
                                     "(E2B_TEMPLATE_HOME_BYTES)")
                archive.write(chunk)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(scratch, filter=_owned_by_us)  # noqa: S202 (the filter keeps it inside)
    finally:
        container.remove(force=True)
    home = scratch / os.path.basename(HOME)
    if not home.is_dir():
        raise StepFailed(f"the image has no folder {HOME}")
    return home


def _owned_by_us(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's ``tar`` filter (no path outside, no device), and the files this process's own."""
    found = tarfile.tar_filter(member, path)
    return None if found is None or not (found.isfile() or found.isdir() or found.issym()) else found.replace(
        uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)
