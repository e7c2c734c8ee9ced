"""What the bwrap sandbox hides of the host: BwrapConfig.hidden and hidden_files.

    hiding(home, data, agents, system) -> Hiding

The sandbox binds ``/usr``, ``/etc``, ``/opt`` and ``/nix`` whole, and its
home; anything under them is in reach of the agent's uid as far as modes
allow. Hidden from every sandbox, whatever the modes:

- the data folder (run record, token, other sandboxes' files);
- every other known agent's home (``guilds.config.agents``);
- every known agent's settings file, its own included (it holds secrets):
  the folder holding it behind an empty tmpfs when that folder lies below a
  bound system folder and is none of the sandbox's own places (not the home,
  nor in it, nor a system folder or above one); otherwise the file alone,
  behind ``/dev/null``.

A hidden path that does not exist on the host, or lies outside every bound
folder, needs nothing (it is not there inside). A file alone is the weaker
kind: a file renamed over it on the host (an editor's save) replaces it in the
sandbox too, so ``stamp`` gives each hidden path's inode for the sandbox's
config fingerprint: the next call then starts the sandbox anew.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Iterable, Sequence

from ...config.agents import KnownAgent


@dataclass(frozen=True)
class Hiding:
    folders: tuple[str, ...]
    """Behind an empty tmpfs."""
    files: tuple[str, ...]
    """Behind /dev/null."""


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class _Places:
    """The host folders the sandbox binds: the system folders and the home."""

    def __init__(self, home: str, system: Sequence[tuple[str, str | None]]):
        self.home = home
        self.system = [os.path.realpath(p) for p, target in system if target is None]

    def reachable(self, path: str) -> bool:
        return any(_within(path, folder) for folder in (*self.system, self.home))

    def hideable_folder(self, path: str) -> bool:
        """Strictly below a system folder, and none of the sandbox's own places."""
        below = any(_within(path, s) and path != s for s in self.system)
        holds_a_system_folder = any(_within(s, path) for s in self.system)
        return below and not holds_a_system_folder and not _within(path, self.home)

    def other_home(self, path: str) -> bool:
        """Another agent's home to hide: in reach, there, and not above a system folder
        (hiding that would hide the toolchain)."""
        return (path != self.home and self.reachable(path) and os.path.isdir(path)
                and not any(_within(s, path) for s in self.system))


def hiding(home: str, data: str, agents: Iterable[KnownAgent],
           system: Sequence[tuple[str, str | None]]) -> Hiding:
    """The paths to hide in the sandbox whose home is home (host state read: which paths exist)."""
    places = _Places(os.path.realpath(home), system)
    agents = tuple(agents)
    homes = (os.path.realpath(a.home) for a in agents  # one in the data folder and not in the home: hidden with it
             if not _within(a.home, data) or _within(a.home, places.home))
    folders = [data, *(h for h in homes if places.other_home(h))]
    files: list[str] = []
    for agent in agents:
        if agent.settings is None:
            continue
        folder = posixpath.dirname(agent.settings)
        if places.hideable_folder(folder) and os.path.isdir(folder):
            folders.append(folder)
        elif places.reachable(agent.settings) and os.path.isfile(agent.settings):
            files.append(agent.settings)
    kept = _uncovered(folders, folders, places.home)
    return Hiding(kept, _uncovered(files, kept, places.home))


def _covered(path: str, folder: str, home: str) -> bool:
    """path is hidden with folder: inside it, and not put back by the home's bind after it."""
    return path != folder and _within(path, folder) and (not _within(path, home) or _within(folder, home))


def _uncovered(paths: Sequence[str], folders: Sequence[str], home: str) -> tuple[str, ...]:
    unique = list(dict.fromkeys(paths))
    return tuple(p for p in unique if not any(_covered(p, f, home) for f in folders))


def stamp(hidden: Hiding) -> list[tuple[str, int]]:
    """Each hidden path with its inode now (0: gone): a change means the sandbox must start anew."""
    found = []
    for path in (*hidden.folders, *hidden.files):
        try:
            found.append((path, os.stat(path).st_ino))
        except OSError:
            found.append((path, 0))
    return found
