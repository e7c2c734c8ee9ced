"""A template build's request (E2B's ``TemplateBuildStartV2``), read into a ``Plan``.

    plan = plan_of(body)     # invalid_argument (400) for a body that is no build; past the bounds too

The E2B SDKs' ``Template`` sends its base (``fromImage``, or ``fromTemplate``), its steps
and its start and ready commands. A step is one of E2B's instructions: ``RUN [command,
user?]``, ``COPY [source, destination, user, mode]`` (its files uploaded before, named by
``filesHash``), ``ENV [name, value, ...]``, ``WORKDIR [path]``, ``USER [name]``. E2B names a
build's steps for its errors as this module does: ``base`` (the FROM), ``1``, ``2``... (each
step, in order), ``finalize`` (the start and ready commands).

``COPY_SCRIPT`` is the copy of one uploaded archive into place, run inside the build's
sandbox (its python3, as the step's user): Docker's ``COPY`` rules, as E2B's build takes
them (a folder's contents go into the destination; a file goes to the destination, or into
it when it ends with ``/``, is a folder, or several sources match).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...limits import E2B_TEMPLATE_MAX_STEPS
from .connect import ConnectError

BASE_STEP, FINALIZE_STEP = "base", "finalize"
KINDS = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
BASE_IMAGES = ("e2bdev/base", "e2bdev/base:latest")
"""E2B's base image (``Template().from_base_image()``): here, the default template's sandbox."""
E2B_USER = "user"
"""E2B's user, whom the steps run as unless they name another."""
FILES_HASH = re.compile(r"[0-9a-f]{64}")
MAX_ARG_CHARS = 64 * 1024
"""The longest argument of a step (a command), in characters."""


@dataclass(frozen=True)
class Step:
    index: int
    """1 for the first step: its name in E2B's errors is ``str(index)``."""
    kind: str
    args: tuple[str, ...]
    files_hash: str | None = None

    @property
    def name(self) -> str:
        return str(self.index)

    def line(self) -> str:
        """The step as a Dockerfile line, for the logs (cut at 200 characters)."""
        text = f"{self.kind} {' '.join(a for a in self.args if a)}"
        return text if len(text) <= 200 else text[:197] + "..."

    @property
    def user(self) -> str | None:
        """The user a RUN or COPY names (None: the build's current user)."""
        at = {"RUN": 1, "COPY": 2}.get(self.kind)
        return self.args[at] or None if at is not None and len(self.args) > at else None


@dataclass(frozen=True)
class Plan:
    from_image: str | None
    from_template: str | None
    steps: tuple[Step, ...]
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False
    """Every step run again, none taken from a cache (``skip_cache``)."""

    @property
    def base_line(self) -> str:
        return f"FROM {self.from_template or self.from_image or BASE_IMAGES[0]}"


def bad(message: str) -> ConnectError:
    return ConnectError("invalid_argument", message)


def _text(value: Any, name: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > MAX_ARG_CHARS or (not empty and not value):
        raise bad(f"{name}: a string of at most {MAX_ARG_CHARS} characters" + ("" if empty else ", not empty"))
    return value


def _optional(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return None if value is None else _text(value, name)


def plan_of(body: dict[str, Any]) -> Plan:
    """The build a ``TemplateBuildStartV2`` body asks for; ``invalid_argument`` naming what is
    wrong, ``unimplemented`` for a private registry's credentials."""
    if body.get("fromImageRegistry") is not None:
        raise ConnectError("unimplemented", "fromImageRegistry: images of private registries are not served by "
                                            "this server (guilds serve --e2b), which pulls from no registry")
    steps = body.get("steps") or []
    if not isinstance(steps, list):
        raise bad("steps: a list of steps")
    if len(steps) > E2B_TEMPLATE_MAX_STEPS:
        raise bad(f"steps: at most {E2B_TEMPLATE_MAX_STEPS} steps in one build (E2B_TEMPLATE_MAX_STEPS), "
                  f"got {len(steps)}")
    from_image, from_template = _optional(body, "fromImage"), _optional(body, "fromTemplate")
    if from_image and from_template:
        raise bad("fromImage and fromTemplate: a build has one base")
    force = body.get("force") is True or any(isinstance(s, dict) and s.get("force") is True for s in steps)
    return Plan(from_image, from_template, tuple(_step(i, s) for i, s in enumerate(steps, 1)),
                _optional(body, "startCmd"), _optional(body, "readyCmd"), force)


_ARITY = {"RUN": (1, 2), "COPY": (2, 4), "WORKDIR": (1, 1), "USER": (1, 1), "ENV": (2, MAX_ARG_CHARS)}


def _step(index: int, found: Any) -> Step:
    where = f"steps[{index - 1}]"
    if not isinstance(found, dict):
        raise bad(f"{where}: an object with type and args")
    kind = found.get("type")
    if kind not in KINDS:
        raise bad(f"{where}.type: one of {', '.join(KINDS)}, got {str(kind)[:40]!r}")
    args = found.get("args") or []
    if not isinstance(args, list):
        raise bad(f"{where}.args: a list of strings")
    args = [_text(a, f"{where}.args") for a in args]
    least, most = _ARITY[kind]
    if not least <= len(args) <= most or (kind == "ENV" and len(args) % 2):
        raise bad(f"{where}: {kind} takes " + ("names and values in pairs" if kind == "ENV"
                                               else f"{least} to {most} arguments") + f", got {len(args)}")
    if kind != "ENV" and not args[0]:
        raise bad(f"{where}: {kind} with an empty {'command' if kind == 'RUN' else 'argument'}")
    files_hash = found.get("filesHash")
    if kind == "COPY" and (not isinstance(files_hash, str) or not FILES_HASH.fullmatch(files_hash)):
        raise bad(f"{where}.filesHash: the SHA-256 of the step's files, 64 hex digits")
    if kind == "COPY" and len(args) > 3 and args[3] and not re.fullmatch(r"0?[0-7]{3,4}", args[3]):
        raise bad(f"{where}: COPY's mode is an octal number (0755), got {args[3][:20]!r}")
    return Step(index, kind, tuple(args), files_hash if kind == "COPY" else None)


COPY_SCRIPT = r'''
import fnmatch, grp, os, pwd, sys, tarfile
archive, src, dest, mode, owner = sys.argv[1:6]
src = os.path.normpath(src)
def matches(name):
    a, b = name.rstrip("/").split("/"), src.split("/")
    return len(a) == len(b) and all(fnmatch.fnmatchcase(x, y) for x, y in zip(a, b))
ids = None
if owner and os.geteuid() == 0:
    user, _, group = owner.partition(":")
    try:
        uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid if group else pwd.getpwuid(uid).pw_gid
    except KeyError:
        sys.exit(f"COPY: no user or group {owner!r} in the image")
    ids = (uid, gid)
def place(member, target, tar):
    parent = os.path.dirname(target)
    if parent:
        os.makedirs(parent, exist_ok=True)
    if member.isdir():
        os.makedirs(target, exist_ok=True)
    else:
        if os.path.islink(target) or (os.path.exists(target) and not os.path.isdir(target)):
            os.unlink(target)
        if member.issym():
            os.symlink(member.linkname, target)
        elif member.isfile():
            with tar.extractfile(member) as data, open(target, "wb") as out:
                while True:
                    chunk = data.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
        else:
            return
    if not member.issym():
        os.chmod(target, int(mode, 8) if mode else member.mode & 0o7777)
    if ids:
        os.lchown(target, *ids)
with tarfile.open(archive, "r:*") as tar:
    members = tar.getmembers()
    roots = [m for m in members if matches(m.name)]
    if not roots:
        sys.exit(f"COPY: no file of the upload matches {src!r}")
    into = dest.endswith("/") or len(roots) > 1 or os.path.isdir(dest)
    for root in roots:
        if root.isdir():
            place(root, dest, tar)
            for m in members:
                if m.name.startswith(root.name.rstrip("/") + "/"):
                    place(m, os.path.join(dest, m.name[len(root.name.rstrip("/")) + 1:]), tar)
        else:
            place(root, os.path.join(dest, os.path.basename(root.name)) if into else dest, tar)
'''
"""argv: the archive, the source (its glob), the destination (relative: from the working
folder), the mode (octal, or empty) and the owner (``user[:group]``, taken only as root)."""
