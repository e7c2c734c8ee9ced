"""Codex CLI: ``codex exec --json``; resume with ``codex exec resume <id>``.

Stream (one JSON object a line): ``thread.started`` (``thread_id``: the
session id), ``turn.started``, ``item.started`` / ``item.updated`` /
``item.completed`` (``item.type`` one of ``agent_message`` with ``text``,
``reasoning``, ``command_execution``, ``file_change``, ``mcp_tool_call``,
``web_search``, ``todo_list``, ``error``), then ``turn.completed`` (``usage``:
``input_tokens``, ``cached_input_tokens``, ``output_tokens``) or
``turn.failed`` (``error.message``); ``error`` (``message``) for stream-level
errors. Codex reports no cost. The final message is the last agent_message.

Sessions are rollout files ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``
(CODEX_HOME defaults to ~/.codex); ``codex exec resume`` with an id it cannot
find starts a new session instead of failing, so the adapter looks for the
rollout file first.

Approvals and Codex's own sandbox are off (``--dangerously-bypass-approvals-and-sandbox``):
nobody can approve in a headless run, and the agent's sandbox is the boundary
(Codex's Landlock sandbox often cannot start inside a container anyway).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .contract import Outcome, as_int, as_object, as_text, says_unknown_session

SESSION_FOLDERS = ("sessions", "archived_sessions")


class CodexParser:
    def __init__(self) -> None:
        self._out = Outcome()

    def feed(self, event: Dict[str, Any]) -> None:
        out = self._out
        kind = event.get("type")
        if kind in ("thread.started", "thread.resumed"):
            out.session_id = as_text(event.get("thread_id")) or out.session_id
        elif kind == "item.completed":
            item = as_object(event.get("item"))
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                out.final_message = item["text"]
        elif kind == "turn.completed":
            out.finished, out.ok, out.error = True, True, None
            out.num_turns = (out.num_turns or 0) + 1
            self._usage(event.get("usage"))
        elif kind == "turn.failed":
            out.finished, out.ok = True, False
            error = as_object(event.get("error"))
            out.error = as_text(error.get("message")) or "turn failed"
            self._usage(event.get("usage"))
        elif kind == "error":
            out.error = as_text(event.get("message")) or "error"
            out.unknown_session = out.unknown_session or says_unknown_session(out.error)

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in ("input_tokens", "output_tokens"):
            value = as_int(usage.get(key))
            if value is not None:
                setattr(self._out, key, (getattr(self._out, key) or 0) + value)

    def outcome(self) -> Outcome:
        return self._out


class Codex:
    name = "codex"
    executable = "codex"

    def argv(self, prompt: str, session_id: Optional[str]) -> List[str]:
        argv = [self.executable, "exec", "--json", "--skip-git-repo-check"]
        argv.append("--dangerously-bypass-approvals-and-sandbox")
        if session_id:
            argv += ["resume", session_id]
        return argv + ["--", prompt]

    def environ(self) -> Dict[str, str]:
        return {}

    def unknown_session(self, session_id: str, env: Dict[str, str]) -> bool:
        root = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or "/", ".codex")
        suffix = f"-{session_id}.jsonl"
        for folder in SESSION_FOLDERS:
            for _, _, files in os.walk(os.path.join(root, folder)):
                if any(name.endswith(suffix) for name in files):
                    return False
        return True

    def parser(self) -> CodexParser:
        return CodexParser()


ADAPTER = Codex()
