"""`guilds doctor`: what works on this machine and what does not, one line each with the fix.

    ok   bubblewrap: works
    no   docker: no engine answers at unix:///var/run/docker.sock (...) -> start the Docker engine, or set DOCKER_HOST

Checked: each backend's own lines, in ``guilds.sandbox.BACKENDS``' order (its
``check()``: bubblewrap and why not; rg and its version, and the sandbox's python;
a Docker engine and the sandbox image; a kubeconfig and the rights in
``kubernetes.namespace``), then the agent's lines of the backend the settings pick
(its ``check_agent()``: in the bwrap sandbox, whether the agent's uid can reach its
home and repositories), the network as the commands get it (``true`` said plainly
to be unfiltered), the data folder, each settings file the data folder knows (one holding
secrets its group or others may read is named, with ``chmod 600``; every
front refuses to load it), the run record (SQLite or PostgreSQL, reached), and
what the agent's backend offers of checkpoints, rewind and fork (and whether new
homes are overlay layers here, or copies and why; on kubernetes, what the cluster
lacks for a VolumeSnapshot of the home, asked of it), and the harness CLIs
(``claude``, ``codex``). A line marked ``--`` is not needed by
the configured agent. Exit status 1 when the configured sandbox cannot run (its
backend's ``can_run()``), the agent's lines are not all ok, the record cannot
be reached, or ``agent.checkpoints`` is on where they are not served, else 0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from guilds_harness import harnesses
from guilds_harness.harnesses import HARNESSES

from ..limits import DOCTOR_PROBE_SECONDS
from ..sandbox import Check, backend, backends, candidates, get_sandbox, picked
from .wiring import Wired


@dataclass(frozen=True)
class Report:
    """Doctor's lines, whether the configured sandbox can run and the record is reached
    (the exit status), and the closing line."""

    found: list[Check]
    ok: bool
    closing: str


def check_data(wired: Wired) -> Check:
    data = Path(wired.data_dir)
    if data.exists() and not os.access(data, os.W_OK | os.X_OK):
        return Check("data folder", False, f"{data}: not writable", "make it writable, or set GUILDS_DATA")
    mode = oct(data.stat().st_mode & 0o777) if data.exists() else "made on first use"
    return Check("data folder", True, f"{data} ({mode})")


def check_record(wired: Wired) -> Check:
    from ..record.engine import database_url
    from ..record.store import Store

    url = database_url(Path(wired.data_dir), wired.env)
    shown = url.split("@")[-1] if "@" in url else url

    async def reach() -> None:
        async with Store(url):
            pass

    try:
        Path(wired.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        asyncio.run(asyncio.wait_for(reach(), DOCTOR_PROBE_SECONDS))
    except Exception as exc:  # the driver's errors, any of them: the record is out of reach
        return Check("run record", False, f"{shown}: {type(exc).__name__}: {exc}"[:300],
                     "start the database, or fix GUILDS_DATABASE_URL")
    return Check("run record", True, shown)


def check_settings_files(wired: Wired) -> list[Check]:
    """Each settings file the data folder knows (``guilds.config.agents``) and the configured
    one: refused when it holds secrets its group or others may read."""
    from ..config.agents import known
    from ..config.settings import exposed

    paths = [str(wired.settings_file)] if wired.settings_file is not None else []
    paths += [agent.settings for agent in known(Path(wired.data_dir)) if agent.settings]
    found = []
    for path in dict.fromkeys(paths):
        problem = exposed(Path(path))
        if problem is None:
            found.append(Check("settings file", True, f"{path}: secrets, if any, readable by its owner only"))
        else:
            found.append(Check("settings file", False, problem.split(": chmod")[0], f"chmod 600 {path}"))
    return found


def check_network(wired: Wired) -> Check:
    """agent.network as the commands get it: off, a list through the egress proxy, or
    true, which is said plainly to be unfiltered."""
    settings = wired.settings
    if settings.egress:
        count = len(settings.egress)
        held = "".join(f"; {kind.network_list_held}" for kind in candidates(settings.sandbox, settings)
                       if kind.network_list_held)
        return Check("network", True, f"a list of {count} entr{'y' if count == 1 else 'ies'}: commands reach "
                     f"only those, through the egress proxy{held} (docs/network.md)")
    if settings.network:
        loopback = "".join(f" and, on {kind.name}, {kind.network_true_reach}"
                           for kind in candidates(settings.sandbox, settings) if kind.network_true_reach)
        return Check("network", True, f"true: unfiltered, commands reach every host{loopback}; a list of "
                     "hosts filters it (docs/network.md)")
    return Check("network", True, "false: commands have no network")


def check_checkpoints(wired: Wired, sandbox: str) -> Check:
    """What the backend the agent runs on offers of checkpoints, rewind and fork, and how
    new homes (forks, templates) are made here: overlay layers or copies, and why."""
    from ..agents.homes import overlay_unavailable
    from ..config.settings import CHECKPOINT_SANDBOXES

    known = {name for name, _ in backends(wired.settings)}
    served = ", ".join(name for name in CHECKPOINT_SANDBOXES if name in known)
    why = backend(sandbox, wired.settings).checkpoints_refused(wired.settings)
    if why is not None:
        needed = wired.settings.checkpoints
        fix = f"turn agent.checkpoints off, or run the agent on {served}" if needed else ""
        return Check("checkpoints", False, f"not served on {sandbox} here: {why}; served on {served} "
                     "(docs/checkpoints.md)", fix, needed)
    taken = ("one before each shell and code_task call" if wired.settings.checkpoints
             else "none per call (agent.checkpoints is off)")
    why = overlay_unavailable(Path(wired.data_dir), get_sandbox(wired.settings, wired.data_dir).home_owner)
    homes = "overlay layers, copy-on-write" if why is None else f"copies ({why})"
    return Check("checkpoints", True, f"on {sandbox}: {taken}; named checkpoints, rewind and fork served; a "
                 f"checkpoint stores each changed file once; new homes of forks and templates are {homes} "
                 "(docs/checkpoints.md)")


def check_harnesses(wired: Wired) -> list[Check]:
    checks = []
    for harness in HARNESSES:
        cli = harnesses.get(harness).executable
        found = shutil.which(cli)
        needed = harness == wired.settings.harness
        detail = f"{cli} at {found}" if found else f"{cli} not found on PATH (code_task with harness {harness})"
        checks.append(Check(f"harness {harness}", bool(found), detail, f"install the {cli} CLI", needed))
    return checks


def examine(wired: Wired) -> Report:
    """Ask every backend for its lines, the backend the settings pick for the agent's,
    then check the rest."""
    settings, data, configured = wired.settings, wired.data_dir, wired.settings.sandbox
    by_backend = {name: kind.check(settings, data, needed=name == configured) for name, kind in backends(settings)}
    kind = picked(configured, lambda name: backend(name, settings).can_run(by_backend[name]), settings)
    agent = kind.check_agent(settings, data)
    found = [*(c for lines in by_backend.values() for c in lines), *agent, check_network(wired), check_data(wired),
             *check_settings_files(wired)]
    record = check_record(wired)  # after the data folder's line: it makes the folder
    kept = check_checkpoints(wired, kind.name)
    found += [record, kept, *check_harnesses(wired)]
    if kind.can_run(by_backend[kind.name]) and all(c.ok for c in agent) and record.ok and (kept.ok or not kept.needed):
        effective = configured if kind.name == configured else kind.name + ("" if kind.isolates else " (no isolation)")
        return Report(found, True, f"agent {settings.id}: sandbox {effective} can run")
    return Report(found, False, f"agent {settings.id}: sandbox {configured} cannot run here (see the lines marked no)")


def main(wired: Wired) -> int:
    report = examine(wired)
    for check in report.found:
        print(check.line())
    print(report.closing)
    return 0 if report.ok else 1
