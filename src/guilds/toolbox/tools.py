"""The five tools' definitions: names, descriptions a model can act on, JSON Schemas.

The schemas of the four check tools are built from ``guilds_code.protocol.ARG_SPECS``
(the helper's own validation table), so names, defaults and ranges cannot
drift from what the helper accepts. Exported for four formats:

    anthropic  {"name", "description", "input_schema"}              (Messages API)
    openai     {"type": "function", "function": {"name", "description", "parameters"}}
                                                                   (Chat Completions)
    openai-responses  {"type": "function", "name", "description", "parameters"}  (Responses API)
    mcp        {"name", "description", "inputSchema"}               (tools/list)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from guilds_code import limits
from guilds_code.protocol import ARG_SPECS, REQUIRED, validate_args
from guilds_harness import limits as task_limits
from guilds_harness.request import validate_task

from ..sandbox.helpers import CODE_HELPER, HARNESS_HELPER


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model sees it (name, description, input_schema: what ``export``
    writes) and how the toolbox runs it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    helper: str = CODE_HELPER
    """The one-file helper that runs it inside the sandbox."""
    check_args: Callable[[Any], Any] | None = None
    """The arguments checked as the helper will check them (RequestError if bad), or
    None: guilds_code.protocol.validate_args for the tool's name."""
    error_unless_status: str | None = None
    """When set, a result whose meta ``status`` is another is an error result."""

    def checked(self, args: Any) -> Any:
        """args checked (RequestError if bad): what the toolbox computes the helper's wait from."""
        return validate_args(self.name, args) if self.check_args is None else self.check_args(args)


DESCRIPTIONS = {
    "code_task": (
        "Delegate a change to the coding harness, or resume one of its sessions. "
        "Give a self-contained brief; the result is the harness's status, diffstat, "
        "final message and log path. Check its work with shell, file_read and code_search."
    ),
    "shell": (
        "Run a bash command in the agent's sandbox: tests, builds, git, gh. Returns combined "
        "stdout and stderr, then exit_code: N when not 0. A long output keeps its start and its "
        "end, lists the first error lines of the part it leaves out with their line numbers, and "
        "names a log file holding all of it (read it with file_read). A cd carries over to the "
        "next call (the result says where); environment changes do not. Stdin is closed and "
        f"nothing can prompt: pass non-interactive flags. Default timeout {limits.SHELL_TIMEOUT_DEFAULT} s, "
        f"{limits.SHELL_TIMEOUT_MIN} to {limits.SHELL_TIMEOUT_MAX}. Set background for a "
        "long-running process such as a dev server (listen on $PORT), then follow it with "
        "shell_status."
    ),
    "shell_status": (
        "Follow or stop a command started with shell in the background. Without id: every "
        "background command with its state (running, exited N, stopping, stopped, ended). "
        f"With id (b1, b2, ...): its state, exit code and the last {limits.STATUS_TAIL_LINES} "
        "lines of its log. With id and stop: end it. To wait instead of polling: wait (seconds) "
        "returns as soon as the command ends (without id: any running command), and until (a "
        "regular expression, with id) also returns when a new line of its log matches, like "
        "until='Listening on|ready'; the first line says what ended the wait."
    ),
    "file_read": (
        "Read numbered lines of a text file inside the agent's home. path is relative to the "
        f"working directory (~ is the home). Returns up to limit lines (default "
        f"{limits.READ_LIMIT_DEFAULT}, at most {limits.READ_LIMIT_MAX}) from offset (first line, "
        "1-based) under a 'lines a–b of n' header; a cut range says which offset continues it. "
        f"Lines over {limits.READ_LINE_MAX_CHARS} characters are clipped. Reading the same "
        "unchanged lines again returns a pointer to the earlier result instead of the text."
    ),
    "code_search": (
        "Search the code with ripgrep (respects .gitignore). mode 'files' (default) lists "
        f"matching paths with match counts, at most {limits.SEARCH_FILES_MAX}; mode 'content' "
        f"shows path:line: text, at most {limits.SEARCH_LINES_MAX} lines and "
        f"{limits.SEARCH_MATCHES_PER_FILE} matches per file, with context lines. pattern is a "
        "regular expression unless fixed. Search files first, then lines. Paths in the result "
        "are relative to the working directory and can be passed to file_read."
    ),
}

ARG_DESCRIPTIONS = {
    "shell": {
        "command": "The bash command, run with bash -c in the working directory.",
        "timeout_seconds": "Stop the command after this many seconds.",
        "background": "Start it in the background and return at once (for servers, watchers).",
    },
    "shell_status": {
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
    },
    "file_read": {
        "path": "The file, relative to the working directory, absolute inside the home, or ~/...",
        "offset": "The first line to return, 1-based.",
        "limit": "How many lines to return.",
    },
    "code_search": {
        "pattern": "A regular expression (a literal string with fixed).",
        "path": "A folder or file to search, relative to the working directory. Default: it.",
        "glob": "Only files whose path matches this glob, like '*.py' or 'src/**'.",
        "mode": "'files': matching paths with counts; 'content': matching lines.",
        "fixed": "Match pattern as a literal string.",
        "ignore_case": "Match regardless of case.",
        "context": "Lines of context around each match (content mode).",
        "limit": (
            f"Lower the maximum of files ({limits.SEARCH_FILES_MAX}) or lines "
            f"({limits.SEARCH_LINES_MAX}) returned."
        ),
    },
}

_TYPES = {"str": "string", "int": "integer", "bool": "boolean"}


def _property(kind: str, default: Any, extra: Any, description: str) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": _TYPES[kind], "description": description}
    if default is not REQUIRED and default is not None:
        prop["default"] = default
    if kind == "int" and extra:
        prop["minimum"] = extra[0]
        if extra[1] < 2**63 - 1:
            prop["maximum"] = extra[1]
    elif kind == "str" and extra:
        prop["enum"] = list(extra)
    return prop


def schema_for(op: str) -> dict[str, Any]:
    """The JSON Schema of a check tool's arguments, from ARG_SPECS."""
    specs = ARG_SPECS[op]
    props = {
        name: _property(kind, default, extra, ARG_DESCRIPTIONS[op][name])
        for name, (kind, default, extra) in specs.items()
    }
    required = [name for name, (_, default, _) in specs.items() if default is REQUIRED]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def code_task_schema() -> dict[str, Any]:
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


TOOL_NAMES = ("code_task", "shell", "shell_status", "file_read", "code_search")


def _checked_task(args: Any) -> Any:
    validate_task(args)
    return args


def tool_specs() -> list[ToolSpec]:
    """The five tools, in the page's order: code_task runs on guilds-harness, and a
    status other than ``completed`` is an error; the four check tools on guilds-code."""
    code_task = ToolSpec("code_task", DESCRIPTIONS["code_task"], code_task_schema(), helper=HARNESS_HELPER,
                         check_args=_checked_task, error_unless_status="completed")
    return [code_task, *(ToolSpec(op, DESCRIPTIONS[op], schema_for(op)) for op in TOOL_NAMES[1:])]


def to_anthropic(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema}


def to_openai(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": spec.input_schema},
    }


def to_openai_responses(spec: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "name": spec.name, "description": spec.description, "parameters": spec.input_schema}


def to_mcp(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "inputSchema": spec.input_schema}


FORMATS: dict[str, Callable[[ToolSpec], dict[str, Any]]] = {
    "anthropic": to_anthropic,
    "openai": to_openai,
    "openai-responses": to_openai_responses,
    "mcp": to_mcp,
}


def export(specs: list[ToolSpec], fmt: str) -> list[dict[str, Any]]:
    """The definitions in one model API's format (anthropic, openai, openai-responses, mcp)."""
    return [FORMATS[fmt](spec) for spec in specs]
