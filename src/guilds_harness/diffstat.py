"""What the harness changed: two snapshots of the repository and a diffstat.

``snapshot(repo, env)`` records the work tree as a git tree object without
touching the user's index, work tree, HEAD or refs: it copies the index to a
temporary file, points ``GIT_INDEX_FILE`` at it, runs ``git add -A`` (so
untracked files count, ignored ones do not) and ``git write-tree``. The only
trace is unreferenced objects in the object store, which ``git gc`` prunes.

``diffstat(before, after, env)`` is ``git diff --stat`` between two such
trees: what the harness changed against the state when the task began, also
when it committed, staged, or left files untracked. When the repository folder
is inside a larger work tree (a home that is itself a git repository), only
the folder is snapshotted and diffed, its paths shown relative to it.

Errors are values: a folder that is not a git work tree, a git that fails or
takes longer than limits.SNAPSHOT_TIMEOUT_SECONDS gives ``Unavailable(reason)``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

from . import limits

_GIT_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_NAMESPACE")
_GIT_SAFE = ["-c", "core.fsmonitor=false", "-c", "core.quotepath=on", "-c", "color.ui=never"]
_SUMMARY_RE = re.compile(
    r"(\d+) files? changed(?:, (\d+) insertions?\(\+\))?(?:, (\d+) deletions?\(-\))?"
)


@dataclass
class Unavailable:
    reason: str


@dataclass
class Snapshot:
    top: str
    tree: str
    scope: str = "."
    """The repository folder relative to the work tree's top: only it counts."""


@dataclass
class Stat:
    text: str
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0


class _GitFailed(Exception):
    pass


def _git(args: List[str], cwd: str, env: Dict[str, str], timeout: float) -> str:
    try:
        proc = subprocess.run(
            ["git", *_GIT_SAFE, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=max(timeout, 0.1), check=False,
        )
    except subprocess.TimeoutExpired:
        raise _GitFailed(f"git {args[0]} took longer than {limits.SNAPSHOT_TIMEOUT_SECONDS}s") from None
    except OSError as exc:
        raise _GitFailed(f"cannot run git: {exc.strerror}") from None
    if proc.returncode != 0:
        last = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise _GitFailed(f"git {args[0]} failed: {last[0]}".strip())
    return proc.stdout.decode("utf-8", "surrogateescape")


def git_env(env: Dict[str, str]) -> Dict[str, str]:
    """env without the variables that would point git elsewhere; no prompts."""
    out = {k: v for k, v in env.items() if k not in _GIT_VARS}
    out.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
    return out


def snapshot(repo: str, env: Dict[str, str]) -> Union[Snapshot, Unavailable]:
    """The work tree of repo as a tree id (see the module docstring)."""
    genv = git_env(env)
    budget = _Budget(limits.SNAPSHOT_TIMEOUT_SECONDS)
    tmp = tempfile.mkdtemp(prefix="guilds-harness-")
    try:
        top = _git(["rev-parse", "--show-toplevel"], repo, genv, budget.left()).strip()
        scope = os.path.relpath(os.path.realpath(repo), os.path.realpath(top))
        index = _git(["rev-parse", "--git-path", "index"], top, genv, budget.left()).strip()
        temp_index = os.path.join(tmp, "index")
        _copy_index(os.path.join(top, index), temp_index)
        genv["GIT_INDEX_FILE"] = temp_index
        _git(["add", "-A", "--", scope], top, genv, budget.left())
        tree = _git(["write-tree"], top, genv, budget.left()).strip()
        return Snapshot(top=top, tree=tree, scope=scope)
    except _GitFailed as exc:
        return Unavailable(str(exc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy_index(src: str, dest: str) -> None:
    """Start from the real index (its stat cache makes add fast); empty if none."""
    try:
        shutil.copyfile(src, dest)
    except OSError:
        pass


def diffstat(before: Snapshot, after: Snapshot, env: Dict[str, str]) -> Union[Stat, Unavailable]:
    """git diff --stat between two snapshots of the same repository."""
    args = [
        "diff", "--no-ext-diff", "--no-textconv",
        f"--stat={limits.DIFFSTAT_WIDTH}", f"--stat-count={limits.DIFFSTAT_FILES_MAX}",
    ]
    if before.scope != ".":
        args.append(f"--relative={before.scope}")
    args += [before.tree, after.tree, "--"]
    try:
        text = _git(args, before.top, git_env(env), limits.SNAPSHOT_TIMEOUT_SECONDS)
    except _GitFailed as exc:
        return Unavailable(str(exc))
    return parse_stat(text.rstrip("\n"))


def parse_stat(text: str) -> Stat:
    """The counts of git diff --stat's summary line (0 when nothing changed)."""
    match = _SUMMARY_RE.search(text.splitlines()[-1] if text else "")
    if not match:
        return Stat(text=text)
    files, ins, dels = (int(g or 0) for g in match.groups())
    return Stat(text=text, files_changed=files, insertions=ins, deletions=dels)


class _Budget:
    def __init__(self, seconds: float):
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise _GitFailed(f"the snapshot took longer than {limits.SNAPSHOT_TIMEOUT_SECONDS}s")
        return left


def describe(result: Optional[Union[Stat, Unavailable]]) -> str:
    """The diffstat as the result shows it."""
    if isinstance(result, Stat):
        return result.text or "(no changes)"
    if isinstance(result, Unavailable):
        return f"(unavailable: {result.reason})"
    return "(unavailable)"
