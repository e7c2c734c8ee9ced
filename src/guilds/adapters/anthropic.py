"""The Anthropic Messages API's tool loop: ``tool_use`` blocks in, ``tool_result`` blocks out.

    results = await tool_results(run, message)
    messages += [{"role": "assistant", "content": message.content},
                 {"role": "user", "content": results}]

``message`` is the response of ``messages.create`` (``stop_reason ==
"tool_use"``), or its content list. Each result: ``{"type": "tool_result",
"tool_use_id", "content": text, "is_error"}``.
"""

from __future__ import annotations

from typing import Any

from . import Caller, Requested, field, run_all


def requested_calls(message: Any) -> list[Requested]:
    """The tool_use blocks of a message (or of a content list)."""
    blocks = message if isinstance(message, list) else field(message, "content", []) or []
    return [Requested(field(b, "id"), field(b, "name"), field(b, "input"))
            for b in blocks if field(b, "type") == "tool_use"]


async def tool_results(run: Caller, message: Any) -> list[dict[str, Any]]:
    """Run every tool_use of message (concurrently); the tool_result blocks, in order."""
    answers = await run_all(run, requested_calls(message))
    return [{"type": "tool_result", "tool_use_id": a.id, "content": a.text, "is_error": a.is_error}
            for a in answers]
