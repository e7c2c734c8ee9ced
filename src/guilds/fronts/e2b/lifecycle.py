"""What an E2B sandbox does at its timeout: its create's ``autoPause`` / ``autoResume`` (docs/e2b.md).

The SDKs send, at create, ``autoPause`` (a bool: ``lifecycle={"on_timeout": "pause"}``,
Python's ``auto_pause=True``), ``autoPauseMemory`` (a bool: ``keep_memory``) and
``autoResume`` (``{"enabled": bool}``). With ``autoPause`` true the sandbox is paused at
its timeout, as by ``POST /sandboxes/{id}/pause`` (its commands ended, its files
kept), not killed; a connect resumes it. No sandbox here keeps the memory of its
processes: a resumed sandbox has no running command, whichever ``autoPauseMemory``
says; false makes the pause filesystem-only, as ``pause(keep_memory=False)``.
A paused sandbox is resumed by a connect; with ``autoResume`` enabled, also by the next
request that reaches it (its process or file API, or one of its ports: ``Sandboxes.awake``),
with a fresh timeout of its create's (``resume_seconds``), as E2B's. Its ``/health`` wakes
nothing: it answers that the sandbox is paused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .connect import ConnectError


@dataclass(frozen=True)
class Lifecycle:
    """pause_at_timeout: paused, not killed, at its timeout; auto_resume: as asked."""

    pause_at_timeout: bool = False
    auto_resume: bool = False
    keep_memory: bool = True
    """False: the pause at its timeout is filesystem-only (``Sandboxes.pause``)."""
    resume_seconds: int = 300
    """The timeout an auto-resume gives it, from the resume: its create's."""


def asked(body: dict[str, Any], timeout: int) -> Lifecycle:
    """The lifecycle a create body asks for, timeout its create's; ``invalid_argument`` naming a
    field of the wrong type."""
    pause = _flag(body.get("autoPause"), "autoPause")
    memory = body.get("autoPauseMemory")
    _flag(memory, "autoPauseMemory")
    resume = body.get("autoResume")
    if resume is not None and not (isinstance(resume, dict) and set(resume) <= {"enabled"}):
        raise ConnectError("invalid_argument", 'autoResume: an object {"enabled": true or false}')
    enabled = _flag((resume or {}).get("enabled"), "autoResume.enabled")
    return Lifecycle(pause_at_timeout=pause, auto_resume=enabled, keep_memory=memory is not False,
                     resume_seconds=timeout)


def _flag(value: Any, name: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise ConnectError("invalid_argument", f"{name}: true or false")
    return bool(value)


KILLED_AT_TIMEOUT = Lifecycle()
"""E2B's default: killed at its timeout."""
