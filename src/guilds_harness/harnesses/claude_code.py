"""Claude Code: ``claude -p --output-format stream-json --verbose``.

Stream (one JSON object a line): ``system`` (subtype ``init`` carries
``session_id``), ``assistant`` and ``user`` messages, ``system`` notices
(``api_retry``...), and last one ``result``: ``subtype`` (``success``,
``error_max_turns``, ``error_during_execution``...), ``is_error``, ``result``
(the final message), ``session_id``, ``total_cost_usd``, ``num_turns``,
``usage``, and on failure ``errors`` (a list of strings). An unknown
``--resume`` id ends at once with a result whose errors say "No conversation
found with session ID: ..." (or, for a value that is not a UUID, "does not
match any session title").

Permissions: nobody can answer a prompt in a headless run, so it runs with
``--dangerously-skip-permissions``; the agent's sandbox is the boundary.
``IS_SANDBOX=1`` tells Claude Code so, which it requires to allow that as root.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .contract import Outcome, as_int, as_object, as_text, says_unknown_session


class ClaudeCodeParser:
    def __init__(self) -> None:
        self._out = Outcome()

    def feed(self, event: Dict[str, Any]) -> None:
        out = self._out
        session = as_text(event.get("session_id"))
        if session:
            out.session_id = session
        kind = event.get("type")
        if kind == "assistant":
            text = _message_text(event.get("message"))
            if text:
                out.final_message = text
        elif kind == "result":
            self._result(event)

    def _result(self, event: Dict[str, Any]) -> None:
        out = self._out
        out.finished = True
        out.ok = event.get("is_error") is False and event.get("subtype") == "success"
        result = as_text(event.get("result"))
        if result is not None:
            out.final_message = result
        errors = [e for e in event.get("errors") or [] if isinstance(e, str)]
        if not out.ok:
            out.error = "; ".join(errors) or result or f"result: {event.get('subtype')}"
            out.unknown_session = any(says_unknown_session(e) for e in errors)
        cost = event.get("total_cost_usd")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            out.cost_usd = float(cost)
        out.num_turns = as_int(event.get("num_turns"))
        usage = as_object(event.get("usage"))
        out.input_tokens = as_int(usage.get("input_tokens"))
        out.output_tokens = as_int(usage.get("output_tokens"))

    def outcome(self) -> Outcome:
        return self._out


def _message_text(message: Any) -> Optional[str]:
    """The text blocks of an assistant message, joined; None when it has none."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return None
    texts = [
        block["text"]
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
    ]
    return "\n".join(texts) if texts else None


class ClaudeCode:
    name = "claude-code"
    executable = "claude"

    def argv(self, prompt: str, session_id: Optional[str]) -> List[str]:
        argv = [self.executable, "-p", "--output-format", "stream-json", "--verbose"]
        argv.append("--dangerously-skip-permissions")
        if session_id:
            argv.append(f"--resume={session_id}")
        return argv + ["--", prompt]

    def environ(self) -> Dict[str, str]:
        return {"IS_SANDBOX": "1"}

    def unknown_session(self, session_id: str, env: Dict[str, str]) -> bool:
        return False  # Claude Code says so itself, in its result event

    def parser(self) -> ClaudeCodeParser:
        return ClaudeCodeParser()


ADAPTER = ClaudeCode()
