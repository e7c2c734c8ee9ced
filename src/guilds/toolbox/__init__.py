"""The toolbox: one agent's five code tools, through its sandbox, the pipeline and the run record.

    Toolbox(settings, sandbox, store).call(run_id, tool, args) -> CallResult(text, is_error, meta)
    Toolbox(...).tools() -> [Tool]   (while the agent's coding flag is on)
    Toolbox(...).request(op, args, ...) -> the wire request; Toolbox(...).send(request, ...) -> the envelope

Each tool is one object (``guilds.toolbox.tools``: the registry, in the page's
order). ``Toolbox`` and ``CallResult`` are imported on first use (they bring the
run record's database layer): the tool definitions alone (``guilds tools``, the
CLI's parser) cost none of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .tools import Tool, export, tool_specs

if TYPE_CHECKING:
    from .toolbox import CallResult, Toolbox

__all__ = ["CallResult", "Tool", "Toolbox", "export", "tool_specs"]


def __getattr__(name: str) -> Any:
    if name in ("CallResult", "Toolbox"):
        from . import toolbox

        return getattr(toolbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
