"""The code_task request: guilds-code's transport and common fields, plus its own.

Decoding (base64 argv or request file, then delete) and the common fields
reuse guilds_code.protocol, so both helpers read requests the same way. What
is code_task's own is validated here, each error one line naming the field.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from guilds_code import limits as code_limits
from guilds_code import protocol
from guilds_code.protocol import RequestError

from . import limits
from .harnesses import DEFAULT_HARNESS, HARNESSES

OP = "code_task"
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
_REPO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class TaskArgs:
    """code_task's arguments, validated, defaults filled."""

    brief: str
    repo: Optional[str] = None
    session_id: Optional[str] = None
    notes: Optional[str] = None
    timeout_minutes: int = limits.TIMEOUT_MINUTES_DEFAULT


class HarnessRequest(protocol.Request):
    """A guilds_code Request (so guilds_code.runstate takes it) plus code_task's fields."""

    __slots__ = ("task", "harness", "repos")

    def __init__(
        self,
        *,
        task: Optional[TaskArgs] = None,
        harness: str = DEFAULT_HARNESS,
        repos: Optional[Dict[str, str]] = None,
        **common: Any,
    ):
        super().__init__(**common)
        self.task = task
        self.harness = harness
        self.repos = {} if repos is None else repos

    def wire(self) -> Dict[str, Any]:
        """The request as the orchestrator sends it (``parse_request`` reads it back)."""
        return {**super().wire(), "harness": self.harness, "repos": self.repos}


_ARGS = ("brief", "repo", "session_id", "notes", "timeout_minutes")


def _optional_str(args: Dict[str, Any], name: str) -> Optional[str]:
    value = args.get(name)
    return None if value is None else protocol.check_str(name, value, None)


def validate_task(args: Any) -> TaskArgs:
    """Check code_task's arguments. A null value counts as absent."""
    if not isinstance(args, dict):
        raise RequestError(f"args: must be an object, got {protocol.show(args)}")
    for key in args:
        if key not in _ARGS:
            raise RequestError(f"{key}: unknown argument for {OP} (known: {', '.join(_ARGS)})")
    brief = _optional_str(args, "brief")
    if brief is None:
        raise RequestError(f"brief: required by {OP}")
    if not brief.strip():
        raise RequestError("brief: must not be empty")
    task = TaskArgs(brief=brief, repo=_optional_str(args, "repo"), notes=_optional_str(args, "notes"))
    if len(brief) + len(task.notes or "") > limits.BRIEF_MAX_CHARS:
        raise RequestError(f"brief: with notes, longer than {limits.BRIEF_MAX_CHARS} characters")
    task.session_id = _session_id(_optional_str(args, "session_id"))
    if args.get("timeout_minutes") is not None:
        bounds = (limits.TIMEOUT_MINUTES_MIN, limits.TIMEOUT_MINUTES_MAX)
        task.timeout_minutes = protocol.check_int("timeout_minutes", args["timeout_minutes"], bounds)
    return task


def _session_id(value: Optional[str]) -> Optional[str]:
    if value is None or value == "":
        return None
    if len(value) > limits.SESSION_ID_MAX_CHARS or not _SESSION_RE.match(value):
        raise RequestError(
            f"session_id: must be a session id the harness printed, got {protocol.show(value)}"
        )
    return value


def _repos(value: Any) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("repos: must be an object of name -> absolute folder")
    out = {}
    for name, folder in value.items():
        if not _REPO_NAME_RE.match(name) or len(name) > code_limits.NAME_MAX_CHARS:
            raise RequestError(f"repos: bad repository name {protocol.show(name)}")
        if not isinstance(folder, str) or not folder.startswith("/") or "\x00" in folder:
            raise RequestError(f"repos.{name}: must be an absolute path, got {protocol.show(folder)}")
        out[name] = os.path.normpath(folder)
    return out


def _harness(value: Any) -> str:
    if value is None:
        return DEFAULT_HARNESS
    if value not in HARNESSES:
        known = ", ".join(sorted(HARNESSES))
        raise RequestError(f"harness: unknown harness {protocol.show(value)} (known: {known})")
    return value


def parse_request(data: Any) -> HarnessRequest:
    """Validate a decoded request object into a HarnessRequest."""
    if not isinstance(data, dict):
        raise RequestError("request: must be a JSON object")
    if data.get("op") != OP:
        raise RequestError(f"op: must be {OP!r}, got {protocol.show(data.get('op'))}")
    home = protocol.abs_path_field(data, "home")
    max_bytes = data.get("max_bytes", code_limits.DEFAULT_MAX_BYTES)
    cap = (code_limits.MIN_MAX_BYTES, code_limits.PLATFORM_CAP_BYTES)
    return HarnessRequest(
        op=OP,
        args=data.get("args") if isinstance(data.get("args"), dict) else {},
        task=validate_task(data.get("args", {})),
        run_id=protocol.name_field(data, "run_id"),
        agent_id=protocol.name_field(data, "agent_id"),
        call_id=protocol.name_field(data, "call_id"),
        home=home,
        cwd=protocol.abs_path_field(data, "cwd", home),
        max_bytes=protocol.check_int("max_bytes", max_bytes, cap),
        seq=protocol.check_int("seq", data.get("seq", 0), (0, 2**63 - 1)),
        redact_env=protocol.env_names(data.get("redact_env")),
        harness=_harness(data.get("harness")),
        repos=_repos(data.get("repos")),
    )


def decode_request(argv: List[str]) -> HarnessRequest:
    """argv (without the program name) -> HarnessRequest, or RequestError."""
    if len(argv) != 1:
        raise RequestError(f"request: expected one argument, got {len(argv)}")
    raw = protocol.decode_arg(argv[0])
    return parse_request(protocol.parse_json(raw, "request"))


def resolve_repo(request: HarnessRequest, cwd: str) -> tuple[str, str]:
    """(name, folder) of the repository the harness works in.

    The named repo; else the repository holding the run's working directory
    cwd; else the only one. RequestError when none fits.
    """
    repos, name = request.repos, request.task.repo if request.task else None
    if name is not None:
        if name not in repos:
            known = ", ".join(sorted(repos)) or "none"
            raise RequestError(f"repo: unknown repository {protocol.show(name)} (known: {known})")
        return name, repos[name]
    for candidate, folder in sorted(repos.items()):
        if cwd == folder or cwd.startswith(folder.rstrip("/") + os.sep):
            return candidate, folder
    if len(repos) == 1:
        return next(iter(repos.items()))
    if not repos:
        raise RequestError("repo: the agent has no repository to work in")
    raise RequestError(f"repo: required, the agent has several ({', '.join(sorted(repos))})")
