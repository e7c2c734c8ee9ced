"""Why a process could not start (EAGAIN): the sandbox's process limit, named.

The limits a fork meets inside a sandbox: RLIMIT_NPROC (processes of the uid;
bwrap sets it to ``bwrap.pids_limit``) and a pids cgroup's ``pids.max``
(docker's ``pids_limit``, bwrap's cgroup, the pod's), the nearest one set on
the way up from this process's cgroup, as far as the sandbox shows the tree.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

_CGROUP_ROOT = "/sys/fs/cgroup"


def why_not_started(exc: OSError) -> str:
    """Why a process could not start: the limit (``reason``) for EAGAIN, else exc's words."""
    return reason() if exc.errno == errno.EAGAIN else (exc.strerror or str(exc))


def reason() -> str:
    """The one-line reason a fork failed with EAGAIN, naming the limits set."""
    named = [limit for limit in (_nproc(), _pids_max()) if limit]
    what = f" ({', '.join(named)})" if named else ""
    return (f"the sandbox's process limit{what} is reached: stop background commands "
            "(shell_status stop) or wait for some to end")


def _nproc() -> Optional[str]:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else f"RLIMIT_NPROC {soft}"


def _pids_max() -> Optional[str]:
    for start in _pids_folders():
        folder = start
        while folder.startswith(_CGROUP_ROOT):
            value = _read(os.path.join(folder, "pids.max"))
            if value and value.isdigit():
                return f"pids.max {value}"
            folder = os.path.dirname(folder)
    return None


def _pids_folders() -> List[str]:
    """This process's pids cgroup folders: the v1 pids hierarchy's, then the v2 one's."""
    found: List[str] = []
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "pids" in parts[1].split(","):
            found.insert(0, os.path.normpath(f"{_CGROUP_ROOT}/pids/{parts[2]}"))
        elif len(parts) == 3 and parts[:2] == ["0", ""]:
            found.append(os.path.normpath(f"{_CGROUP_ROOT}/{parts[2]}"))
    return found


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(4096).strip()
    except OSError:
        return None
