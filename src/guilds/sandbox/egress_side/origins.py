"""Where a repository token goes by default: its repository's ``origin`` host, read from
the repository's ``.git/config`` on the host the first time it is seen with its home made,
and pinned in ORIGINS_NAME from then on (the agent can rewrite .git/config). An agent
made on demand has its sandbox's object before its home: nothing is pinned until the
home exists. A fork's child keeps its source's pins (``inherit_origins``)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
from pathlib import Path

from ...config.settings import AgentSettings, Repo
from ...egress.policy import address_of, normalize_host
from .files import ORIGINS_NAME, EgressFiles, write_private

GITHUB, GITHUB_API = "github.com", "api.github.com"
_REMOTE_HOST = re.compile(r"^(?:[a-z+]+://)?(?:[^@/]+@)?(\[[^\]]+\]|[^:/]+)")


def origin_host(repo_folder: str) -> str | None:
    """The host name of the repository's ``origin`` remote (its .git/config, read as the
    host sees it: a regular file only, never waited on), or None when there is no such
    repository, remote, or host name (an address or a pattern is none)."""
    try:
        fd = os.open(os.path.join(repo_folder, ".git", "config"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        text = fh.read(65536).decode(errors="replace")
    section, url = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == '[remote "origin"]' and line.replace(" ", "").startswith("url="):
            url = line.split("=", 1)[1].strip()
    found = _REMOTE_HOST.match(url or "")
    host = normalize_host(found.group(1)) if found else None
    return host if host is not None and address_of(host) is None else None


def pinned_origins(files: EgressFiles, settings: AgentSettings, home: str) -> dict[str, str | None]:
    """Each repository's origin host (without ``token_hosts``), read from its .git/config
    the first time its name and path are seen and kept in ORIGINS_NAME from then on: the
    agent can rewrite .git/config, so what it writes there later never moves a token.
    While the home does not exist (an agent whose home is still to be made) nothing is
    read or kept: each such repository has no origin yet."""
    if not os.path.isdir(home):
        return {repo.name: None for repo in settings.repos if repo.token and repo.token_hosts is None}
    path = files.path(ORIGINS_NAME)
    with open(files.path(ORIGINS_NAME + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            kept = {}
        kept = kept if isinstance(kept, dict) else {}
        out, changed = {}, False
        for repo in (r for r in settings.repos if r.token and r.token_hosts is None):
            entry = kept.get(repo.name)
            if not isinstance(entry, dict) or entry.get("path") != repo.path:
                entry = kept[repo.name] = {"path": repo.path, "origin": origin_host(os.path.join(home, repo.path))}
                changed = True
            out[repo.name] = entry["origin"] if isinstance(entry.get("origin"), str) else None
        if changed:
            write_private(path, json.dumps(kept))
    return out


def inherit_origins(source: EgressFiles, child: EgressFiles) -> None:
    """A fork's child keeps its source's pinned origins (when the source has any): its home
    starts as the source's, whose .git/config the source's agent may have rewritten since
    they were pinned. Call it before the child's sandbox starts."""
    try:
        kept = Path(source.path(ORIGINS_NAME)).read_bytes()
    except FileNotFoundError:
        return
    write_private(child.path(ORIGINS_NAME), kept)


def repo_hosts(repo: Repo, origin: str | None) -> tuple[tuple[str, ...], str | None]:
    """(the hosts the token is for, the GitHub host gh must be told of or None).

    token_hosts when given, else the origin remote's host (``pinned_origins``) and its
    API host (github.com -> api.github.com); none when neither is known. A first host
    other than github.com is a GitHub Enterprise host: GH_HOST names it."""
    if repo.token_hosts is not None:
        hosts = repo.token_hosts
    else:
        hosts = () if origin is None else (GITHUB, GITHUB_API) if origin == GITHUB else (origin,)
    gh_host = hosts[0].rsplit(":", 1)[0] if hosts and hosts[0] not in (GITHUB, GITHUB_API) else None
    return hosts, gh_host
