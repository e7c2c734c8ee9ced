"""code_task: a change delegated to the coding harness, run by guilds-harness."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guilds_harness import limits as task_limits
from guilds_harness.request import OP, HarnessRequest, validate_task

from ...sandbox.helpers import HARNESS_HELPER
from .tool import TASK_CALL, CallSite, Extra, Hints, Tool, valid_int

DESCRIPTION = (
    "Delegate a change to the coding harness, or resume one of its sessions. "
    "Give a self-contained brief; the result is the harness's status, diffstat, "
    "final message and log path. Check its work with shell, file_read and code_search."
)
COMPLETED = "completed"
"""The harness's status of a result that is no error."""


def task_schema() -> dict[str, Any]:
    """code_task's arguments (guilds_harness.request.validate_task checks them)."""
    string = {"type": "string"}
    return {
        "type": "object",
        "properties": {
            "brief": {**string, "description": "What to change and how to know it is done."},
            "repo": {**string, "description": "The repository to work in, by name. Default: the only one."},
            "session_id": {**string, "description": "Resume this harness session instead of starting one."},
            "notes": {**string, "description": "Extra context for the harness: findings, constraints."},
            "timeout_minutes": {
                "type": "integer", "minimum": task_limits.TIMEOUT_MINUTES_MIN,
                "maximum": task_limits.TIMEOUT_MINUTES_MAX,
                "default": task_limits.TIMEOUT_MINUTES_DEFAULT, "description": "Stop the harness after this long.",
            },
        },
        "required": ["brief"],
        "additionalProperties": False,
    }


class TaskTool(Tool):
    """Runs on guilds-harness, with the agent's harness and repositories; a status other
    than ``completed`` is an error; still running after MCP_TASK_AFTER_SECONDS, an MCP task."""

    def check(self, args: Any) -> Any:
        validate_task(args)
        return args

    def wait(self, args: Any) -> float:
        """Its timeout_minutes plus WAIT_EXTRA_SECONDS."""
        minutes = args.get("timeout_minutes") if isinstance(args, Mapping) else None
        if not valid_int(minutes, task_limits.TIMEOUT_MINUTES_MIN, task_limits.TIMEOUT_MINUTES_MAX):
            minutes = task_limits.TIMEOUT_MINUTES_DEFAULT
        return float(minutes * 60 + task_limits.WAIT_EXTRA_SECONDS)

    async def extra_fields(self, site: CallSite) -> Extra:
        return Extra({"harness": site.settings.harness, "repos": site.repos})

    def checkpoint_moments(self) -> tuple[str, ...]:
        """At its start and at its end: the harness changes files all along."""
        return ("before", "after")

    def failed(self, meta: Mapping[str, Any]) -> bool:
        return meta.get("status") != COMPLETED

    def task(self, args: Mapping[str, Any]) -> str | None:
        return TASK_CALL


CODE_TASK = TaskTool(OP, DESCRIPTION, task_schema(), Hints("Delegate a code change", False, True, False, True),
                     helper=HARNESS_HELPER, request_type=HarnessRequest)
"""Changes files and may reach the network."""
