"""E2B template builds on one server: requested, started, followed, kept.

    templates = Templates(sandboxes)
    templates.request(key_name, body)            E2B's create (``POST /v3/templates``): ids of a new build
    templates.start(key_name, tid, bid, body)    its steps (``POST /v2/templates/{tid}/builds/{bid}``), run
    templates.build(key_name, tid, bid)          the build, for its status
    templates.built                              the built templates (a create of one: ``forks``)
    await templates.close()                      the builds under way ended, their sandboxes removed

A build runs on the backend of its base template: on bwrap, a starting home
(``template_home_build``); on docker, an image and its home (``template_image_build``).
Elsewhere (local, kubernetes) a build is answered 501. Bounds: ``E2B_TEMPLATE_BUILDS_PER_KEY``
builds of one key at once (429), ``E2B_TEMPLATE_BUILD_SECONDS`` each (the build fails past
it), ``E2B_MAX_TEMPLATES`` templates of one key, built or requested (429), and the steps'
(``template_steps``) and uploads' (``template_uploads``) own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...config.checks import is_safe_name
from ...config.templates import DEFAULT_TEMPLATE
from ...errors import BadInput, GuildsError
from ...limits import E2B_MAX_TEMPLATES, E2B_TEMPLATE_BUILD_SECONDS, E2B_TEMPLATE_BUILDS_PER_KEY
from .connect import ConnectError
from .forks import Forks
from .sandboxes import Sandboxes
from .snapshots import Taken
from .template_build import BUILDING, WAITING, Build, StepFailed
from .template_home_build import Base, HomeBuild
from .template_homes import DEFAULT_TAG, TemplateHomes, tags_of, template_id
from .template_image_build import ImageBuild
from .template_steps import BASE_IMAGES, Plan, plan_of
from .template_uploads import Uploads

if TYPE_CHECKING:
    from ...sandbox.base import Backend

BUILDS_KEPT = 100
"""Builds of one key not running (ended, or requested and never started) kept for their status
answers: past it, the oldest are forgotten."""


def _listed(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ConnectError("invalid_argument", f"{name}: a list of strings")
    return value


def checked_tags(tags: list[str]) -> list[str]:
    """Tags: each letters, digits, '.', '_', '-' (at most 128); ``invalid_argument`` naming one
    that is not (``:v1``, an empty tag)."""
    for tag in tags:
        if not is_safe_name(tag) or len(tag) > 128:
            raise ConnectError("invalid_argument", f"tag {tag[:40]!r}: letters, digits, '.', '_' or '-' "
                                                   "(at most 128)")
    return list(dict.fromkeys(tags))


@dataclass
class Requested:
    key_name: str
    name: str


def unimplemented(message: str) -> ConnectError:
    return ConnectError("unimplemented", f"{message} (guilds serve --e2b)")


class Templates:
    def __init__(self, sandboxes: Sandboxes):
        self.sandboxes = sandboxes
        data_dir = sandboxes.agents.data_dir
        self.homes = TemplateHomes.open(data_dir)
        self.built = Forks(sandboxes, self.homes)
        self.uploads = Uploads(data_dir)
        self._requested: dict[str, Requested] = {}
        self._builds: dict[str, Build] = {}
        self._running: set[asyncio.Task[None]] = set()

    # --- requests ---------------------------------------------------------------------------
    def request(self, key_name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A new build of the template the body names (``TemplateBuildRequestV3``), with its tags."""
        name, tags = self._name(body)
        tid = template_id(key_name, name)
        known = {s.name for s in self.homes.of_key(key_name)} | {
            r.name for r in self._requested.values() if r.key_name == key_name}
        if name not in known and len(known) >= E2B_MAX_TEMPLATES:
            raise ConnectError("resource_exhausted", f"template limit reached: key {key_name!r} holds "
                                                     f"{E2B_MAX_TEMPLATES} templates (E2B_MAX_TEMPLATES); "
                                                     "delete one first")
        self._forget_ended(key_name)
        self._requested[tid] = Requested(key_name, name)
        build = Build(str(uuid.uuid4()), tid, key_name, name, tags=tags)
        self._builds[build.id] = build
        return {"templateID": tid, "buildID": build.id, "public": False, "names": [name], "tags": tags,
                "aliases": [name]}

    def _name(self, body: dict[str, Any]) -> tuple[str, list[str]]:
        """The template's name and the build's tags (``name:tag`` and ``tags``; none: ``default``)."""
        name = body.get("name") or body.get("alias")
        if not isinstance(name, str) or not name:
            raise ConnectError("invalid_argument", "name: the template's name is needed")
        name, colon, tag = name.partition(":")
        tags = checked_tags([*([tag] if colon else []), *_listed(body.get("tags"), "tags")]) or [DEFAULT_TAG]
        if not is_safe_name(name) or len(name) > 128:
            raise ConnectError("invalid_argument", f"name: letters, digits, '.', '_' or '-' (at most 128), "
                                                   f"got {name[:40]!r}")
        if name in self.sandboxes.templates():
            raise ConnectError("invalid_argument", f"name: {name!r} is a template this server serves from its "
                                                   "settings; build under another name")
        return name, tags

    def _forget_ended(self, key_name: str) -> None:
        """The key's oldest builds not running (ended, or never started) forgotten past BUILDS_KEPT."""
        idle = [b for b in self._builds.values() if b.key_name == key_name and b.status != BUILDING]
        for build in idle[:max(0, len(idle) - BUILDS_KEPT + 1)]:
            del self._builds[build.id]

    def build(self, key_name: str, tid: str, bid: str) -> Build:
        found = self._builds.get(bid)
        if found is None or found.key_name != key_name or found.template_id != tid:
            raise ConnectError("not_found", f"build '{bid}' of template '{tid}' not found")
        return found

    def link(self, key_name: str, base_url: str, tid: str, files_hash: str) -> dict[str, object]:
        requested = self._requested.get(tid)
        if requested is None or requested.key_name != key_name:
            raise ConnectError("not_found", f"template '{tid}' not found")
        return self.uploads.link(base_url, tid, files_hash)

    # --- builds -----------------------------------------------------------------------------
    def start(self, key_name: str, tid: str, bid: str, body: dict[str, Any]) -> None:
        """The build's steps run, in the background (its status follows them)."""
        build = self.build(key_name, tid, bid)
        if build.status != WAITING:
            raise ConnectError("failed_precondition", f"build '{bid}' was started already")
        plan = plan_of(body)
        running = sum(1 for b in self._builds.values() if b.key_name == key_name and b.status == BUILDING)
        if running >= E2B_TEMPLATE_BUILDS_PER_KEY:
            raise ConnectError("resource_exhausted", f"build limit reached: key {key_name!r} runs "
                                                     f"{E2B_TEMPLATE_BUILDS_PER_KEY} builds at once "
                                                     "(E2B_TEMPLATE_BUILDS_PER_KEY); wait for one to end")
        base, backend = self._base(key_name, plan)
        build.status = BUILDING
        self._launch(self._run(build, plan, base, backend))

    def _base(self, key_name: str, plan: Plan) -> tuple[Base, type[Backend]]:
        """What the build starts from, and the backend it runs on (501 where none is served)."""
        ref = plan.from_template
        if ref is not None and ref not in self.sandboxes.templates():
            built = self.homes.find(key_name, ref)
            if built is None:
                raise ConnectError("not_found", f"template '{ref}' not found: this server serves "
                                                f"{' and '.join(repr(t) for t in self.sandboxes.templates())} and "
                                                "the templates this key built")
            base = Base(built=built)
        elif ref is not None:
            base = Base(template=self.sandboxes.template_of(ref))
        elif plan.from_image is None or plan.from_image in BASE_IMAGES:
            base = Base(template=DEFAULT_TEMPLATE)
        else:
            base = Base(template=DEFAULT_TEMPLATE, image=plan.from_image)
        template = base.built.template if base.built is not None else str(base.template)
        if template not in self.sandboxes.agents.served.templates:
            raise ConnectError("not_found", f"template '{template}' is no longer served by this server")
        backend = self.sandboxes.backend_for(template)
        if not backend.template_builds:
            raise unimplemented(f"template builds are not supported on {backend.name}: they are served on bwrap "
                                "(a starting home) and docker (an image)")
        return base, backend

    def _launch(self, running: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(running)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, build: Build, plan: Plan, base: Base, backend: type[Backend]) -> None:
        deadline = time.monotonic() + E2B_TEMPLATE_BUILD_SECONDS
        runner: HomeBuild | ImageBuild
        if backend.template_builds == "image":
            runner = ImageBuild(self.uploads, build, plan, deadline)
        else:
            runner = HomeBuild(self.sandboxes, self.built, self.uploads, build, plan, deadline)
        build.log(f"Building template {build.name} on {backend.name}: {plan.base_line}")
        failure: str | None = "the server stopped"
        try:
            async with asyncio.timeout(E2B_TEMPLATE_BUILD_SECONDS):
                taken = await (self._image(runner, base) if isinstance(runner, ImageBuild)
                               else runner.run(base, backend.name))
                await self.homes.take(dataclasses.replace(taken, built={**taken.built, "tags": build.tags,
                                                                        "build_id": build.id}))
            failure = None
        except (StepFailed, ConnectError) as exc:
            failure = str(exc)
        except TimeoutError:
            failure = f"the build ran past {E2B_TEMPLATE_BUILD_SECONDS:g} s (E2B_TEMPLATE_BUILD_SECONDS)"
        except (GuildsError, OSError) as exc:
            failure = f"the build could not go on: {exc}"
        finally:  # its status told once its sandbox is removed
            await asyncio.shield(self._ended(build, plan, runner, failure is not None))
            if failure is None:
                build.done()
            else:
                build.fail(failure)

    async def _image(self, runner: ImageBuild, base: Base) -> Taken:
        """A docker build's run: on its base template's image, or its base built template's."""
        template = base.built.template if base.built is not None else str(base.template)
        settings = self.sandboxes.agents.served.template(template).settings
        image = (base.built.built.get("image") if base.built is not None else None) or settings.docker.image
        home = settings.home if base.built is None and base.image is None else None
        return await runner.run(base, image, template, self.sandboxes.agents.data_dir, home, settings.network)

    async def _ended(self, build: Build, plan: Plan, runner: HomeBuild | ImageBuild, failed: bool) -> None:
        """The build's sandbox removed (a failed image build's image too), its uploads let go."""
        if isinstance(runner, ImageBuild):
            await asyncio.to_thread(runner.ended, failed)
        agent_id = runner.agent_id if isinstance(runner, HomeBuild) else None
        for step in plan.steps:
            if step.files_hash is not None:
                found = self.uploads.path(build.template_id, step.files_hash)
                if found is not None:
                    found.unlink(missing_ok=True)
        if agent_id is not None:
            with contextlib.suppress(BadInput, GuildsError, OSError):
                await self.sandboxes.agents.remove(agent_id)

    async def delete(self, key_name: str, ref: str) -> bool:
        """The key's built template ref names (a name or an id), every build of it, removed;
        False when there is none."""
        found = self.homes.builds_of(key_name, ref.partition(":")[0])
        for build in found:
            await self.homes.remove(build)
            self._requested.pop(template_id(key_name, str(build.name)), None)
        return bool(found)

    # --- tags -------------------------------------------------------------------------------
    async def assign(self, key_name: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /templates/tags``: the tags given to the build ``target`` (``name:tag``) names."""
        target = body.get("target")
        if not isinstance(target, str) or not target:
            raise ConnectError("invalid_argument", "target: the template build, as name:tag")
        tags = checked_tags(_listed(body.get("tags"), "tags"))
        if not tags:
            raise ConnectError("invalid_argument", "tags: at least one tag")
        build = self.homes.find(key_name, target)
        if build is None:
            raise ConnectError("not_found", f"template '{target}' not found")
        await self.homes.retag(build, add=tags, remove=())
        return {"tags": tags, "buildID": build.built.get("build_id", build.raw)}

    async def untag(self, key_name: str, body: dict[str, Any]) -> None:
        """``DELETE /templates/tags``: the tags taken from the template ``name``'s builds (a
        build left with none removed)."""
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ConnectError("invalid_argument", "name: the template's name")
        tags = checked_tags(_listed(body.get("tags"), "tags"))
        builds = self.homes.builds_of(key_name, name.partition(":")[0])
        if not builds:
            raise ConnectError("not_found", f"template '{name}' not found")
        for build in builds:
            if set(tags) & set(tags_of(build)):
                await self.homes.retag(build, add=(), remove=tags)

    def tags(self, key_name: str, ref: str) -> list[dict[str, Any]]:
        """``GET /templates/{id}/tags``: each tag of the template's builds, with its build."""
        builds = self.homes.builds_of(key_name, ref.partition(":")[0])
        if not builds:
            raise ConnectError("not_found", f"template '{ref}' not found")
        return [{"tag": tag, "buildID": b.built.get("build_id", b.raw),
                 "createdAt": datetime.fromtimestamp(b.at, UTC).isoformat().replace("+00:00", "Z")}
                for b in builds for tag in tags_of(b)]

    async def close(self) -> None:
        """The builds under way cancelled, each one's sandbox removed."""
        running = list(self._running)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
