"""What the kubernetes backend keeps on this host, under the data folder's
``kubernetes/`` (0700, its files 0600, never followed through a link):

- ``fingerprint.key``: 32 random bytes, made once by the first process that needs
  them: the key of a pod's ``guilds/fingerprint`` annotation (an HMAC-SHA-256,
  ``kube_spec.keyed_fingerprint``). It never goes into the cluster, so whoever can
  read pods cannot test guesses of a secret against the annotation;
- ``templates/<template>.json`` and ``agents/<agent id>.json``: what the claim
  mode learned (``Notes``): the template and warm pool made at a size and their
  image's helpers checked; the agent's claim or own Sandbox, its pod and the files
  written into it. The next orchestrator process starts from them, its first exec
  on the noted pod the check (``kube_claims``), and learns anew what no longer holds.
  No secret is in them (the files written are named by a keyed hash).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from ...config.private import private_dir
from ...errors import SandboxError

FOLDER = "kubernetes"
KEY_FILE = "fingerprint.key"
KEY_BYTES = 32
NOTE_MAX_BYTES = 64 * 1024
"""A note larger than this is not ours: it is read as none."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def folder(data_dir: str | os.PathLike, *parts: str) -> Path:
    """The data folder's kubernetes/ (or a folder under it), made 0700."""
    return private_dir(Path(data_dir, FOLDER, *parts))


def _read(path: Path, limit: int) -> bytes | None:
    """The file's bytes (at most limit + 1), None when it is not there."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SandboxError(f"kubernetes: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes, *, replace: bool) -> None:
    """data at path, whole or not at all: written beside it (0600), then renamed over it
    (replace) or linked to it, leaving a file another process made first."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
    except OSError as exc:
        raise SandboxError(f"kubernetes: cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def fingerprint_key(data_dir: str | os.PathLike) -> bytes:
    """The data folder's fingerprint key, made on first use (one key however many
    processes make it at once: the first file linked in place is kept)."""
    path = folder(data_dir) / KEY_FILE
    key = _read(path, KEY_BYTES)
    if key is None:
        _write_new(path, secrets.token_bytes(KEY_BYTES), replace=False)
        key = _read(path, KEY_BYTES)
    if key is None or len(key) != KEY_BYTES:
        raise SandboxError(f"kubernetes: {path} is not a key of {KEY_BYTES} bytes; delete it (the agents' pods "
                           "are then made anew)")
    return key


class Notes:
    """One JSON note of the claim mode under kubernetes/ (``templates/<name>.json`` or
    ``agents/<agent id>.json``): read whole, written whole, forgotten."""

    def __init__(self, data_dir: str | os.PathLike, kind: str, name: str):
        self._data_dir, self._kind, self._name = data_dir, kind, name

    @property
    def path(self) -> Path:
        return folder(self._data_dir, self._kind) / f"{self._name}.json"

    def read(self) -> dict[str, Any]:
        """The note, {} when there is none (or it is not one of ours)."""
        data = _read(self.path, NOTE_MAX_BYTES)
        if data is None or len(data) > NOTE_MAX_BYTES:
            return {}
        try:
            note = json.loads(data)
        except ValueError:
            return {}
        return note if isinstance(note, dict) else {}

    def write(self, note: dict[str, Any]) -> None:
        _write_new(self.path, json.dumps(note, sort_keys=True).encode(), replace=True)

    def forget(self) -> bool:
        """Remove the note; True when there was one."""
        path = Path(self._data_dir, FOLDER, self._kind, f"{self._name}.json")
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise SandboxError(f"kubernetes: cannot remove {path}: {exc.strerror or exc}") from None
        return True
