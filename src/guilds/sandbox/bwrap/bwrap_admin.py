"""What the bwrap backend answers without a sandbox, and where it keeps its host files.

- ``check(needed)``: doctor's line: bubblewrap works here (``bwrap_argv.unavailable``),
  with its version, or why not and the fix;
- ``check_agent(settings, data_dir)``: whether the agent's uid reaches its home and
  each repository inside (``bwrap_reach``), a line each;
- ``boxes(data_dir)``: the data folder's records, running or stopped;
- ``host_files(data_dir, agent_id)``: the records' folder entry and its files
  (RECORDS/<agent id>.json, .lock, .log, .clock).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ...config.settings import AgentSettings
from ...limits import DOCTOR_PROBE_SECONDS
from .._spawn import output_of, start_time
from ..base import Box, Check
from .bwrap_argv import sandbox_owner, unavailable
from .bwrap_reach import out_of_reach

NAME = "bwrap"
RECORDS = "sandboxes"
"""The folder of the data folder holding each agent's records."""
RECORD_KINDS = ("json", "lock", "log", "clock")
FIXES = {
    "root": "run guilds as root (it enters the sandbox with nsenter)",
    "not found": "install bubblewrap and util-linux (Debian: apt-get install bubblewrap util-linux)",
    "namespaces": "allow user namespaces (kernel.unprivileged_userns_clone, "
                  "kernel.apparmor_restrict_unprivileged_userns) or run outside a container that forbids them",
}
"""The fix doctor names for a reason bubblewrap does not work, by a word of the reason."""


def host_files(data_dir: str | os.PathLike, agent_id: str) -> tuple[Path, list[Path]]:
    """(the records' base path, each record file) of the agent under data_dir."""
    base = Path(data_dir) / RECORDS / agent_id
    return base, [base.with_name(f"{agent_id}.{ext}") for ext in RECORD_KINDS]


def check(*, needed: bool) -> list[Check]:
    reason = unavailable()
    if reason is None:
        version = output_of(["bwrap", "--version"], timeout=DOCTOR_PROBE_SECONDS) or "bwrap"
        return [Check("bubblewrap", True, f"works ({version})", needed=needed)]
    fix = next((text for key, text in FIXES.items() if key in reason), "")
    return [Check("bubblewrap", False, reason, fix, needed)]


def check_agent(settings: AgentSettings, data_dir: str | os.PathLike) -> list[Check]:
    """Can the agent's uid reach its home and each repository inside?"""
    problems = out_of_reach(settings, data_dir)
    if not problems:
        uid = sandbox_owner(settings)[0]
        count = len(settings.repos)
        repos = f" and its {count} repositor{'y' if count == 1 else 'ies'}" if count else ""
        return [Check("agent's reach", True, f"uid {uid} reaches the home {settings.home}{repos}")]
    return [Check("agent's reach", False, f"{what}: {problem}", fix) for what, problem, fix in problems]


def boxes(data_dir: str | os.PathLike) -> list[Box]:
    found = []
    folder = Path(data_dir) / RECORDS
    for record_file in sorted(folder.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(record_file.read_text())
            alive = start_time(int(record["pid"])) == record.get("start")
            found.append(Box(NAME, record_file.stem, f"pid {record['pid']}", "running" if alive else "stopped"))
    listed = {box.agent for box in found}
    found.extend(Box(NAME, clock.stem, "no process", "stopped")
                 for clock in sorted(folder.glob("*.clock")) if clock.stem not in listed)
    return found
