"""A pod's user when the agent's settings name one (``AgentSettings.user``: E2B's ``user``
at /home/user), as docker's container gets it (``guilds.sandbox.sandbox_user``).

The pod runs as CONTAINER_UID and cannot write its image's /etc, and neither can the
orchestrator (no root in the pod, no object of the API needed: claim mode's role has
none). So the pod gets an init container of the same image, uid and limits that writes,
into an ``emptyDir`` of its own:

- ``passwd`` and ``group``: the image's own, without the lines naming the user's name or
  its uid or gid (root's kept), and the user's line (``name:x:uid:gid::home:/bin/sh``);
- ``sudo``: ``sandbox_user.SUDO``, 0755.

The sandbox's container mounts the three read-only over ``/etc/passwd``, ``/etc/group``
and ``/usr/local/bin/sudo`` (``subPath``), so ``whoami``, ``~`` and a file's owner say the
user's name, and the agent can change none of them. The home is mounted at the user's
home (``KubePodSandbox.home``). Nothing gives the pod a privilege it lacked.
"""

from __future__ import annotations

import copy
from typing import Any

from ...config.settings import SandboxUser
from .._container import CONTAINER_UID
from ..sandbox_user import GROUP, PASSWD, SUDO, SUDO_NAME

USER_VOLUME = "guilds-user"
INIT_CONTAINER = "user"
_SIZE = "1Mi"
_OUT = "/guilds-user"
_SUDO_ENV = "GUILDS_SUDO"
_WRITE = """
import os, sys
out, name, home, uid, gid = sys.argv[1:]
def named(path, ident, line):
    kept = [old for old in open(path).read().splitlines() if old.split(":")[0] != name
            and (old.split(":")[2:3] != [ident] or old.split(":")[0] == "root")]
    return "\\n".join([*kept, line]) + "\\n"
def write(file, text, mode):
    with open(os.path.join(out, file), "w") as f:
        f.write(text)
    os.chmod(os.path.join(out, file), mode)
write("passwd", named("/etc/passwd", uid, f"{name}:x:{uid}:{gid}::{home}:/bin/sh"), 0o644)
write("group", named("/etc/group", gid, f"{name}:x:{gid}:"), 0o644)
write("sudo", os.environ["GUILDS_SUDO"], 0o755)
"""
"""The init container's script (python3 -I, which the image has for the helpers): argv
the folder, the name, the home, uid, gid; what ``sandbox_user.users_texts`` makes of the
image's own files, and SUDO from the environment."""


def with_user(pod_spec: dict[str, Any], user: SandboxUser | None, uid: int = CONTAINER_UID) -> dict[str, Any]:
    """pod_spec (a pod's ``spec``, its first container the sandbox's) with the user's
    files, when there is a user; pod_spec itself otherwise (pure: a changed copy)."""
    if user is None:
        return pod_spec
    out = copy.deepcopy(pod_spec)
    sandbox = out["containers"][0]
    out.setdefault("volumes", []).append({"name": USER_VOLUME, "emptyDir": {"sizeLimit": _SIZE}})
    out["initContainers"] = [{
        "name": INIT_CONTAINER,
        "image": sandbox["image"],
        "command": ["python3", "-I", "-c", _WRITE, _OUT, user.name, user.home, str(uid), str(uid)],
        "env": [{"name": _SUDO_ENV, "value": SUDO}],
        "resources": copy.deepcopy(sandbox.get("resources", {})),
        "securityContext": copy.deepcopy(sandbox.get("securityContext", {})),
        "volumeMounts": [{"name": USER_VOLUME, "mountPath": _OUT}],
    }]
    sandbox["volumeMounts"] = [
        *sandbox.get("volumeMounts", []),
        {"name": USER_VOLUME, "mountPath": PASSWD, "subPath": "passwd", "readOnly": True},
        {"name": USER_VOLUME, "mountPath": GROUP, "subPath": "group", "readOnly": True},
        {"name": USER_VOLUME, "mountPath": f"/usr/local/bin/{SUDO_NAME}", "subPath": "sudo", "readOnly": True},
    ]
    return out
