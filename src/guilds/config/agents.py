"""The agents a data folder knows, so that every sandbox can hide all of them.

    remember(data, settings, settings_file)    when a front opens an agent's toolbox
    known(data) -> tuple[KnownAgent, ...]      every agent remembered, by id
    forget(data, agent_id) -> str | None       an agent removed: its entry gone

One file per agent, ``<data>/agents/<agent id>.json``: ``{"settings": path or
null, "home": path}``, mode 0600 in the private data folder (no sandbox sees
it). Every front that opens a toolbox (``guilds call``, ``guilds mcp``,
``guilds serve``, ``guilds.open``) remembers its agent there first; the bwrap
sandbox reads the list each time it checks its config (``guilds.sandbox.bwrap.bwrap_hide``),
and ``guilds doctor`` checks each remembered settings file's mode.
An entry that cannot be read is skipped; one whose files are gone hides nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import RecordError
from .settings import AgentSettings

AGENTS_FOLDER = "agents"
MAX_ENTRY_BYTES = 64 << 10
"""The most of an entry read: two paths."""


@dataclass(frozen=True)
class KnownAgent:
    id: str
    home: str
    """The agent's home, resolved."""
    settings: str | None
    """Its settings file, resolved; None for settings given as an object."""


def _entry(agent: KnownAgent) -> bytes:
    return json.dumps({"settings": agent.settings, "home": agent.home}).encode()


def remember(data: Path, settings: AgentSettings, settings_file: Path | None) -> None:
    """Write (or keep, when unchanged) the agent's entry; RecordError naming the file when it cannot be."""
    agent = KnownAgent(settings.id, os.path.realpath(settings.home),
                       None if settings_file is None else os.path.realpath(settings_file))
    folder = Path(data) / AGENTS_FOLDER
    path = folder / f"{agent.id}.json"
    if _read(path, agent.id) == agent:
        return
    temp = folder / f".{agent.id}.{os.getpid()}.tmp"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_entry(agent))
        os.replace(temp, path)
    except OSError as exc:
        raise RecordError(f"cannot write {path}: {exc.strerror or exc}") from None


def _read(path: Path, agent_id: str) -> KnownAgent | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            entry = json.loads(fh.read(MAX_ENTRY_BYTES))
    except (OSError, ValueError):
        return None
    home, settings = (entry.get(k) if isinstance(entry, dict) else None for k in ("home", "settings"))
    if not isinstance(home, str) or not (settings is None or isinstance(settings, str)):
        return None
    return KnownAgent(agent_id, home, settings)


def known(data: Path) -> tuple[KnownAgent, ...]:
    """Every agent remembered in the data folder, by id (none when the folder is not there).

    The folder is listed each time; an entry is read again only when its file changed (its
    inode, size or modification time: every write replaces the file), else taken from what
    this process read of it before (``_READ``)."""
    folder = Path(data) / AGENTS_FOLDER
    before = _READ.get(str(folder), {})
    now: dict[str, tuple[tuple[int, int, int], KnownAgent | None]] = {}
    try:
        with os.scandir(folder) as listing:
            for item in listing:
                if not item.name.endswith(".json"):
                    continue
                with contextlib.suppress(OSError):  # removed meanwhile: not known
                    stat = item.stat(follow_symlinks=False)
                    seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                    kept = before.get(item.name)
                    now[item.name] = kept if kept is not None and kept[0] == seen else \
                        (seen, _read(folder / item.name, item.name.removesuffix(".json")))
    except OSError:
        now = {}
    with _READ_LOCK:  # threads list at once (the bwrap sandbox's checks run in threads)
        _READ.pop(str(folder), None)
        _READ[str(folder)] = now
        while len(_READ) > READ_FOLDERS_KEPT:
            _READ.pop(next(iter(_READ)))
    return tuple(agent for _, (_, agent) in sorted(now.items()) if agent is not None)


_READ: dict[str, dict[str, tuple[tuple[int, int, int], KnownAgent | None]]] = {}
"""By agents folder: each entry's file name, its (inode, size, mtime) when read, what was read."""
_READ_LOCK = threading.Lock()
READ_FOLDERS_KEPT = 8
"""The most data folders whose entries this process keeps (the latest listed)."""


def forget(data: Path, agent_id: str) -> str | None:
    """Remove the agent's entry (an agent made on demand, removed); its path when it was there."""
    path = Path(data) / AGENTS_FOLDER / f"{agent_id}.json"
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError(f"cannot remove {path}: {exc.strerror or exc}") from None
    return str(path)
