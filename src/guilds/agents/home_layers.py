"""A template's starting home frozen as a read-only layer, once per content version.

    with layer_lock(data_dir, template_home) as layers:
        name = layers.current()            # the layer of the home as it is now, frozen if new
        ...                                # the agent's reference to it made, under the lock
    prune(data_dir, name)                  # removed once no agent uses it and a newer one exists

Under the data folder::

    agent-layers/<key>-<version>/    a frozen copy of the template's home: every file
                                     root's, modes, times and links as the template's
    agent-layers/<key>.latest        the name of the newest layer of that home
    agent-layers/<key>.lock          held (flock) while a layer is chosen, frozen or pruned
    agent-overlays/<agent>/lower     a link naming the layer the agent's home is made on
    agent-layers/held/<holder>       the layers something other than a home keeps (an E2B
                                     snapshot: ``fork_layers.hold``), one name a line

The key is the template home's real path, digested; the version is a digest of
every entry's path, kind and mode, size, inode and ctime, read by a walk that
reads no file's content (the kernel moves ctime on every write, chmod, chown
and rename, and no call sets it back, so an edit always gives a new version).
A walk's version is kept HOME_VERSION_SECONDS: an edit to a template's home
reaches every agent made that long after it. A layer is made whole (a copy
beside it, renamed into place) and never written again: an edit to the
template makes a new layer and leaves the ones live agents stand on alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import SandboxError
from ..limits import HOME_VERSION_SECONDS

LAYERS_FOLDER = "agent-layers"
OVERLAYS_FOLDER = "agent-overlays"
LOWER_LINK = "lower"
HELD_FOLDER = "held"
COPY_ARGV = ("cp", "-a", "--reflink=auto", "--no-target-directory", "--")
"""A folder's contents into a new folder (made by it): links as links, modes and times kept."""
_versions: dict[str, tuple[float, str]] = {}
"""Template home (real path) -> (monotonic time walked, version)."""


def template_key(template_home: Path) -> str:
    return hashlib.sha256(os.fsencode(os.path.realpath(template_home))).hexdigest()[:16]


def version_of(template_home: Path) -> str:
    """The digest of every entry's path, mode, size, inode and ctime (no content read)."""
    digest = hashlib.sha256()
    root = os.fsencode(template_home)
    pending = [b""]
    while pending:
        rel = pending.pop()
        with os.scandir(root + rel) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                path = rel + b"/" + entry.name
                digest.update(b"%s\0%o %d %d %d\n" % (path, info.st_mode, info.st_size, info.st_ino,
                                                      info.st_ctime_ns))
                if entry.is_dir(follow_symlinks=False):
                    pending.append(path)
    return digest.hexdigest()[:20]


def copy_tree(source: Path, target: Path, *, holes: bool = False) -> None:
    """``cp -a`` of source's contents into target (made by the copy); SandboxError naming what failed.
    holes: every block of zeros written as a hole (``--sparse=always``): an overlay upper's files
    that hold their metadata only read as zeros, and take no data block in the copy."""
    argv = [*COPY_ARGV[:-1], "--sparse=always", "--"] if holes else list(COPY_ARGV)
    done = subprocess.run([*argv, str(source), str(target)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["cp failed"])[-1]
        raise SandboxError(f"cannot copy {source} to {target}: {last}")


def all_root(folder: Path) -> None:
    """Every entry under folder (links themselves) made root's: the layer's one owner."""
    for where, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            path = os.path.join(where, name)
            info = os.lstat(path)
            if info.st_uid or info.st_gid:
                os.lchown(path, 0, 0)
    os.lchown(folder, 0, 0)


@dataclass
class Layers:
    """The layers of one template home, its lock held."""

    template_home: Path
    folder: Path
    key: str

    def current(self) -> str:
        """The name of the layer of the template's home as it is now (as last walked within
        HOME_VERSION_SECONDS), frozen now when there is none."""
        real = os.path.realpath(self.template_home)
        walked = _versions.get(real)
        if walked is None or time.monotonic() - walked[0] > HOME_VERSION_SECONDS:
            walked = (time.monotonic(), version_of(self.template_home))
            _versions[real] = walked
        name = f"{self.key}-{walked[1]}"
        if not (self.folder / name).is_dir():
            self._freeze(name)
        return name

    def _freeze(self, name: str) -> None:
        part = self.folder / f".{name}.part"
        shutil.rmtree(part, ignore_errors=True)  # a freeze a stopped process left
        try:
            copy_tree(Path(os.path.realpath(self.template_home)), part)
            all_root(part)
            part.rename(self.folder / name)
        except BaseException:
            shutil.rmtree(part, ignore_errors=True)
            raise
        latest, part = self.folder / f"{self.key}.latest", self.folder / f"{self.key}.latest.part"
        part.write_text(name)
        part.replace(latest)
        for old in self.folder.glob(f"{self.key}-*"):
            if old.name != name:
                self.drop_if_unused(old.name)

    def latest(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / f"{self.key}.latest").read_text()
        return ""

    def drop_if_unused(self, name: str) -> bool:
        """Remove the layer when no agent's home stands on it and it is not the newest."""
        if name == self.latest() or name in layers_in_use(self.folder.parent):
            return False
        shutil.rmtree(self.folder / name, ignore_errors=True)
        return True


def held(data_dir: Path) -> set[str]:
    """The names of the layers held apart from homes (``fork_layers.hold``)."""
    names: set[str] = set()
    with contextlib.suppress(FileNotFoundError):
        for holder in os.scandir(data_dir / LAYERS_FOLDER / HELD_FOLDER):
            with contextlib.suppress(FileNotFoundError):
                names.update(Path(holder.path).read_text().split())
    return names


def layers_in_use(data_dir: Path) -> set[str]:
    """The names of the layers agents' homes stand on or something holds."""
    used = held(data_dir)
    with contextlib.suppress(FileNotFoundError):
        for agent in os.scandir(data_dir / OVERLAYS_FOLDER):
            with contextlib.suppress(OSError):
                used.add(os.path.basename(os.readlink(os.path.join(agent.path, LOWER_LINK))))
    return used


@contextlib.contextmanager
def layer_lock(data_dir: Path, template_home: Path) -> Iterator[Layers]:
    """The template home's layers, its flock held (one process and thread at a time)."""
    folder = data_dir / LAYERS_FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)
    key = template_key(template_home)
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield Layers(template_home, folder, key)


def prune(data_dir: Path, name: str) -> bool:
    """Remove the layer ``name`` if no agent's home stands on it and a newer one exists."""
    key = name.rsplit("-", 1)[0]
    folder = data_dir / LAYERS_FOLDER
    if not (folder / name).is_dir():
        return False
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Layers(Path(), folder, key).drop_if_unused(name)
