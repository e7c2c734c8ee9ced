"""`guilds serve image`: the image that runs ``guilds serve`` itself (docs/deploy.md).

    guilds serve image [--tag T] [--base IMAGE] [--rootfs TAR] [--no-install] [--extra NAME]

It is built ``FROM base`` by the Docker engine at DOCKER_HOST, with nothing
fetched by the build itself: the guilds that runs this command, and every
distribution it needs as installed beside it (``distributions``: the closure of
guilds' requirements and of the extras asked, ``postgres`` by default), are
copied into ``/opt/guilds/site`` (``PYTHONPATH``). So the base's ``python3`` must be
the same ``major.minor`` as this interpreter (compiled extensions are built for
it): a step of the build checks it and names both. With ``--no-install`` the base
already has python3 (``guilds-base:local`` of scripts/docker-test-env.sh); else it
is installed with apt. ``--rootfs`` imports a root filesystem tar as the base first,
as ``guilds sandbox image`` does.

The image runs as uid SERVE_UID with ``GUILDS_DATA=/var/lib/guilds`` and
``guilds serve --host 0.0.0.0`` as its command (the entrypoint is ``python3 -m
guilds.fronts.cli``: any ``guilds`` command line works as the container's args).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import importlib.util
import io
import re
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import BadInput, GuildsError, SandboxError
from ..sandbox.image import DEFAULT_BASE, built_image

DEFAULT_TAG = "guilds-serve:latest"
DEFAULT_EXTRAS = ("postgres",)
"""The run record on PostgreSQL is what lets replicas share their state (docs/deploy.md)."""
SERVE_UID = 10001
"""The server's user in the image: not root, and not the sandboxes' uid."""
SITE = "/opt/guilds/site"
DATA = "/var/lib/guilds"
OWN_PACKAGES = ("guilds", "guilds_code", "guilds_harness")
"""The packages of guilds itself, copied from where this process imports them."""
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(marker: str, extras: frozenset[str]) -> bool | None:
    """Whether a requirement's marker asks for it: True, False, or None (another condition:
    taken when installed here)."""
    asked = _EXTRA.findall(marker)
    if asked:
        return any(_key(extra) in extras for extra in asked)
    return None if marker.strip() else True


def distributions(extras: Sequence[str] = DEFAULT_EXTRAS) -> list[metadata.Distribution]:
    """The installed distributions guilds needs with extras, guilds' own excluded (pure over
    the installed metadata). BadInput for an extra guilds has not; SandboxError for a
    requirement that is not installed here."""
    try:
        own = metadata.distribution("guilds")
    except metadata.PackageNotFoundError:
        raise SandboxError("guilds is not installed as a distribution here (pip install -e . or the wheel)") from None
    offered = {_key(extra) for extra in own.metadata.get_all("Provides-Extra") or ()}
    for extra in extras:
        if _key(extra) not in offered:
            raise BadInput(f"--extra {extra}: guilds has no such extra (it has {', '.join(sorted(offered))})")
    found: dict[str, metadata.Distribution] = {}
    todo = [("guilds", frozenset(_key(extra) for extra in extras), own)]
    while todo:
        name, asked, dist = todo.pop()
        for requirement in dist.requires or ():
            text, _, marker = requirement.partition(";")
            matched = _NAME.match(text)
            wanted = _wanted(marker, asked)
            if matched is None or wanted is False:
                continue
            key = _key(matched.group(1))
            try:
                needed = found.get(key) or metadata.distribution(key)
            except metadata.PackageNotFoundError:
                if wanted:
                    raise SandboxError(f"{name} needs {matched.group(1)}, which is not installed here") from None
                continue
            more = frozenset(_key(e) for e in (matched.group(2) or "").split(",") if e.strip())
            if key not in found or more:
                found[key] = needed
                todo.append((key, more, needed))
    return sorted(found.values(), key=lambda dist: _key(dist.metadata["Name"]))


def _dist_files(dist: metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path under the site folder, file here) of a distribution, its scripts and caches left out."""
    for file in dist.files or ():
        parts = Path(str(file)).parts
        if ".." in parts or "__pycache__" in parts:
            continue
        path = Path(str(dist.locate_file(file)))
        if path.is_file():
            yield str(file), path


def _own_files() -> Iterator[tuple[str, Path]]:
    """guilds' own packages, from where this process imports them."""
    for package in OWN_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SandboxError(f"the package {package} is not importable here")
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield f"{package}/{path.relative_to(root)}", path


SERVE_MODULES = ("guilds.fronts.serve", "guilds.fronts.e2b", "sqlalchemy.ext.asyncio")
"""Imported by a step of the build: a system library the base lacks fails the build, naming it."""
EXTRA_MODULES = {"postgres": "asyncpg", "e2b": "e2b"}


def dockerfile(base: str, *, install: bool, python: tuple[int, int], extras: Sequence[str] = ()) -> str:
    """The Dockerfile text (pure)."""
    modules = ", ".join((*SERVE_MODULES, *(EXTRA_MODULES[e] for e in extras if e in EXTRA_MODULES)))
    version = f"{python[0]}.{python[1]}"
    check = (f"import sys; v = '%d.%d' % sys.version_info[:2]; sys.exit(None if v == '{version}' else "
             f"'the base image has python3 ' + v + ', guilds serve image copies packages for {version}')")
    lines = [f"FROM {base}"]
    if install:
        lines.append("RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates "
                     "&& rm -rf /var/lib/apt/lists/*")
    lines += [
        f'RUN python3 -c "{check}"',
        f"COPY site {SITE}",
        (f"RUN python3 -m compileall -q {SITE} >/dev/null; mkdir -p {DATA} && chown {SERVE_UID}:{SERVE_UID} {DATA}"
         f" && (grep -q '^guilds-serve:' /etc/passwd || echo 'guilds-serve:x:{SERVE_UID}:{SERVE_UID}:"
         f"guilds serve:{DATA}:/bin/sh' >> /etc/passwd)"),
        f'RUN PYTHONPATH={SITE} python3 -c "import {modules}"',
        f"ENV PYTHONPATH={SITE} GUILDS_DATA={DATA} HOME={DATA} PYTHONUNBUFFERED=1",
        f"USER {SERVE_UID}:{SERVE_UID}",
        f"WORKDIR {DATA}",
        'ENTRYPOINT ["python3", "-m", "guilds.fronts.cli"]',
        'CMD ["serve", "--host", "0.0.0.0"]',
    ]
    return "\n".join(lines) + "\n"


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.mode & 0o111 else 0o644
    return info


def write_context(out: Path, text: str, files: Iterator[tuple[str, Path]]) -> int:
    """The build context as a tar at out: the Dockerfile and each file under site/; how many files."""
    count = 0
    with tarfile.open(out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = text.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for name, path in files:
            tar.add(path, arcname=f"site/{name}", recursive=False, filter=_normalized)
            count += 1
    return count


def _files(extras: Sequence[str]) -> Iterator[tuple[str, Path]]:
    dists = distributions(extras)
    yield from _own_files()
    for dist in dists:
        yield from _dist_files(dist)


def build_serve_image(*, tag: str = DEFAULT_TAG, base: str = DEFAULT_BASE, install: bool = True,
                      rootfs: str | None = None, extras: Sequence[str] = DEFAULT_EXTRAS) -> str:
    """Build the image and return its id; SandboxError when the engine cannot (its reason)."""
    python = (sys.version_info[0], sys.version_info[1])
    with tempfile.TemporaryDirectory(prefix="guilds-serve-image-") as work:
        context = Path(work, "context.tar")
        write_context(context, dockerfile(base, install=install, python=python, extras=extras), _files(extras))
        with context.open("rb") as fileobj:
            return built_image(fileobj, tag=tag, base=base, rootfs=rootfs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guilds serve image", description=__doc__.split("\n")[0])
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"the image's name (default {DEFAULT_TAG})")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"the base image (default {DEFAULT_BASE})")
    parser.add_argument("--rootfs", help="a root filesystem tar, imported as --base first")
    parser.add_argument("--no-install", dest="install", action="store_false", help="the base has python3 already")
    parser.add_argument("--extra", action="append", dest="extras", metavar="NAME",
                        help=f"an extra of guilds to install with it (default: {', '.join(DEFAULT_EXTRAS)})")
    return parser


def main(argv: Sequence[str]) -> int:
    """The command: 0 built (its tag and id printed), 1 the build failed, 2 bad input."""
    opts = _parser().parse_args(list(argv))
    if opts.rootfs and not Path(opts.rootfs).is_file():
        print(f"guilds serve image: --rootfs {opts.rootfs}: no such file", file=sys.stderr)
        return 2
    try:
        image_id = build_serve_image(tag=opts.tag, base=opts.base, install=opts.install, rootfs=opts.rootfs,
                                     extras=tuple(opts.extras or DEFAULT_EXTRAS))
    except BadInput as exc:
        print(f"guilds serve image: {exc}", file=sys.stderr)
        return 2
    except GuildsError as exc:
        print(f"guilds serve image: {exc}", file=sys.stderr)
        return 1
    print(f"{opts.tag} {image_id}")
    return 0
