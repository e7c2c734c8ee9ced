"""The log lines of calls and sandboxes: one a call, one a sandbox start or removal.

They go at INFO to the ``guilds.calls`` logger, with the fields in the record's
``event`` attribute; ``JsonLines`` writes a record as one JSON object a line
(``guilds serve --log-json``), else the message reads as text:

    call c0123456789ab shell ok 12 ms run=r1 agent=default recorded=yes trace=

A line holds the call id, the run, the agent, the tool's name as recorded
(redacted), the outcome, the duration and the trace id of the call's span
(``guilds.observe.traces``; empty while traces are off); never the call's
arguments or output.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..toolbox.observer import CallEnded

CALLS_LOGGER = "guilds.calls"
log = logging.getLogger(CALLS_LOGGER)


def call_line(ended: CallEnded) -> None:
    """One call's line (nothing is built when INFO is off for the logger)."""
    if not log.isEnabledFor(logging.INFO):
        return
    event = {"event": "call", "call_id": ended.call_id, "run": ended.run_id, "agent": ended.agent_id,
             "trace_id": ended.trace_id, "tool": ended.tool, "outcome": ended.outcome,
             "duration_ms": round(ended.seconds * 1000), "recorded": ended.recorded}
    log.info("call %s %s %s %d ms run=%s agent=%s recorded=%s trace=%s", ended.call_id, ended.tool,
             ended.outcome, event["duration_ms"], ended.run_id, ended.agent_id,
             "yes" if ended.recorded else "no", ended.trace_id, extra={"event": event})


def sandbox_line(what: str, agent_id: str, sandbox: str, seconds: float) -> None:
    """A sandbox's start (with its duration) or removal."""
    if not log.isEnabledFor(logging.INFO):
        return
    event = {"event": what, "agent": agent_id, "sandbox": sandbox, "duration_ms": round(seconds * 1000),
             "call_id": "", "run": "", "trace_id": ""}
    log.info("%s: agent=%s sandbox=%s %d ms", what, agent_id, sandbox, event["duration_ms"],
             extra={"event": event})


class JsonLines(logging.Formatter):
    """A log record as one JSON object: time, level, logger, message, and the line's event fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                                + f".{int(record.msecs):03d}Z",
                                "level": record.levelname.lower(), "logger": record.name,
                                "message": record.getMessage()}
        event = getattr(record, "event", None)
        if isinstance(event, dict):
            line.update(event)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)
