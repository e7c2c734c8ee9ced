"""The tool definitions in each model API's format:

    anthropic  {"name", "description", "input_schema"}              (Messages API)
    openai     {"type": "function", "function": {"name", "description", "parameters"}}
                                                                   (Chat Completions)
    openai-responses  {"type": "function", "name", "description", "parameters"}  (Responses API)
    mcp        {"name", "title", "description", "inputSchema", "annotations"}
                                                                   (tools/list)

The mcp format is what the MCP front serves (``guilds.fronts.mcp_server``
builds its tools from it): each tool's schema with the optional ``run``
argument every served tool takes (the run a call continues,
``guilds.fronts.mcp_runs``), its title, and its annotations (``Tool.hints``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .tool import Tool


def to_anthropic(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}


def to_openai(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
    }


def to_openai_responses(tool: Tool) -> dict[str, Any]:
    return {"type": "function", "name": tool.name, "description": tool.description, "parameters": tool.input_schema}


RUN_ARG = "run"
"""The optional argument of every tool the MCP front serves, naming its run (the handle a result gave)."""
RUN_ARG_DESCRIPTION = (
    "The run this call continues: the run id an earlier result of this server gave "
    "(its first line, run: mcp-...). Omit it on the first call; a run keeps the working directory "
    "and the read pointers."
)


def with_run_argument(schema: dict[str, Any]) -> dict[str, Any]:
    """schema with the optional ``run`` string argument added to its properties."""
    properties = {**schema.get("properties", {}), RUN_ARG: {"type": "string", "description": RUN_ARG_DESCRIPTION}}
    return {**schema, "properties": properties}


def mcp_annotations(tool: Tool) -> dict[str, Any]:
    """The tool's hints as MCP's ``ToolAnnotations``, in its wire names."""
    hints = tool.hints
    return {"title": hints.title, "readOnlyHint": hints.read_only, "destructiveHint": hints.destructive,
            "idempotentHint": hints.idempotent, "openWorldHint": hints.open_world}


def to_mcp(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "title": tool.hints.title, "description": tool.description,
            "inputSchema": with_run_argument(tool.input_schema), "annotations": mcp_annotations(tool)}


FORMATS: dict[str, Callable[[Tool], dict[str, Any]]] = {
    "anthropic": to_anthropic,
    "openai": to_openai,
    "openai-responses": to_openai_responses,
    "mcp": to_mcp,
}


def export(tools: list[Tool], fmt: str) -> list[dict[str, Any]]:
    """The definitions in one model API's format (anthropic, openai, openai-responses, mcp)."""
    return [FORMATS[fmt](tool) for tool in tools]
