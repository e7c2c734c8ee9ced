"""The values the proxy puts in for their hosts (a secret with hosts, a repository token),
each a placeholder of the same length inside the sandbox."""

from __future__ import annotations

import hashlib
import hmac
import os
import string
from dataclasses import dataclass
from typing import Any, Mapping

from ...config.settings import AgentSettings
from .files import EgressFiles, prepare
from .origins import pinned_origins, repo_hosts

_PLACEHOLDER_CHARS = string.ascii_letters + string.digits


def placeholder(key: bytes, name: str, value: str) -> str:
    """A stand-in of value's length, derived from key and name (stable while the key is),
    letters and digits only, never equal to the value."""
    out, counter = "", 0
    while len(out) < len(value):
        block = hmac.new(key, f"{name}\0{counter}".encode(), hashlib.sha256).digest()
        out += "".join(_PLACEHOLDER_CHARS[b % len(_PLACEHOLDER_CHARS)] for b in block)
        counter += 1
    out = out[: len(value)]
    return out if out != value else out[::-1]


@dataclass(frozen=True)
class Bound:
    """A value the proxy puts in for its hosts: its name, placeholder, value and hosts."""

    name: str
    placeholder: str
    value: str
    hosts: tuple[str, ...]
    gh_host: str | None = None


def bound_values(settings: AgentSettings, files: EgressFiles, home: str | None) -> dict[str, Bound]:
    """Every host-bound value: ``secrets.NAME`` for a secret with hosts, ``repos.NAME``
    for a repository token (its default hosts from ``pinned_origins``; home None: the
    home is not on this host, a token goes to its ``token_hosts`` only). The agent's
    egress folder is made (``prepare``) and its placeholder key read."""
    key = prepare(files)
    origins = {} if home is None else pinned_origins(files, settings, home)
    out = {}
    for name, hosts in settings.secret_hosts.items():
        value = settings.secrets[name]
        out[f"secrets.{name}"] = Bound(name, placeholder(key, f"secrets.{name}", value), value, hosts)
    for repo in settings.repos:
        if repo.token:
            hosts, gh_host = repo_hosts(repo, origins.get(repo.name))
            name = f"repos.{repo.name}"
            out[name] = Bound(name, placeholder(key, name, repo.token), repo.token, hosts, gh_host)
    return out


def repos_entries(settings: AgentSettings, home: str, bound: Mapping[str, Bound]) -> dict[str, Any]:
    """repos.json's mapping behind the proxy: each folder -> its token's placeholder,
    or ``{"token", "gh_host"}`` for a repository on a GitHub Enterprise host."""
    out: dict[str, Any] = {}
    for repo in settings.repos:
        entry = bound.get(f"repos.{repo.name}")
        if entry is not None:
            folder = os.path.normpath(os.path.join(home, repo.path))
            out[folder] = ({"token": entry.placeholder, "gh_host": entry.gh_host} if entry.gh_host
                           else entry.placeholder)
    return out
