"""The OpenAI APIs' tool loops.

Responses API: ``function_call`` items in, ``function_call_output`` items out:

    outputs = await responses_outputs(run, response)
    items += [*response.output, *outputs]      # or previous_response_id=response.id, input=outputs

Chat Completions: ``tool_calls`` in, ``role: "tool"`` messages out:

    messages += [completion.choices[0].message, *await chat_messages(run, completion)]

Neither API has an error flag on a tool's output: an error is in the text
(the toolbox's error texts say what was wrong). Arguments arrive as a JSON
string and are parsed here.
"""

from __future__ import annotations

from typing import Any

from . import Caller, Requested, field, parse_arguments, run_all


def function_calls(response: Any) -> list[Requested]:
    """The function_call items of a Responses API response (or of its output list)."""
    items = response if isinstance(response, list) else field(response, "output", []) or []
    return [Requested(field(i, "call_id"), field(i, "name"), parse_arguments(field(i, "arguments")))
            for i in items if field(i, "type") == "function_call"]


async def responses_outputs(run: Caller, response: Any) -> list[dict[str, Any]]:
    """Run every function_call of response (concurrently); the function_call_output items, in order."""
    answers = await run_all(run, function_calls(response))
    return [{"type": "function_call_output", "call_id": a.id, "output": a.text} for a in answers]


def _message(completion: Any) -> Any:
    """The assistant message of a chat completion, a choice, or the message itself."""
    choices = field(completion, "choices")
    if choices:
        completion = choices[0]
    inner = field(completion, "message")
    return completion if inner is None else inner


def tool_calls(completion: Any) -> list[Requested]:
    """The tool_calls of a chat completion's first choice (or of a message)."""
    calls = field(_message(completion), "tool_calls") or []
    return [Requested(field(c, "id"), field(field(c, "function"), "name"),
                      parse_arguments(field(field(c, "function"), "arguments"))) for c in calls]


async def chat_messages(run: Caller, completion: Any) -> list[dict[str, Any]]:
    """Run every tool call of completion (concurrently); the role "tool" messages, in order."""
    answers = await run_all(run, tool_calls(completion))
    return [{"role": "tool", "tool_call_id": a.id, "content": a.text} for a in answers]
