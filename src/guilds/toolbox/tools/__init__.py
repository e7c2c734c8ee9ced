"""The five tools, each one object (``Tool``, tool.py), listed here in the product page's order.

Every export format (``guilds tools --format``, ``Toolbox.tools()``) and every
front (the CLI, MCP, the Python API) reads this registry; the toolbox looks a
call's tool up here and asks it (its check, wait, re-run rule, extra request
fields, failure rule, task rule, MCP hints). Nothing outside this package names
a tool.

Adding a tool: a module beside these with its ``Tool`` (subclass what differs
from the defaults), its entry in ``TOOLS``, and the op in the helper that runs
it (``guilds_code.protocol.ARG_SPECS`` and ``guilds_code.ops``, or a helper of
its own). See docs/toolbox.md, "Adding a tool".
"""

from __future__ import annotations

from typing import Any

from guilds_code import limits

from .formats import FORMATS, export
from .read_tool import FILE_READ
from .search_tool import CODE_SEARCH
from .shell_tools import SHELL, SHELL_STATUS
from .task_tool import CODE_TASK
from .tool import TASK_CALL, TASK_COMMAND, CallSite, Extra, Hints, Tool

TOOLS: tuple[Tool, ...] = (CODE_TASK, SHELL, SHELL_STATUS, FILE_READ, CODE_SEARCH)
"""The product page's order."""
TOOL_NAMES = tuple(tool.name for tool in TOOLS)
_BY_NAME = {tool.name: tool for tool in TOOLS}

__all__ = ["CODE_SEARCH", "CODE_TASK", "FILE_READ", "FORMATS", "SHELL", "SHELL_STATUS", "TASK_CALL",
           "TASK_COMMAND", "TOOLS", "TOOL_NAMES", "CallSite", "Extra", "Hints", "Tool", "export",
           "schema_for", "tool_named", "tool_specs", "wait_for"]


def tool_specs() -> list[Tool]:
    """The five tools, in the page's order."""
    return list(TOOLS)


def tool_named(name: str) -> Tool | None:
    """The tool of this name, or None."""
    return _BY_NAME.get(name)


def schema_for(name: str) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments."""
    return _BY_NAME[name].input_schema


def wait_for(name: str, args: Any) -> float:
    """How long to wait for the helper: shell its own timeout plus 30 s; code_task
    its timeout_minutes plus WAIT_EXTRA_SECONDS; shell_status its wait plus 120 s
    (a stop, a check or a list without wait: 120 s); any other op 120 s."""
    tool = _BY_NAME.get(name)
    return tool.wait(args) if tool is not None else float(limits.OP_WAIT_SECONDS)
