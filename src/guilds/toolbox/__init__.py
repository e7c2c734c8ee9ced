"""The toolbox: one agent's five code tools, through its sandbox, the pipeline and the run record.

    Toolbox(settings, sandbox, store).call(run_id, tool, args) -> CallResult(text, is_error, meta)
    Toolbox(...).tools() -> [ToolSpec]   (while the agent's coding flag is on)
"""

from .toolbox import CallResult, Toolbox
from .tools import ToolSpec, export, tool_specs

__all__ = ["CallResult", "ToolSpec", "Toolbox", "export", "tool_specs"]
