"""One template build: its state as E2B's build status tells it, and its run.

    build = Build(build_id, template_id, key_name, name)
    build.log(message)              an entry of its logs (E2B's ``BuildLogEntry``), bounded
    build.info(offset, limit)       E2B's ``TemplateBuildInfo``: status, the entries from offset
    raise StepFailed(message)       the step under way (``build.step``) failed: the build's error

A build goes ``waiting`` (requested), ``building`` (its steps run), then ``ready`` or
``error``; an error's ``reason`` names the step (``base``, ``1``..., ``finalize``) and why, as
E2B's build status does, and the SDKs raise it as a ``BuildException`` with that message.
Logs: an entry per step begun, the step's output (its last ``STEP_OUTPUT_BYTES``), each line an
entry, at most ``E2B_TEMPLATE_LOG_ENTRIES`` in all (the rest dropped, said once), each
message at most ``E2B_TEMPLATE_LOG_LINE_CHARS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...limits import E2B_TEMPLATE_LOG_ENTRIES, E2B_TEMPLATE_LOG_LINE_CHARS
from .template_steps import BASE_STEP

WAITING, BUILDING, READY, ERROR = "waiting", "building", "ready", "error"
STEP_OUTPUT_BYTES = 64 * 1024
"""What a step's output keeps for the logs: its last bytes (the step's pipe holds the rest off)."""
_RESERVED = 8
"""Entries kept back, past the bound, for the build's own last words (its end, its error)."""


class StepFailed(Exception):
    """The step under way cannot be served or failed: the build's error, naming it."""


@dataclass
class Build:
    id: str
    template_id: str
    key_name: str
    name: str
    status: str = WAITING
    step: str = BASE_STEP
    """The step under way: the one an error names."""
    tags: list[str] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    reason: dict[str, Any] | None = None
    _dropped: bool = False

    def log(self, message: str, level: str = "info", *, own: bool = False) -> None:
        """An entry of the logs; own: the build's own word (its end), kept past the bound."""
        room = E2B_TEMPLATE_LOG_ENTRIES - (0 if own else _RESERVED)
        if len(self.entries) >= room:
            if not self._dropped and len(self.entries) < E2B_TEMPLATE_LOG_ENTRIES:
                self._dropped = True
                self.entries.append(self._entry(f"... more output dropped: a build keeps {E2B_TEMPLATE_LOG_ENTRIES} "
                                                "log entries (E2B_TEMPLATE_LOG_ENTRIES)", "warn"))
            return
        self.entries.append(self._entry(message, level))

    def output(self, data: bytes) -> None:
        """A step's output, a log entry per line."""
        for line in data.decode("utf-8", "replace").splitlines():
            if line.strip():
                self.log(line)

    def _entry(self, message: str, level: str) -> dict[str, Any]:
        if len(message) > E2B_TEMPLATE_LOG_LINE_CHARS:
            message = message[:E2B_TEMPLATE_LOG_LINE_CHARS - 3] + "..."
        return {"timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"), "level": level,
                "message": message, "step": self.step}

    def fail(self, message: str) -> None:
        self.log(f"Build failed at step {self.step}: {message}", "error", own=True)
        self.reason = {"message": message, "step": self.step, "logEntries": self.entries[-10:]}
        self.status = ERROR

    def done(self) -> None:
        self.log("Build finished: the template is ready", own=True)
        self.status = READY

    def info(self, offset: int, limit: int) -> dict[str, Any]:
        entries = self.entries[offset:offset + limit]
        found: dict[str, Any] = {"templateID": self.template_id, "buildID": self.id, "status": self.status,
                 "logEntries": entries, "logs": [f"{e['timestamp']} {e['message']}" for e in entries]}
        if self.reason is not None:
            found["reason"] = self.reason
        return found
