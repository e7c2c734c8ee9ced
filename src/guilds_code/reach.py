"""Why a path is out of a uid's reach: the folder on its way that the uid cannot pass.

    blocker(path, uid, gid, skip=())  -> (folder, stat) of the first folder uid cannot pass, or None
    out_of_reach(path, home)          -> the one-line reason this process cannot reach path, or None
    why(exc, path, home)              -> out_of_reach for a PermissionError, else exc's strerror
    unreadable(st)                    -> the one-line reason this process may not read the file st

A folder is passed with its search (x) permission: the owner's bits for its
owner, the group's for its group, the others' for everyone else; uid 0 passes
all. Inside a sandbox the agent runs as a uid of its own, with no
supplementary groups, so a folder of root's with mode 0700 (what ``mktemp -d``
makes) stops it even when the path below it exists. The answer names the
agent's uid, the folder, its mode and owner, and what to change::

    the agent's uid 1550723797 cannot pass /opt/tmp.x (drwx------, owned by root): let it through
    (chmod o+x /opt/tmp.x), or put the home where that uid can reach it

The host's ``guilds doctor`` asks ``blocker`` the same for the agent's uid
(``skip``: the folders the sandbox makes anew, whose host modes do not count).
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Optional, Tuple


def can_pass(st: os.stat_result, uid: int, gid: int) -> bool:
    """May uid (with gid, no other groups) pass through the folder st (search, x), as the
    kernel checks the mode: the owner's bit, else the group's, else the others'?"""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _folders(path: str) -> List[str]:
    """"/", then each folder on the way to path, then path itself."""
    found, current = ["/"], ""
    for name in [c for c in path.split("/") if c not in ("", ".")]:
        current = f"{current}/{name}"
        found.append(current)
    return found


def blocker(path: str, uid: int, gid: int, skip: Iterable[str] = ()) -> Optional[Tuple[str, os.stat_result]]:
    """The first folder on the way to path (path included, when a folder) that uid cannot
    pass, with its stat; None when none stops it or the way ends (a name not there).
    This process stats each folder: one it cannot stat stops it at the folder before.
    The folders in skip are taken as passable (made anew where uid will look)."""
    skipped = set(skip)
    before: Optional[Tuple[str, os.stat_result]] = None
    for folder in _folders(os.path.normpath(path)):
        try:
            st = os.stat(folder)
        except PermissionError:
            return before
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        if folder not in skipped and not can_pass(st, uid, gid):
            return folder, st
        before = (folder, st)
    return None


def owner_name(uid: int) -> str:
    """The user name of uid where the system has one, else "uid N"."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def problem_and_fix(folder: str, st: os.stat_result, uid: int, home: Optional[str] = None) -> Tuple[str, str]:
    """For a blocker: who cannot pass what, and the ways out (a folder inside the home may
    also be given to the agent; one outside it, or the home moved elsewhere)."""
    problem = (f"the agent's uid {uid} cannot pass {folder} "
               f"({stat.filemode(st.st_mode)}, owned by {owner_name(st.st_uid)})")
    if st.st_uid == uid:  # its own folder: only the owner's bits count
        return problem, f"let it through (chmod u+rx {folder})"
    if home is not None and (folder == home or folder.startswith(home.rstrip("/") + "/")):
        return problem, f"let it through (chmod o+x {folder}, or chown -R {uid} {folder})"
    return problem, f"let it through (chmod o+x {folder}), or put the home where that uid can reach it"


def describe(folder: str, st: os.stat_result, uid: int, home: Optional[str] = None) -> str:
    """The one reason line for a blocker: ``problem_and_fix`` joined."""
    return ": ".join(problem_and_fix(folder, st, uid, home))


def out_of_reach(path: str, home: Optional[str] = None) -> Optional[str]:
    """Why this process cannot reach path, when a folder on its way stops its uid; else None.
    home: the agent's home (a folder inside it is fixed by giving it to the agent)."""
    uid, gid = os.geteuid(), os.getegid()
    found = blocker(os.path.realpath(path), uid, gid)  # links resolved as far as they can be
    return None if found is None else describe(*found, uid, None if home is None else os.path.realpath(home))


def unreadable(st: os.stat_result) -> str:
    """Why this process may not read the file st (its mode and owner, and the agent's uid)."""
    uid = os.geteuid()
    return (f"the agent's uid {uid} may not read it ({stat.filemode(st.st_mode)}, owned by "
            f"{owner_name(st.st_uid)}): chmod o+r it, or chown it to {uid}")


def why(exc: OSError, path: str, home: Optional[str] = None) -> str:
    """exc's own words; for a permission refused on the way to path, which folder stops
    the agent's uid and how to let it through (``out_of_reach``)."""
    if isinstance(exc, PermissionError):
        reason = out_of_reach(path, home)
        if reason is not None:
            return reason
    return exc.strerror or str(exc)
