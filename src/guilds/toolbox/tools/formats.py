"""The tool definitions in each model API's format:

    anthropic  {"name", "description", "input_schema"}              (Messages API)
    openai     {"type": "function", "function": {"name", "description", "parameters"}}
                                                                   (Chat Completions)
    openai-responses  {"type": "function", "name", "description", "parameters"}  (Responses API)
    mcp        {"name", "description", "inputSchema"}               (tools/list)
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


def to_mcp(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}


FORMATS: dict[str, Callable[[Tool], dict[str, Any]]] = {
    "anthropic": to_anthropic,
    "openai": to_openai,
    "openai-responses": to_openai_responses,
    "mcp": to_mcp,
}


def export(tools: list[Tool], fmt: str) -> list[dict[str, Any]]:
    """The definitions in one model API's format (anthropic, openai, openai-responses, mcp)."""
    return [FORMATS[fmt](tool) for tool in tools]
