"""Whether the agent's uid can reach its home and repositories inside the bwrap sandbox.

    out_of_reach(settings, data_dir) -> [(what, problem, fix)]    empty when every one is reached

Inside, the agent runs as its own uid (``sandbox_owner``) with no other groups.
The folders on the way to the home that the sandbox makes itself (fresh mounts,
the home's parents outside the bound system folders: ``made_anew``) are passable
whatever their host mode; every other one is the host's, with its host mode: a
0700 folder of root's under ``/opt`` or ``/usr`` shuts the agent out, as does a
0700 folder of root's inside the home made after the home was given to the agent.
The data folder is hidden behind a fresh tmpfs (passable too).
A home not yet the agent's is given to it whole when the sandbox starts
(``own_tree``), so then only the way to it counts.
"""

from __future__ import annotations

import os
import posixpath

from guilds_code.reach import blocker, problem_and_fix

from ...config.settings import AgentSettings
from .bwrap_argv import host_system, made_anew, sandbox_owner


def _is_given(home: str, uid: int) -> bool:
    """Is the home the agent's uid's already? (Else the sandbox's start gives it whole.)"""
    try:
        return os.stat(home).st_uid == uid
    except OSError:
        return False  # made, then given, when the sandbox starts


def out_of_reach(settings: AgentSettings, data_dir: str | os.PathLike) -> list[tuple[str, str, str]]:
    """(what, problem, fix) for the home or each repository the agent's uid cannot reach
    inside (only the home, when it is the one out of reach: its repositories are with it).
    data_dir: the data folder, hidden behind a fresh tmpfs inside (passable)."""
    uid, gid, _ = sandbox_owner(settings)
    home = str(settings.home)
    skip = (*made_anew(home, host_system()), os.path.realpath(data_dir))
    given = _is_given(home, uid)
    stop = blocker(home, uid, gid, skip if given else (*skip, home))
    if stop is not None:
        return [(f"home {home}", *problem_and_fix(*stop, uid, home))]
    found = []
    for repo in settings.repos if given else ():
        path = posixpath.join(home, repo.path)
        stop = blocker(path, uid, gid, skip)
        if stop is not None:
            found.append((f"repos.{repo.name} {path}", *problem_and_fix(*stop, uid, home)))
    return found
