"""The harness adapter seam: one small protocol, one implementation per file.

An adapter knows one headless coding CLI: how to start it, and how to read its
NDJSON event stream. Everything else (the process, its log, the timeout, the
diffstat, the result) is shared, in ``guilds_harness.run``.

Contract (``tests/test_harness_adapters.py`` runs one conformance suite over
every adapter in ``HARNESSES``):

- ``name`` is the short name the agent's config chooses; ``executable`` is the
  program looked up on the harness's PATH.
- ``argv(prompt, session_id)`` is pure. It starts with ``executable``, ends
  with ``"--", prompt`` so a prompt starting with "-" is never an option, and
  resumes ``session_id`` when one is given. It never carries a secret.
- ``environ()`` is the extra environment the harness needs (never a secret).
- ``unknown_session(session_id, env)`` is True when the adapter can tell
  before starting that the harness does not know the session (then nothing
  runs), False when it cannot tell or the session exists.
- ``parser()`` is a fresh ``EventParser``. ``feed(event)`` takes each event of
  the stream in order (a JSON object with a string "type"); its state stays
  bounded (no event is kept whole, only the last message). ``outcome()`` may
  be read at any point: after a timeout or a crash it still holds the session
  id and the last message seen.

The harness's stdin is closed; the prompt travels on argv, secrets only in the
environment the agent already has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol


@dataclass
class Outcome:
    """What a harness's event stream said.

    finished: its final event was seen (Claude Code: ``result``; Codex:
    ``turn.completed`` or ``turn.failed``); ok: that event reported success.
    """

    session_id: Optional[str] = None
    finished: bool = False
    ok: bool = False
    final_message: Optional[str] = None
    error: Optional[str] = None
    unknown_session: bool = False
    cost_usd: Optional[float] = None
    num_turns: Optional[int] = None
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None


class EventParser(Protocol):
    def feed(self, event: Dict[str, Any]) -> None: ...

    def outcome(self) -> Outcome: ...


class Adapter(Protocol):
    name: str
    executable: str

    def argv(self, prompt: str, session_id: Optional[str]) -> List[str]: ...

    def environ(self) -> Dict[str, str]: ...

    def unknown_session(self, session_id: str, env: Dict[str, str]) -> bool: ...

    def parser(self) -> EventParser: ...


UNKNOWN_SESSION_HINTS = (
    "no conversation found",
    "does not match any session",
    "no saved session",
    "session not found",
)
"""Phrases by which a harness says it does not know a session (lower case)."""


def says_unknown_session(text: str) -> bool:
    low = text.lower()
    return any(hint in low for hint in UNKNOWN_SESSION_HINTS)


def as_int(value: Any) -> Optional[int]:
    """An event's count field, or None when it is not a plain integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def as_object(value: Any) -> Dict[str, Any]:
    """An event's object field, or {} when it is not a JSON object."""
    return value if isinstance(value, dict) else {}
