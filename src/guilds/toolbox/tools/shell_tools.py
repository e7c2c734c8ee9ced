"""shell and shell_status: a command in the agent's sandbox, and its background commands."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guilds_code import limits
from guilds_code.protocol import ARG_SPECS

from .tool import TASK_COMMAND, Hints, Tool, arg_schema, valid_int

SHELL_DESCRIPTION = (
    "Run a bash command in the agent's sandbox: tests, builds, git, gh. Returns combined "
    "stdout and stderr, then exit_code: N when not 0. A long output keeps its start and its "
    "end, lists the first error lines of the part it leaves out with their line numbers, and "
    "names a log file holding all of it (read it with file_read). A cd carries over to the "
    "next call (the result says where); environment changes do not. Stdin is closed and "
    f"nothing can prompt: pass non-interactive flags. Default timeout {limits.SHELL_TIMEOUT_DEFAULT} s, "
    f"{limits.SHELL_TIMEOUT_MIN} to {limits.SHELL_TIMEOUT_MAX}. Set background for a "
    "long-running process such as a dev server (listen on $PORT), then follow it with "
    "shell_status."
)
SHELL_ARGS = {
    "command": "The bash command, run with bash -c in the working directory.",
    "timeout_seconds": "Stop the command after this many seconds.",
    "background": "Start it in the background and return at once (for servers, watchers).",
}
STATUS_DESCRIPTION = (
    "Follow or stop a command started with shell in the background. Without id: every "
    "background command with its state (running, exited N, stopping, stopped, ended). "
    f"With id (b1, b2, ...): its state, exit code and the last {limits.STATUS_TAIL_LINES} "
    "lines of its log. With id and stop: end it. To wait instead of polling: wait (seconds) "
    "returns as soon as the command ends (without id: any running command), and until (a "
    "regular expression, with id) also returns when a new line of its log matches, like "
    "until='Listening on|ready'; the first line says what ended the wait."
)
STATUS_ARGS = {
    "id": "A background command's id, like b1. Omit to list them all.",
    "stop": "End the command given by id.",
    "wait": (
        f"Wait up to this many seconds ({limits.STATUS_WAIT_MIN} to {limits.STATUS_WAIT_MAX}) "
        "for the command to end (or a new log line to match until), instead of polling."
    ),
    "until": (
        "With id: a regular expression; return as soon as a new line of the command's log "
        f"matches it (waits {limits.STATUS_UNTIL_WAIT_DEFAULT} s at most unless wait says)."
    ),
}


class ShellTool(Tool):
    """shell: changes files and may reach the network; a background start becomes a task
    that follows the command."""

    def wait(self, args: Any) -> float:
        """Its own timeout plus SHELL_WAIT_EXTRA_SECONDS."""
        timeout = args.get("timeout_seconds") if isinstance(args, Mapping) else None
        if not valid_int(timeout, limits.SHELL_TIMEOUT_MIN, limits.SHELL_TIMEOUT_MAX):
            timeout = limits.SHELL_TIMEOUT_DEFAULT
        return float(timeout + limits.SHELL_WAIT_EXTRA_SECONDS)

    def task(self, args: Mapping[str, Any]) -> str | None:
        return TASK_COMMAND if args.get("background") is True else None

    def checkpoint_moments(self) -> tuple[str, ...]:
        return ("before",)


class StatusTool(Tool):
    """shell_status: lists and checks change nothing (rerunnable); a stop ends a process."""

    def wait(self, args: Any) -> float:
        """Its wait (or the until default) plus OP_WAIT_SECONDS."""
        return float(status_wait(args) + limits.OP_WAIT_SECONDS)

    def rerunnable(self, args: Any) -> bool:
        return not (isinstance(args, Mapping) and args.get("stop"))


def status_wait(args: Any) -> int:
    """The seconds a shell_status may wait (its wait, or the until default), else 0."""
    if not isinstance(args, Mapping):
        return 0
    wait = args.get("wait")
    if valid_int(wait, limits.STATUS_WAIT_MIN, limits.STATUS_WAIT_MAX):
        return wait
    return limits.STATUS_UNTIL_WAIT_DEFAULT if args.get("until") is not None else 0


SHELL = ShellTool("shell", SHELL_DESCRIPTION, arg_schema(ARG_SPECS["shell"], SHELL_ARGS),
                  Hints("Run a shell command", False, True, False, True))
SHELL_STATUS = StatusTool("shell_status", STATUS_DESCRIPTION, arg_schema(ARG_SPECS["shell_status"], STATUS_ARGS),
                          Hints("Follow or stop a background command", False, True, True, False))
"""shell_status's checks are read-only, but its ``stop`` ends a process: per tool, it is not read-only."""
