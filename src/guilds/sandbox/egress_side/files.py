"""One agent's egress files on the host, under ``<data>/egress/<agent id>/`` (0700):

- ``run/`` (0755), bound read-only into the sandbox at EGRESS_INSIDE: the proxy's
  socket (SOCKET_NAME, 0666) and the trust bundle (BUNDLE_NAME: the orchestrator's
  certificate authority plus the host's roots);
- ``proxy.json`` (0600): the proxy's config, the only place the real values of
  host-bound secrets are written; ``decisions.jsonl``: the proxy's decisions, read
  into the run record at each call's end (``decision_log``); ``placeholder.key`` (0600):
  the key placeholders are derived from; ORIGINS_NAME (0600): each repository's origin
  host as first read (``origins``); ``proxy.pid``, ``proxy.log``, ``proxy.lock``,
  ``clock`` (the proxy's idle clock where the sandbox has none of its own).

The certificate authority lives in ``<data>/egress/ca/``, one per data folder.

``<data>/egress/shared.key`` (``guilds.egress.shared_key``, written by whoever deploys the server;
optional): a key that servers sharing one run record share. Where it is, an agent's
placeholder key and the authority's key are derived from it (``shared_key``), so any of
those servers gives an agent's sandbox the same placeholders and a proxy its sandbox
trusts (docs/deploy.md, "A replica's death").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ...egress.shared_key import derived_key, shared_key
from ...errors import SandboxError
from .._host_folder import removed

EGRESS_INSIDE = "/run/guilds-egress"
"""Where the proxy's socket folder is bound read-only inside the sandbox."""
SOCKET_NAME = "proxy.sock"
BUNDLE_NAME = "trust.pem"
ORIGINS_NAME = "origins.json"
"""Each repository's origin host as first read, by name and path (0600, host side only)."""


@dataclass(frozen=True)
class EgressFiles:
    """The host files of one agent's egress proxy (see the module docstring)."""

    folder: str
    ca_dir: str

    @property
    def shared(self) -> str:
        return os.path.join(self.folder, "run")

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)


def egress_files(data_dir: str, agent_id: str) -> EgressFiles:
    root = os.path.join(data_dir, "egress")
    return EgressFiles(folder=os.path.join(root, agent_id), ca_dir=os.path.join(root, "ca"))


def prepare(files: EgressFiles, owner: tuple[int, int] | None = None) -> bytes:
    """The folders made (the shared one 0755), the placeholder key read or made; returns it."""
    os.makedirs(files.folder, mode=0o700, exist_ok=True)
    os.makedirs(files.shared, exist_ok=True)
    os.chmod(files.shared, 0o755)  # noqa: S103 - the sandbox's uid must reach the socket in it
    try:
        shared = shared_key(os.path.dirname(files.folder))
    except ValueError as exc:
        raise SandboxError(str(exc)) from None
    if shared is not None:
        return derived_key(shared, "placeholder", os.path.basename(files.folder))
    key_path = files.path("placeholder.key")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return Path(key_path).read_bytes()
    with os.fdopen(fd, "wb") as fh:
        key = os.urandom(32)
        fh.write(key)
    return key


@contextlib.contextmanager
def locked(files: EgressFiles) -> Iterator[None]:
    """The agent's proxy lock held (flock): one process at a time starts, stops or reads it."""
    with open(files.path("proxy.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def write_private(path: str, data: str | bytes) -> None:
    """path written whole (0600, never through a link): a temporary file, then renamed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def remove_files(files: EgressFiles) -> list[str]:
    """The agent's proxy folder removed (its proxy stopped first); its path when it was there."""
    return list(removed([Path(files.folder)]))
