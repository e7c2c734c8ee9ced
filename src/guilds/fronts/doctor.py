"""`guilds doctor`: what works on this machine and what does not, one line each with the fix.

    ok   bubblewrap: works
    no   docker: no engine answers at unix:///var/run/docker.sock (...) -> start the Docker engine, or set DOCKER_HOST

Checked: bubblewrap (and why not), rg and its version, the sandbox's python,
a Docker engine and the sandbox image, a kubeconfig and the rights in
``kubernetes.namespace``, the network as the commands get it (``true`` said plainly
to be unfiltered), the data folder, each settings file the data folder knows (one holding
secrets its group or others may read is named, with ``chmod 600``; every
front refuses to load it), the run record (SQLite or PostgreSQL, reached),
the harness CLIs (``claude``, ``codex``), and in the
bwrap sandbox whether the agent's uid can reach its home and repositories
(a folder on the way it cannot pass: ``guilds.sandbox.bwrap_reach``). A line
marked ``--`` is not needed by the configured agent. Exit status 1 when the
configured sandbox cannot run, the agent cannot reach its home or a repository,
or the record cannot be reached, else 0.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from guilds_harness import harnesses
from guilds_harness.harnesses import HARNESSES

from ..limits import DOCTOR_PROBE_SECONDS
from .wiring import Wired

KUBE_VERBS = (("create", "pods", ""), ("get", "pods", ""), ("delete", "pods", ""), ("create", "pods", "exec"),
              ("create", "persistentvolumeclaims", ""))
"""What the kubernetes backend does in its namespace."""
MIN_PYTHON = (3, 9)
BWRAP_FIXES = {
    "root": "run guilds as root (it enters the sandbox with nsenter)",
    "not found": "install bubblewrap and util-linux (Debian: apt-get install bubblewrap util-linux)",
    "namespaces": "allow user namespaces (kernel.unprivileged_userns_clone, "
                  "kernel.apparmor_restrict_unprivileged_userns) or run outside a container that forbids them",
}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed: bool = True

    def line(self) -> str:
        mark = "ok" if self.ok else ("no" if self.needed else "--")
        fix = f" -> {self.fix}" if self.fix and not self.ok else ""
        return f"{mark:4} {self.name}: {self.detail}{fix}"


def _run(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=DOCTOR_PROBE_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout or proc.stderr).strip() if proc.returncode == 0 else None


def check_bwrap(needed: bool) -> Check:
    from ..sandbox.bwrap_argv import unavailable

    reason = unavailable()
    if reason is None:
        version = _run(["bwrap", "--version"]) or "bwrap"
        return Check("bubblewrap", True, f"works ({version})", needed=needed)
    fix = next((text for key, text in BWRAP_FIXES.items() if key in reason), "")
    return Check("bubblewrap", False, reason, fix, needed)


def check_rg() -> Check:
    found = shutil.which("rg")
    version = _run([found, "--version"]) if found else None
    if not version:
        return Check("rg", False, "not found on PATH (code_search needs it)",
                     "install ripgrep (Debian: apt-get install ripgrep)")
    return Check("rg", True, version.splitlines()[0])


def check_python() -> Check:
    from ..sandbox._host_folder import real_python

    python = real_python()
    version = sys.version_info[:3] if python == os.path.realpath(sys.executable) else None
    text = ".".join(map(str, version)) if version else "?"
    ok = version is not None and version[:2] >= MIN_PYTHON
    return Check("sandbox python", ok, f"{python} ({text}; the helpers need {'.'.join(map(str, MIN_PYTHON))}+)",
                 "run guilds with a Python of 3.9 or later")


def check_docker(wired: Wired, needed: bool) -> Check:
    from ..sandbox import docker_engine

    image = wired.settings.docker.image
    reason = docker_engine.unavailable(image)
    if reason is None:
        return Check("docker", True, f"engine at {docker_engine.where(None)}, image {image}", needed=needed)
    fix = ("build it: guilds sandbox image" if "missing" in reason
           else "start the Docker engine, or set DOCKER_HOST to one")
    return Check("docker", False, reason, fix, needed)


def _kubeconfig() -> Path | None:
    path = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    return path if path.is_file() else None


def _kube_rights(namespace: str) -> list[str]:
    """The verbs the backend needs that the kubeconfig's user lacks in namespace."""
    from kubernetes import client, config

    api = client.AuthorizationV1Api(config.new_client_from_config())
    missing = []
    for verb, resource, sub in KUBE_VERBS:
        attrs = client.V1ResourceAttributes(namespace=namespace, verb=verb, resource=resource,
                                            subresource=sub or None)
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        answer = api.create_self_subject_access_review(review, _request_timeout=DOCTOR_PROBE_SECONDS)
        if not answer.status.allowed:
            missing.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    return missing


def check_kubernetes(wired: Wired, needed: bool) -> Check:
    namespace = wired.settings.kubernetes.namespace
    path = _kubeconfig()
    if path is None:
        return Check("kubernetes", False, "no kubeconfig (KUBECONFIG, ~/.kube/config)",
                     "point KUBECONFIG at the cluster's config", needed)
    try:
        missing = _kube_rights(namespace)
    except Exception as exc:  # the client's errors and the connection's alike: say which
        return Check("kubernetes", False, f"{path}: cannot ask the cluster ({type(exc).__name__}: {exc})"[:300],
                     "check the kubeconfig's server and credentials", needed)
    if missing:
        return Check("kubernetes", False, f"{path}: in namespace {namespace} the user may not "
                     f"{', '.join(missing)}", f"grant them in {namespace} (a Role and RoleBinding)", needed)
    return Check("kubernetes", True, f"{path}: every right the backend needs in namespace {namespace}", needed=needed)


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


def check_reach(wired: Wired) -> list[Check]:
    """In the bwrap sandbox: can the agent's uid reach its home and each repository?"""
    from ..sandbox.bubblewrap import sandbox_owner
    from ..sandbox.bwrap_reach import out_of_reach

    settings = wired.settings
    problems = out_of_reach(settings, wired.data_dir)
    if not problems:
        uid = sandbox_owner(settings)[0]
        count = len(settings.repos)
        repos = f" and its {count} repositor{'y' if count == 1 else 'ies'}" if count else ""
        return [Check("agent's reach", True, f"uid {uid} reaches the home {settings.home}{repos}")]
    return [Check("agent's reach", False, f"{what}: {problem}", fix) for what, problem, fix in problems]


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
        return Check("network", True, f"a list of {count} entr{'y' if count == 1 else 'ies'}: commands reach "
                     "only those, through the egress proxy (docs/network.md)")
    if settings.network:
        loopback = " and, on bwrap, the host's loopback services" if settings.sandbox in ("bwrap", "auto") else ""
        return Check("network", True, f"true: unfiltered, commands reach every host{loopback}; a list of "
                     "hosts filters it (docs/network.md)")
    return Check("network", True, "false: commands have no network")


def check_harnesses(wired: Wired) -> list[Check]:
    checks = []
    for harness in HARNESSES:
        cli = harnesses.get(harness).executable
        found = shutil.which(cli)
        needed = harness == wired.settings.harness
        detail = f"{cli} at {found}" if found else f"{cli} not found on PATH (code_task with harness {harness})"
        checks.append(Check(f"harness {harness}", bool(found), detail, f"install the {cli} CLI", needed))
    return checks


def checks(wired: Wired) -> list[Check]:
    sandbox = wired.settings.sandbox
    found: list[Check] = [check_bwrap(sandbox == "bwrap"), check_rg(), check_python()]
    found.append(check_docker(wired, sandbox == "docker"))
    found.append(check_kubernetes(wired, sandbox == "kubernetes"))
    if sandbox == "bwrap" or (sandbox == "auto" and found[0].ok):
        found += check_reach(wired)
    found += [check_network(wired), check_data(wired), *check_settings_files(wired), check_record(wired),
              *check_harnesses(wired)]
    return found


def verdict(wired: Wired, found: list[Check]) -> tuple[bool, str]:
    """(the configured sandbox can run and the record is reached, the closing line)."""
    by_name = {c.name: c for c in found}
    sandbox = wired.settings.sandbox
    needs: dict[str, Callable[[], bool]] = {
        "bwrap": lambda: by_name["bubblewrap"].ok, "docker": lambda: by_name["docker"].ok,
        "kubernetes": lambda: by_name["kubernetes"].ok, "local": lambda: True, "auto": lambda: True,
    }
    reached = all(c.ok for c in found if c.name == "agent's reach")
    runs = needs[sandbox]() and by_name["run record"].ok and reached
    effective = sandbox if sandbox != "auto" else ("bwrap" if by_name["bubblewrap"].ok else "local (no isolation)")
    if runs:
        return True, f"agent {wired.settings.id}: sandbox {effective} can run"
    return False, f"agent {wired.settings.id}: sandbox {sandbox} cannot run here (see the lines marked no)"


def main(wired: Wired) -> int:
    found = checks(wired)
    for check in found:
        print(check.line())
    ok, closing = verdict(wired, found)
    print(closing)
    return 0 if ok else 1
