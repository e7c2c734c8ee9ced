"""What a toolbox tells whoever watches it: its calls, their stages, its sandbox, its egress.

    toolbox = Toolbox(settings, sandbox, store, observer=guilds.observe.metrics.Metrics())

The toolbox calls an ``Observer`` at one place per event: ``traced`` around
each call (its span, when traces are taken); ``timed(stage)`` around the
sandbox's start (``SANDBOX_START``), the request to the helper
(``HELPER``) and the result's write into the run record (``RECORD``);
``call_ended`` once per call, with what the call gave; ``sandbox_started``;
``egress`` with the egress proxy's decisions read at a call's end;
``record_error`` when the record could not take a call or its decisions.

This base observer writes the log lines only (``guilds.observe.log_lines``): one a
call, one a sandbox start, at INFO on the ``guilds.calls`` logger. No value of the
call's arguments or output is in them; the tool's name and the run id are the
redacted ones. Made with ``traces`` (``guilds.observe.traces``), it adds the
spans of each call and its stages, and the call's trace id to its log line.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..observe import log_lines

if TYPE_CHECKING:
    from ..observe.traces import CallTraces
    from .toolbox import Toolbox

SANDBOX_START, HELPER, RECORD = "sandbox_start", "helper", "record"
STAGES = (SANDBOX_START, HELPER, RECORD)
OK, ERROR, CANCELLED = "ok", "error", "cancelled"


@dataclass(frozen=True)
class CallEnded:
    """One call as it ended: who made it, what it was, how it went."""

    call_id: str
    run_id: str
    agent_id: str
    tool: str
    outcome: str
    """OK, ERROR (an error result) or CANCELLED."""
    seconds: float
    recorded: bool
    """False when the run record could not take the result."""
    trace_id: str = ""


_UNTIMED = contextlib.nullcontext()


class Observer:
    """The log lines of a toolbox's calls; ``guilds.observe.metrics.Metrics`` counts them too."""

    def __init__(self, traces: CallTraces | None = None) -> None:
        self.traces = traces
        """The spans of the calls (None: traces are off)."""

    def watch(self, toolbox: Toolbox) -> None:
        """A toolbox made with this observer (its sandbox's state is asked for at a scrape)."""

    def traced(self, call_id: str, tool: str) -> contextlib.AbstractContextManager[Any]:
        """A context around one call (``tool`` as recorded): its span, when traces are taken."""
        return _UNTIMED if self.traces is None else self.traces.call(call_id, tool)

    def timed(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        """A context around one stage of a call: its timer, inside its span when traces are taken."""
        timer = self.stage_timer(stage)
        return timer if self.traces is None else self.traces.stage(stage, timer)

    def stage_timer(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        """A context that times one stage of a call; this one times nothing."""
        return _UNTIMED

    def call_ended(self, ended: CallEnded) -> None:
        if self.traces is not None:
            ended = self.traces.call_ended(ended)
        log_lines.call_line(ended)

    def sandbox_started(self, agent_id: str, sandbox: str, seconds: float) -> None:
        log_lines.sandbox_line("sandbox started", agent_id, sandbox, seconds)

    def sandbox_removed(self, agent_id: str, sandbox: str) -> None:
        log_lines.sandbox_line("sandbox removed", agent_id, sandbox, 0.0)

    def egress(self, decisions: list[dict[str, Any]]) -> None:
        """The egress proxy's decisions read at a call's end (each with ``allowed``)."""

    def record_error(self, what: str) -> None:
        """The run record could not take ``what`` (``call`` or ``egress``)."""


NO_OBSERVER = Observer()

