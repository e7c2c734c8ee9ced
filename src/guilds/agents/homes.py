"""An agent's own home: its template's starting home, copy-on-write where the kernel allows.

    make_home(template_home, home, data_dir, owner)   the home made; SandboxError naming what failed
    remove_home(home, data_dir) -> bool               gone, with all it holds (False: it was not there)
    mount_homes(data_dir, homes) -> [home]            the overlay homes not mounted, mounted again
    make_home(..., swappable=True); mount_home(...)   a pooled home whose sandbox sees a later mount
    swap_home(data_dir, home, above, lower)           such a home given a fork's layers, in place

**An overlay** when the orchestrator is root, the sandbox gives the home to a
uid (``Sandbox.home_owner``) and the kernel mounts it: the home is an overlayfs
mount on the host at its own path, so every reader there (the sandbox's bind,
checkpoints, the file API) sees the one merged tree. Its lower layer is the
template's home frozen once per content version (``home_layers``), read-only,
shared by every agent of it and seen through an idmapped mount (``mounts``):
its files, root's on disk, are the agent's uid's in the home. What the agent
writes, and every file it changes (copied up whole at its first write; a change of its
metadata only copies that only: ``mounts.OVERLAY_OPTIONS``), goes
to its own upper folder, ``agent-overlays/<id>/upper`` under the data folder,
which starts empty and owned by the agent's uid; a file deleted is a whiteout
there. The layer and every other agent's folders are never written.

**A copy** otherwise (not root, no overlayfs, no owner, or the mount failed):
``cp -a --reflink=auto``, blocks shared where the filesystem can (btrfs, XFS),
a plain copy elsewhere; the sandbox gives it to the agent's uid when it starts.
The reason is logged once per process (a mount that fails for one agent is
logged each time). A template without a starting home gives an empty home.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from ..errors import SandboxError
from . import fork_layers, home_layers, mounts
from .home_layers import LOWER_LINK, OVERLAYS_FOLDER, copy_tree, layer_lock

HOME_MODE = 0o700
log = logging.getLogger(__name__)
_told: set[str] = set()
_probed: dict[str, str | None] = {}
_probing = threading.Lock()


def _once(reason: str) -> None:
    if reason not in _told:
        _told.add(reason)
        log.info("agents' homes are copies: %s", reason)


def overlay_dir(data_dir: Path, home: Path) -> Path:
    """The agent's own folders of its overlay home: upper, work, and the link to its layer."""
    return data_dir / OVERLAYS_FOLDER / home.name


def make_home(template_home: Path, home: Path, data_dir: Path, owner: tuple[int, int] | None, *,
              swappable: bool = False) -> bool:
    """Make home (it must not exist) the template's home's: an overlay, else a copy.
    owner: the uid and gid the sandbox runs the agent as (None: a copy). swappable: an overlay
    home is made a shared mount point of its own (``mounts.share_point``) and its overlay left
    unmounted, for ``mount_home`` once a sandbox has bound the point: the overlay then appears
    in it, and ``swap_home`` can give it another. True when the home is such a one."""
    try:
        os.mkdir(home, HOME_MODE)
    except OSError as exc:
        raise SandboxError(f"cannot make the agent's home {home}: {exc.strerror or exc}") from None
    if not template_home.is_dir():
        return False
    reason = overlay_unavailable(data_dir, owner)
    if reason is None and owner is not None:
        try:
            _make_overlay(template_home, home, data_dir, owner, mount=not swappable)
            if swappable:
                _shared(home, data_dir)
            return swappable
        except (OSError, SandboxError) as exc:
            log.warning("agent home %s: a copy, the overlay failed: %s", home, exc)
    elif reason is not None:
        _once(reason)
    copy_tree(Path(os.path.realpath(template_home)), home)
    return False


def _make_overlay(template_home: Path, home: Path, data_dir: Path, owner: tuple[int, int], *,
                  mount: bool = True) -> None:
    own = overlay_dir(data_dir, home)
    own.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        with layer_lock(data_dir, template_home) as layers:
            name = layers.current()
            os.mkdir(own, 0o700)
            os.symlink(os.path.join("..", "..", home_layers.LAYERS_FOLDER, name), own / LOWER_LINK)
        _folders(own, owner)
        if mount:
            _mount(home, own)
    except BaseException:
        shutil.rmtree(own, ignore_errors=True)
        raise


def _shared(home: Path, data_dir: Path) -> None:
    """home made a shared point (``mounts.share_point``); its overlay's folders removed when it
    cannot be (the home is then a copy, with no overlay's folders to mount again later)."""
    try:
        mounts.share_point(home)
    except BaseException:
        shutil.rmtree(overlay_dir(data_dir, home), ignore_errors=True)
        raise


def mount_home(data_dir: Path, home: Path) -> None:
    """A swappable home's overlay mounted on its point (``make_home``)."""
    _mount(home, overlay_dir(data_dir, home))


def swap_home(data_dir: Path, home: Path, above: list[str], lower: str | None) -> None:
    """A swappable home given other layers: its overlay taken off its point (detached lazily:
    what still holds it keeps the old tree, which no path reaches; this process holds it too
    and lets it go in the background, ``_let_go``, for overlayfs syncs its upper's whole
    filesystem when its last user goes), its upper emptied, the
    fork layers ``above`` over the template layer ``lower`` (a ``lower`` link's target) named
    under the forks' lock, and the new overlay mounted on the point. The layers it stood on
    before are pruned when nothing else stands on them."""
    own = overlay_dir(data_dir, home)
    info = os.stat(own / "upper")
    held = os.open(home, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mounts.detach_overlay(home)
    finally:
        _let_go(held)
    old_lower = ""
    with contextlib.suppress(OSError):
        old_lower = os.path.basename(os.readlink(own / LOWER_LINK))
    old_above = fork_layers.above(own)
    for name in ("upper", "work"):
        shutil.rmtree(own / name)
    with fork_layers.forks_lock(data_dir):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(own / LOWER_LINK)
        if lower is not None:
            os.symlink(lower, own / LOWER_LINK)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(own / fork_layers.ABOVE_FILE)
        fork_layers.link(own, above)
        _folders(own, (info.st_uid, info.st_gid))
    _mount(home, own)
    if old_lower and os.path.basename(lower or "") != old_lower:
        home_layers.prune(data_dir, old_lower)
    fork_layers.prune(data_dir, [name for name in old_above if name not in above])


_letting_go = ThreadPoolExecutor(1, thread_name_prefix="guilds-overlays-let-go")


def _let_go(fd: int) -> None:
    """Close fd (the last hold on an overlay taken off its point, or a layer's detached clone)
    in this process's one background thread, one after another: the mount's release (an
    overlay's teardown syncs its upper's filesystem; any waits for the kernel's grace period)
    waits on no caller."""
    _letting_go.submit(os.close, fd)


def _folders(own: Path, owner: tuple[int, int]) -> None:
    """upper (the agent's, 0700: the home's own owner and mode) and work (overlayfs's, root's)."""
    for name in ("upper", "work"):
        os.mkdir(own / name, HOME_MODE)
    os.chown(own / "upper", *owner)


def _mount(home: Path, own: Path) -> None:
    """Mount the agent's overlay at home: its layers (a fork's above its template's: ``fork_layers``),
    its upper's owner the files'."""
    info = os.stat(own / "upper")
    layers = mounts.layer_mounts([str(layer) for layer in fork_layers.stack(own.parent.parent, own)],
                                 (info.st_uid, info.st_gid))
    try:
        mounts.mount_overlay(str(home), layers, str(own / "upper"), str(own / "work"))
    finally:
        for layer_fd in layers:  # a detached clone: its release waits for the kernel, in the background
            _let_go(layer_fd)


def remove_home(home: Path, data_dir: Path) -> bool:
    """Remove the home and all it holds (links removed, never followed): an overlay unmounted
    first (detached lazily when busy), its own folders removed, its layers pruned when unused."""
    own = overlay_dir(data_dir, home)
    layer, forked = "", []
    if os.path.lexists(own):
        if mounts.unmount(home):
            log.warning("agent home %s was busy: detached lazily", home)
        with contextlib.suppress(OSError):
            layer = os.path.basename(os.readlink(own / LOWER_LINK))
        forked = fork_layers.above(own)
        shutil.rmtree(own)
    gone = _remove_path(home)
    if layer:
        home_layers.prune(data_dir, layer)
    fork_layers.prune(data_dir, forked)
    return gone


def _remove_path(home: Path) -> bool:
    if not os.path.lexists(home):
        return False
    if home.is_symlink() or not home.is_dir():
        home.unlink()
    else:
        shutil.rmtree(home)
    return True


def mount_homes(data_dir: Path, homes: Iterable[Path]) -> list[Path]:
    """Mount each overlay home of homes that is not mounted (a reboot, an unmount); those mounted.
    One that cannot be mounted is logged and left: its sandbox would find an empty folder."""
    points, done = set(mounts.overlay_homes()), []  # a swappable home's bare point is no overlay
    for home in homes:
        own = overlay_dir(data_dir, home)
        if not own.is_dir() or os.path.realpath(home) in points:
            continue
        try:
            home.mkdir(mode=HOME_MODE, exist_ok=True)
            _mount(home, own)
            done.append(home)
        except (OSError, SandboxError) as exc:
            log.error("agent home %s: not mounted again: %s", home, exc)
    return done


def overlay_unavailable(data_dir: Path, owner: tuple[int, int] | None) -> str | None:
    """Why homes under data_dir cannot be overlays here, or None when they can (probed once:
    a mount of a one-file layer under the data folder, written through, then removed)."""
    if owner is None:
        return "the sandbox gives its home to no uid of its own"
    if os.geteuid() != 0:
        return "the orchestrator is not root (overlayfs mounts need root)"
    key = os.path.realpath(data_dir)
    with _probing:  # one probe at a time: makes at once (a pool's) would share its folder
        if key not in _probed:
            _probed[key] = _probe(Path(key))
    return _probed[key]


def _probe(data_dir: Path) -> str | None:
    probe = data_dir / home_layers.LAYERS_FOLDER / f".probe-{os.getpid()}"
    try:
        probe.parent.mkdir(mode=0o700, exist_ok=True)
        os.makedirs(probe / "lower", mode=0o700)
        (probe / "lower" / "f").write_text("layer")
        for name in ("upper", "work", "home"):
            os.mkdir(probe / name, HOME_MODE)
        os.chown(probe / "upper", 1, 1)
        layer = mounts.layer_mount(str(probe / "lower"), (1, 1))
        try:
            mounts.mount_overlay(str(probe / "home"), layer, str(probe / "upper"), str(probe / "work"))
        finally:
            os.close(layer)
        try:
            (probe / "home" / "f").write_text("agent")
            if (probe / "lower" / "f").read_text() != "layer" or os.stat(probe / "home" / "f").st_uid != 1:
                return "the overlay mounted here does not keep its layer apart"
        finally:
            mounts.unmount(probe / "home")
        return None
    except (OSError, SandboxError) as exc:
        return f"no overlay mount here ({exc})"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
