"""What the host-folder backends (local, bwrap) share: the agent's environment,
repos.json, the sandbox file API's safe write, and the removal of what ``rm``
removes of the data folder.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Mapping

from guilds_code import limits

from ..config.checks import is_safe_name
from ..config.settings import AgentSettings
from ..errors import SandboxError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH of the agent's commands when the orchestrator has none."""
LANG = "C.UTF-8"
_DIR_MODE = 0o700
_FILE_MODE = 0o600


def real_python() -> str:
    """The interpreter that runs the helpers: this one's real binary, not a pyenv shim."""
    return os.path.realpath(sys.executable)


def checked_id(settings: AgentSettings) -> str:
    """The agent id, which names files: refused unless it is a safe file name."""
    if not is_safe_name(settings.id):
        raise SandboxError(f"agent.id: {settings.id!r} cannot name a file")
    return settings.id


def agent_env(settings: AgentSettings, *, home: str, state_dir: str, path: str | None) -> dict[str, str]:
    """The environment of every command the agent runs.

    PATH (the orchestrator's, else DEFAULT_PATH), LANG=C.UTF-8, the secrets, and
    then, over any secret of the same name: HOME, PORT (the block's first port),
    PORTS (the whole block as ``first-last``, e.g. ``20000-20099``) and
    GUILDS_STATE_DIR (the state root as the sandbox sees it).
    """
    first, last = settings.ports
    return {
        "PATH": path or DEFAULT_PATH,
        "LANG": LANG,
        **settings.secrets,
        "HOME": home,
        "PORT": str(first),
        "PORTS": f"{first}-{last}",
        limits.STATE_DIR_ENV: state_dir,
    }


def write_repos(settings: AgentSettings, *, state_root: str | int, home: str,
                owner: tuple[int, int] | None = None, shown: str | None = None,
                entries: Mapping[str, Any] | None = None) -> None:
    """``<state root>/<agent id>/repos.json`` (0600): each repository's absolute
    folder, as the sandbox sees it under ``home``, -> its token (tokenless ones left out),
    or the entries given (behind the egress proxy: placeholders, Egress.repos_entries).

    state_root is the host folder behind the state root, or a handle on it
    (``write_beneath``'s root and shown).
    """
    tokens = entries if entries is not None else {
        posixpath.join(home, r.path): r.token for r in settings.repos if r.token}
    data = json.dumps(tokens, indent=1, sort_keys=True).encode()
    write_beneath(state_root, f"{checked_id(settings)}/repos.json", data, owner=owner, shown=shown)


def locate(path: str, roots: Mapping[str, str]) -> tuple[str, str]:
    """A sandbox path -> (host folder, path relative to it), for the first root holding it.

    ``roots`` maps folders as the sandbox sees them to the host folders behind
    them. Components are compared whole: ``/home/a-evil`` is not in ``/home/a``.
    """
    norm = posixpath.normpath(path)
    if not path.startswith("/") or "\x00" in path:
        raise SandboxError(f"write_file: {path!r} is not an absolute path")
    for inside, host in roots.items():
        rel = posixpath.relpath(norm, inside)
        if rel != "." and not rel.startswith("../") and rel != "..":
            return host, rel
    raise SandboxError(f"write_file: {path} is outside the home and the state root")


def _enter(dir_fd: int, name: str, owner: tuple[int, int] | None) -> int:
    """Open (making it if missing) the folder name under dir_fd, refusing links."""
    made = True
    try:
        os.mkdir(name, _DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        made = False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=dir_fd)
    if made and owner is not None:
        os.fchown(fd, *owner)
    return fd


def _write_at(dir_fd: int, name: str, data: bytes, owner: tuple[int, int] | None) -> None:
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, _FILE_MODE, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), _FILE_MODE)
            if owner is not None:
                os.fchown(fh.fileno(), *owner)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_beneath(root: str | int, rel: str, data: bytes, *, owner: tuple[int, int] | None = None,
                  shown: str | None = None) -> None:
    """Write root/rel atomically (temp file + rename), mode 0600, folders made 0700,
    what it makes owned by ``owner`` (uid, gid) when given (the sandbox's uid).

    root: a folder, or a handle on one (an fd, left open; ``shown`` names it in errors).
    rel is walked one component at a time from a handle on root, never
    following a link: the sandbox's folders are the agent's to rewrite, and a
    link planted there must not send the orchestrator's write elsewhere.
    """
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise SandboxError(f"write_file: bad path {rel!r}")
    where = shown or str(root)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if isinstance(root, str) else os.dup(root)
        try:
            for part in parts[:-1]:
                fd, old = _enter(fd, part, owner), fd
                os.close(old)
            _write_at(fd, parts[-1], data, owner)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SandboxError(f"write_file: cannot write {rel} under {where}: {exc.strerror}") from exc


def own_tree(root: str, owner: tuple[int, int]) -> None:
    """Give root and everything beneath it to owner (uid, gid), root itself mode 0700.

    Links are changed themselves, never followed. Done when root is not owner's
    yet (a home made or written by root before the sandbox's uid was set).
    """
    info = os.lstat(root)
    if (info.st_uid, info.st_gid) == owner:
        return
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.chown(os.path.join(folder, name), *owner, follow_symlinks=False)
    os.chown(root, *owner, follow_symlinks=False)
    os.chmod(root, _DIR_MODE)


def removed(paths: list[Path]) -> Iterator[str]:
    """Remove each of paths that exists (a folder with all it holds); yield each one removed."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        yield str(path)
