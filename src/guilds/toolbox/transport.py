"""Run the guilds-code helper in a sandbox: a request in, its envelope out.

The argv is ``[sandbox.python, "-I", "-S", sandbox.helper_path("guilds-code"), ARG]``.
ARG is the request as base64 JSON when that is at most REQUEST_ARGV_MAX
characters; a longer one is written through the sandbox file API to
``<state root>/requests/<run id>-<call id>.json`` and ARG is that path (the
helper reads and deletes the file).

The helper must print exactly one envelope line. Otherwise the call fails with
``HelperFailed``: "code helper failed" and the last STDERR_TAIL_LINES lines of
its stderr; a helper still running after ``wait`` seconds is killed and
reported as "code helper failed: no answer within N s".
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from guilds_code import limits
from guilds_code.protocol import decode_envelope, encode_request
from guilds_harness import limits as task_limits

from .._checks import is_safe_name
from ..errors import BadInput, HelperFailed
from ..sandbox.base import ExecResult, Sandbox

HELPER = "guilds-code"
FAILED = "code helper failed"


def _valid_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def wait_for(op: str, args: Mapping[str, Any]) -> float:
    """How long to wait for the helper: shell its own timeout plus 30 s; code_task
    its timeout_minutes plus WAIT_EXTRA_SECONDS; shell_status its wait plus 120 s
    (a stop, a check or a list without wait: 120 s); any other op 120 s.

    A timeout the helper will refuse counts as the default: the refusal comes at once.
    """
    if op == "code_task":
        minutes = args.get("timeout_minutes") if isinstance(args, Mapping) else None
        if not _valid_int(minutes, task_limits.TIMEOUT_MINUTES_MIN, task_limits.TIMEOUT_MINUTES_MAX):
            minutes = task_limits.TIMEOUT_MINUTES_DEFAULT
        return float(minutes * 60 + task_limits.WAIT_EXTRA_SECONDS)
    if op == "shell_status":
        return float(_status_wait(args) + limits.OP_WAIT_SECONDS)
    if op != "shell":
        return float(limits.OP_WAIT_SECONDS)
    timeout = args.get("timeout_seconds") if isinstance(args, Mapping) else None
    valid = _valid_int(timeout, limits.SHELL_TIMEOUT_MIN, limits.SHELL_TIMEOUT_MAX)
    seconds = timeout if valid else limits.SHELL_TIMEOUT_DEFAULT
    return float(seconds + limits.SHELL_WAIT_EXTRA_SECONDS)


def _status_wait(args: Any) -> int:
    """The seconds a shell_status may wait (its wait, or the until default), else 0."""
    if not isinstance(args, Mapping):
        return 0
    wait = args.get("wait")
    if _valid_int(wait, limits.STATUS_WAIT_MIN, limits.STATUS_WAIT_MAX):
        return wait
    return limits.STATUS_UNTIL_WAIT_DEFAULT if args.get("until") is not None else 0


async def call_helper(sandbox: Sandbox, request: dict[str, Any], *, wait: float,
                      helper: str = HELPER) -> dict[str, Any]:
    """Run one request through a helper (guilds-code or guilds-harness); return its decoded envelope.

    Raises HelperFailed when no envelope comes back, BadInput when the request's
    run_id or call_id cannot name its request file, SandboxError from the sandbox.
    """
    arg = await _argument(sandbox, request)
    argv = [sandbox.python, "-I", "-S", sandbox.helper_path(helper), arg]
    result = await sandbox.exec(argv, timeout=wait)
    if result.timed_out:
        raise HelperFailed(_failure(f"{FAILED}: no answer within {wait:g} s", result))
    envelope = _envelope(result.stdout)
    if envelope is None:
        raise HelperFailed(_failure(FAILED, result))
    return envelope


async def _argument(sandbox: Sandbox, request: dict[str, Any]) -> str:
    encoded = encode_request(request)
    if len(encoded) <= limits.REQUEST_ARGV_MAX:
        return encoded
    names = [request.get("run_id"), request.get("call_id")]
    if not all(isinstance(n, str) and is_safe_name(n) for n in names):
        raise BadInput(f"run_id and call_id must be safe file names, got {names!r}")
    path = f"{sandbox.state_dir}/requests/{names[0]}-{names[1]}.json"
    await sandbox.write_file(path, json.dumps(request, ensure_ascii=False).encode())
    return path


def _envelope(stdout: bytes) -> dict[str, Any] | None:
    lines = stdout.splitlines()
    if len(lines) != 1:
        return None
    try:
        return decode_envelope(lines[0])
    except ValueError:  # binascii.Error, JSONDecodeError and UnicodeDecodeError included
        return None


def _failure(headline: str, result: ExecResult) -> str:
    """The headline, then the last STDERR_TAIL_LINES non-blank lines of stderr."""
    lines = [ln for ln in result.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    tail = lines[-limits.STDERR_TAIL_LINES:]
    if not tail and result.exit_code not in (0, None):
        tail = [f"(exit {result.exit_code}, nothing on stderr)"]
    return "\n".join([headline, *tail])
