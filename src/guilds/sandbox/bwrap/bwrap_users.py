"""The sandbox's /etc/passwd and /etc/group: the host's, with the agent's uid and gid named.

A bwrap sandbox binds the host's /etc, where the agent's uid (under a root orchestrator,
one far above every user's: ``bwrap_argv.agent_uid``) has no name: ``whoami`` and
``id -un`` fail, ``ls -l`` and E2B's file owners show a bare number, git and ssh refuse
it. The sandbox gets copies of both files that add ``guilds`` (the name the container
image gives its uid, docs/sandboxes.md) for a uid or gid the host does not name, bound
read-only over the host's. An agent whose settings name a user (``AgentSettings.user``)
has its uid and gid named so instead (``sandbox_user.users_texts``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...config.settings import SandboxUser
from ..sandbox_user import GROUP, PASSWD, write_readable
from ..sandbox_user import users_texts as named_texts

USER_NAME = "guilds"


def _named(lines: list[str], ident: int) -> bool:
    """Whether a passwd or group line names ident (its third field)."""
    return any(len(fields) > 2 and fields[2] == str(ident) for fields in (line.split(":") for line in lines))


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError:
        return []


def users_texts(uid: int, gid: int, home: str, user: SandboxUser | None = None) -> tuple[str, str]:
    """(passwd, group): the host's, plus USER_NAME for uid and gid when the host names neither;
    with a user, the host's with uid and gid named user.name."""
    passwd, group = _lines(PASSWD), _lines(GROUP)
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    if user is not None:
        return named_texts(passwd, group, uid, gid, user, shell)
    if not _named(passwd, uid):
        passwd.append(f"{USER_NAME}:x:{uid}:{gid}:guilds agent:{home}:{shell}")
    if not _named(group, gid):
        group.append(f"{USER_NAME}:x:{gid}:")
    return "\n".join(passwd) + "\n", "\n".join(group) + "\n"


def write_users(folder: Path, uid: int, gid: int, home: str,
                user: SandboxUser | None = None) -> tuple[str, str]:
    """The two files written under folder (readable by all, as the host's are); their paths."""
    passwd, group = users_texts(uid, gid, home, user)
    return write_readable(folder, "passwd", passwd), write_readable(folder, "group", group)
