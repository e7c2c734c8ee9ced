"""From a model response's tool calls to the tool results its next request needs.

    anthropic.tool_results(run, message)        Messages API: tool_use -> tool_result blocks
    openai.responses_outputs(run, response)     Responses API: function_call -> function_call_output items
    openai.chat_messages(run, completion)       Chat Completions: tool_calls -> role "tool" messages

``run`` is anything with ``async call(tool, args) -> CallResult``: a
``guilds.fronts.agent.Run`` (``agent.run(...)``). A response is the SDK's object or
the same thing as a plain dict (its JSON). The calls of one turn run
concurrently, each recorded in the run; the results come back in the order the
model asked. A call the toolbox refuses with an error (an unsafe run id aside,
which raises) comes back as an error result naming what was wrong. Arguments
that are not valid JSON (OpenAI sends them as a string) go to the toolbox as
sent, so the call is recorded and the model reads ``args: must be an object``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BadInput, GuildsError

__all__ = ["Answer", "Caller", "Requested", "field", "parse_arguments", "run_all"]


class Caller(Protocol):
    async def call(self, tool: str, args: Any) -> Any: ...


@dataclass(frozen=True)
class Requested:
    """One tool call a model asked for: its id in the model's API, the tool, the arguments."""

    id: str
    tool: str
    args: Any


@dataclass(frozen=True)
class Answer:
    """What came of one Requested call: the text the model reads, and whether it failed."""

    id: str
    text: str
    is_error: bool


def field(obj: Any, key: str, default: Any = None) -> Any:
    """obj[key] for a dict (a response's JSON), obj.key for an SDK object."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def parse_arguments(text: Any) -> Any:
    """OpenAI's arguments string as JSON; a string that is not JSON is returned as it is."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _answer(caller: Caller, req: Requested) -> Answer:
    try:
        result = await caller.call(req.tool, req.args)
    except BadInput:
        raise
    except GuildsError as exc:
        return Answer(req.id, str(exc), True)
    return Answer(req.id, result.text, result.is_error)


async def run_all(caller: Caller, requested: list[Requested]) -> list[Answer]:
    """Run a turn's calls concurrently; the answers in the order asked."""
    return list(await asyncio.gather(*(_answer(caller, req) for req in requested)))
