"""Built templates: each a starting home kept as a snapshot is (``snapshots``), with what its
build adds (``Snapshot.built``: the image a docker build made, the ``ENV`` of its steps).

    homes = TemplateHomes.open(data_dir)
    homes.find(key_name, ref)      the key's built template its name, id or snapshot id names

A built template is kept in ``<data folder>/e2b-templates/`` (its layers held as
``e2b-template-<raw id>``), apart from the snapshots, and named by its build's name: a new build
of a name replaces the former one (E2B's new build of a template). Its E2B ``templateID`` is
``template_id(key, name)``: the same for every build of the name. A sandbox made from it is
made as from a snapshot (``forks``). One key keeps ``E2B_MAX_TEMPLATES`` at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging

from ...limits import E2B_MAX_TEMPLATES
from .snapshots import Snapshot, Snapshots

log = logging.getLogger(__name__)


def template_id(key_name: str, name: str) -> str:
    """A built template's E2B id: the same for each build of the name by the key."""
    return "t" + hashlib.sha256(f"{key_name}\0{name}".encode()).hexdigest()[:19]


class TemplateHomes(Snapshots):
    FOLDER, HOLDER_PREFIX, KIND, MAX_KEPT = "e2b-templates", "e2b-template-", "template", E2B_MAX_TEMPLATES

    def find(self, key_name: str, ref: str) -> Snapshot | None:
        return next((s for s in self.of_key(key_name)
                     if s.named_by(ref) or (s.name and template_id(key_name, s.name) == ref)), None)

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
