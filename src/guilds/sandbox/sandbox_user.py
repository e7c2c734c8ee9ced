"""Who the agent is inside its sandbox when its settings name a user (``AgentSettings.user``).

    users_texts(base_passwd, base_group, uid, gid, user, shell) -> (passwd, group)
    sudo_file(folder) -> Path          the ``sudo`` script, written once

A template's user (E2B's ``user`` at /home/user) changes only names and paths: the home is
bound at ``user.home`` inside, the agent's uid and gid are named ``user.name`` in the
sandbox's /etc/passwd and /etc/group (every other line naming that uid, gid or name
dropped, so ``whoami`` and a file's owner answer the name), and ``/usr/local/bin/sudo``
is SUDO. The sandbox has no root to give: its processes run as the agent's uid with no
capabilities and no new privileges (``no_new_privs`` makes a setuid binary run as its
caller), so SUDO runs its command as that same uid, in the same environment.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from ..config.settings import SandboxUser

PASSWD, GROUP = "/etc/passwd", "/etc/group"
SUDO_NAME = "sudo"
SUDO = r'''#!/bin/sh
# sudo of a guilds sandbox: the sandbox has no root to give, so the command runs as
# this same user, in this same environment. Options taking a value (-u, -g, ...)
# are read; -u and -g must name this user (or root), another name is refused.
me=$(id -un 2>/dev/null || id -u)
shell_mode=
usage() { echo "usage: sudo [-u user] command [args...]" >&2; exit 1; }
as_me() {
  case "$1" in
    root|"#0"|"$me"|"#$(id -u)"|"#$(id -g)") ;;
    *) echo "sudo: this sandbox runs everything as $me: no user or group '$1'" >&2; exit 1 ;;
  esac
}
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -u|-g|--user|--group) [ $# -ge 2 ] || usage; as_me "$2"; shift 2 ;;
    --user=*|--group=*) as_me "${1#*=}"; shift ;;
    -u?*|-g?*) as_me "${1#-?}"; shift ;;
    -p|-C|-D|-h|-r|-t|-T|-U|--prompt|--close-from|--chdir|--host|--role|--type|--command-timeout|--other-user)
      [ $# -ge 2 ] || usage; shift 2 ;;
    -i|-s|--login|--shell) shell_mode=1; shift ;;
    -V|--version) echo "sudo of a guilds sandbox: runs the command as $me"; exit 0 ;;
    -l|--list) echo "User $me may run the following commands: (ALL) NOPASSWD: ALL, as $me"; exit 0 ;;
    -v|-k|-K|--validate|--reset-timestamp|--remove-timestamp) [ $# -eq 1 ] && exit 0; shift ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ -n "$shell_mode" ]; then
  [ $# -eq 0 ] && exec "${SHELL:-/bin/sh}"
  exec "${SHELL:-/bin/sh}" -c "$*"
fi
[ $# -gt 0 ] || usage
exec "$@"
'''
"""The sandbox's ``sudo``: a POSIX sh script (what -i and -s mean: the command run by
``$SHELL -c``; with no command, ``$SHELL``). ``id -un`` names the user it runs as."""


def _ident(line: str, field: int) -> str:
    parts = line.split(":")
    return parts[field] if len(parts) > field else ""


def _kept(lines: list[str], name: str, ident: int) -> list[str]:
    """lines without those naming name, or ident (third field), but root's."""
    return [line for line in lines if _ident(line, 0) != name
            and (_ident(line, 2) != str(ident) or _ident(line, 0) == "root")]


def users_texts(base_passwd: list[str], base_group: list[str], uid: int, gid: int,
                user: SandboxUser, shell: str) -> tuple[str, str]:
    """(passwd, group): the base lines, with uid and gid named user.name (home user.home)."""
    passwd = [*_kept(base_passwd, user.name, uid), f"{user.name}:x:{uid}:{gid}::{user.home}:{shell}"]
    group = [*_kept(base_group, user.name, gid), f"{user.name}:x:{gid}:"]
    return "\n".join(passwd) + "\n", "\n".join(group) + "\n"


def write_readable(folder: Path, name: str, text: str, mode: int = 0o644) -> str:
    """text written as folder/name at once (two starts may write at once); its path."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
    tmp.chmod(mode)
    path = folder / name
    tmp.replace(path)
    return str(path)


def sudo_file(folder: Path) -> Path:
    """SUDO written once under folder (named by its digest, readable and runnable by all)."""
    path = folder / f"{SUDO_NAME}-{hashlib.sha256(SUDO.encode()).hexdigest()[:12]}"
    if not path.exists():
        write_readable(folder, path.name, SUDO, 0o755)
    return path


def container_files(passwd: str, group: str, uid: int, gid: int, user: SandboxUser) -> list[tuple[str, bytes, int]]:
    """What a container made for the user gets before it starts, as ``tar_bytes`` takes them
    (root's): its image's /etc/passwd and /etc/group with uid and gid named, and SUDO."""
    named = users_texts(passwd.splitlines(), group.splitlines(), uid, gid, user, "/bin/sh")
    return [("/etc/passwd", named[0].encode(), 0o644), ("/etc/group", named[1].encode(), 0o644),
            (f"/usr/local/bin/{SUDO_NAME}", SUDO.encode(), 0o755)]
