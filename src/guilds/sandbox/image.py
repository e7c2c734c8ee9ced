"""The sandbox image: python3, bash, git, rg, the helpers at /usr/local/bin, and
the agent's user ``guilds`` (uid and gid CONTAINER_UID), which it runs as.

``build_sandbox_image`` is the ``guilds sandbox image`` command. It builds
``FROM base`` with a Dockerfile (``dockerfile``) that installs the tools with
apt (skipped with ``install=False``, for a base that has them) and copies the
helpers in. Where no registry is reachable, ``rootfs`` names a root
filesystem tar (scripts/docker-test-env.sh assembles one from this machine's
Debian packages); it is imported as the base first.

The docker backend also writes the helpers into each container it creates, so
a container always runs the orchestrator's own build of them; the copies in
the image serve images used on their own (and the kubernetes backend's first
exec).

    python -m guilds.sandbox.image [--tag T] [--base IMAGE] [--rootfs TAR] [--no-install]
"""

from __future__ import annotations

import argparse
import io
import sys
from typing import IO, Any, Sequence

from ._container import CONTAINER_UID, helper_files, tar_bytes

__all__ = ["CONTAINER_UID", "engine_client", "helper_files", "helper_lines"]

DEFAULT_TAG = "guilds-sandbox:latest"
DEFAULT_BASE = "debian:bookworm-slim"
PACKAGES = ("python3", "bash", "git", "ripgrep", "procps", "ca-certificates")
"""What the helpers and the agents' commands need; coreutils, tar and grep come with Debian."""


USER_LINE = (
    f"RUN grep -q '^guilds:' /etc/passwd || (echo 'guilds:x:{CONTAINER_UID}:{CONTAINER_UID}:"
    f"guilds agent:/nonexistent:/bin/sh' >> /etc/passwd && echo 'guilds:x:{CONTAINER_UID}:' >> /etc/group)"
)
"""The agent's user in /etc/passwd: git and ssh look the uid up and refuse one they cannot find."""


def dockerfile(base: str, helpers: Sequence[str], *, install: bool = True) -> str:
    """The Dockerfile text (pure)."""
    lines = [f"FROM {base}"]
    if install:
        lines.append("RUN apt-get update && apt-get install -y --no-install-recommends "
                     f"{' '.join(PACKAGES)} && rm -rf /var/lib/apt/lists/*")
    return "\n".join([*lines, *helper_lines(helpers)]) + "\n"


def helper_lines(helpers: Sequence[str]) -> list[str]:
    """The image's last lines, as root: the helpers at /usr/local/bin, the agent's user, and
    that user's sleep (a template build's image ends with them too: ``guilds.fronts.e2b``)."""
    return [f"COPY {' '.join(helpers)} /usr/local/bin/", USER_LINE, f"USER {CONTAINER_UID}:{CONTAINER_UID}",
            'CMD ["sleep", "infinity"]']


def build_context(text: str, helpers: Sequence[tuple[str, bytes]]) -> bytes:
    """The build context: the Dockerfile and each helper (0755), deterministic (pure)."""
    files = [("Dockerfile", text.encode(), 0o644), *((n, d, 0o755) for n, d in helpers)]
    return tar_bytes(files, mtime=0)


def build_sandbox_image(
    *, tag: str = DEFAULT_TAG, base: str = DEFAULT_BASE, install: bool = True,
    rootfs: str | None = None, base_url: str | None = None,
) -> str:
    """Build the sandbox image and return its id.

    rootfs: a root filesystem tar imported as ``base`` first (then base must be
    a name, e.g. ``guilds-base:local``). base_url: the engine (default DOCKER_HOST).
    Raises SandboxError when the engine is not reachable or the build fails.
    """
    files = helper_files()
    context = build_context(dockerfile(base, [n for n, _ in files], install=install), files)
    return built_image(io.BytesIO(context), tag=tag, base=base, rootfs=rootfs, base_url=base_url)


def built_image(context: IO[bytes], *, tag: str, base: str, rootfs: str | None = None,
                base_url: str | None = None) -> str:
    """context (a tar holding a Dockerfile and its files) built as tag, with no pull, and
    its id; rootfs: a root filesystem tar imported as ``base`` first. base_url: the engine
    (default DOCKER_HOST). SandboxError naming the build's last steps when it fails, or
    the engine's reason when it cannot build."""
    import docker

    from ..errors import SandboxError

    client = None
    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        if rootfs:
            repo, _, version = base.partition(":")
            client.api.import_image_from_file(rootfs, repository=repo, tag=version or "latest")
        image, _ = client.images.build(fileobj=context, custom_context=True, tag=tag,
                                       rm=True, forcerm=True, pull=False)
    except docker.errors.BuildError as exc:
        tail = " ".join(str(step.get("stream", step.get("error", ""))).strip()
                        for step in list(exc.build_log)[-3:])
        raise SandboxError(f"docker: building {tag} failed: {exc.msg}: {tail}") from exc
    except docker.errors.DockerException as exc:
        raise SandboxError(f"docker: building {tag}: {exc}") from exc
    finally:
        if client is not None:
            client.close()
    return str(image.id)


def engine_client(timeout: float) -> Any:
    """A client of the engine at DOCKER_HOST, for a build of an image beside the sandbox
    image's (an E2B template's); raises what the engine's SDK raises."""
    from .docker import docker_engine

    return docker_engine.connect(None, timeout=timeout)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="guilds sandbox image", description=__doc__.split("\n")[0])
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"the image's name (default {DEFAULT_TAG})")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the base image (default {DEFAULT_BASE})")
    parser.add_argument("--rootfs", help="a root filesystem tar, imported as --base first")
    parser.add_argument("--no-install", dest="install", action="store_false",
                        help="the base has python3, bash, git and rg already")
    args = parser.parse_args(argv)
    from ..errors import SandboxError

    try:
        image_id = build_sandbox_image(tag=args.tag, base=args.base, install=args.install,
                                       rootfs=args.rootfs)
    except SandboxError as exc:
        print(f"guilds sandbox image: {exc}", file=sys.stderr)
        return 1
    print(f"{args.tag} {image_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
