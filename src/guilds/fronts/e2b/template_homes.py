"""Built templates: each build a starting home kept as a snapshot is (``snapshots``), with what
its build adds (``Snapshot.built``: the image a docker build made, the ``ENV`` of its steps, its
build id and its tags).

    homes = TemplateHomes.open(data_dir)
    homes.find(key_name, ref)             the build ``name[:tag]`` or ``<template id>[:tag]`` names
    await homes.retag(key_name, name, add, remove)   tags moved between the name's builds

Builds are kept in ``<data folder>/e2b-templates/`` (their layers held as
``e2b-template-<raw id>``), apart from the snapshots. A template is a name; each of its builds
has tags (``default`` unless the build named others), and a tag names one build of the name at
a time: a new build takes its tags from the builds that had them, and a build left with no tag
is removed (the sandboxes made from it keep their files). The E2B ``templateID`` of a name is
``template_id(key, name)``. One key keeps ``E2B_MAX_TEMPLATES`` builds at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence

from ...limits import E2B_MAX_TEMPLATES
from .snapshots import ABOUT, Snapshot, Snapshots, Taken

DEFAULT_TAG = "default"
"""The tag a build has when it names none (E2B's)."""

log = logging.getLogger(__name__)


def template_id(key_name: str, name: str) -> str:
    """A built template's E2B id: the same for each build of the name by the key."""
    return "t" + hashlib.sha256(f"{key_name}\0{name}".encode()).hexdigest()[:19]


def tags_of(snapshot: Snapshot) -> list[str]:
    return list(snapshot.built.get("tags") or [DEFAULT_TAG])


class TemplateHomes(Snapshots):
    FOLDER, HOLDER_PREFIX, KIND, MAX_KEPT = "e2b-templates", "e2b-template-", "template", E2B_MAX_TEMPLATES

    def find(self, key_name: str, ref: str) -> Snapshot | None:
        name, _, tag = ref.partition(":")
        return next((s for s in self.builds_of(key_name, name) if (tag or DEFAULT_TAG) in tags_of(s)), None)

    def builds_of(self, key_name: str, ref: str) -> list[Snapshot]:
        """The builds of the template a name or a template id names, newest first."""
        return [s for s in reversed(self.of_key(key_name))
                if s.name is not None and ref in (s.name, template_id(key_name, s.name))]

    def _replaced(self, taken: Taken) -> list[Snapshot]:
        """The name's builds whose every tag the new one takes."""
        taking = set(taken.built.get("tags") or [DEFAULT_TAG])
        return [s for s in self.builds_of(taken.key_name, str(taken.name)) if set(tags_of(s)) <= taking]

    async def take(self, taken: Taken) -> Snapshot:
        made = await super().take(taken)
        await self.retag(made, add=tags_of(made), remove=())
        return made

    async def retag(self, build: Snapshot, add: Sequence[str], remove: Sequence[str]) -> list[str]:
        """build gains the tags add, each taken from the name's build that had it, and loses
        remove; a build left with no tag is removed. build's tags after."""
        for other in self.builds_of(build.key_name, str(build.name)):
            mine = other.raw == build.raw
            dropped = remove if mine else add
            left = [t for t in dict.fromkeys([*tags_of(other), *(add if mine else ())]) if t not in dropped]
            if not left:
                await self.remove(other)
            elif left != tags_of(other):
                await asyncio.to_thread(self._rewrite, other, left)
        kept = self._kept.get(build.raw)
        return tags_of(kept) if kept is not None else []

    def _rewrite(self, snapshot: Snapshot, tags: list[str]) -> None:
        changed = dataclasses.replace(snapshot, built={**snapshot.built, "tags": tags})
        own = self.folder / snapshot.raw
        part = own / f".{ABOUT}"
        part.write_text(json.dumps(dataclasses.asdict(changed)))
        os.replace(part, own / ABOUT)
        self._kept[snapshot.raw] = changed

    def _drop(self, snapshot: Snapshot) -> None:
        super()._drop(snapshot)
        image = snapshot.built.get("image")
        if image:
            remove_image(image)


def remove_image(image: str) -> None:
    """A built template's image removed from the engine (an image a container still uses stays)."""
    try:
        import docker
    except ImportError:
        return
    with contextlib.suppress(docker.errors.DockerException):
        client = docker.from_env()
        try:
            client.images.remove(image, noprune=False)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.DockerException as exc:
            log.warning("e2b: the image %s of a removed template stays: %s", image, exc)
        finally:
            client.close()
