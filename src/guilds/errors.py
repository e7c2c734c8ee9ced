"""The orchestrator's errors, one root, a shallow tree.

    GuildsError
    ├── ConfigError       the agent's settings (or a command's input) are wrong;
    │                     the message names the key, e.g. ``agent.sandbx``
    ├── HelperFailed      the helper printed no envelope: "code helper failed"
    │                     and the last lines of its stderr
    ├── SandboxError      the sandbox could not start, run or write
    ├── BudgetExhausted   the run has made all the tool calls it may make
    ├── BadInput          a caller's input refused before any call (a run id
    │                     that is not a safe file name, ...)
    └── RecordError       the run record or the data folder could not be
                          written (a full disk): one line saying what

A toolbox call turns HelperFailed and SandboxError into an error result in
exactly one place (``guilds.toolbox.toolbox``); fronts turn the others into a
message and an exit code.
"""

from __future__ import annotations


class GuildsError(Exception):
    """The root of every error the orchestrator raises on purpose."""


class ConfigError(GuildsError):
    """Bad settings: the message names the key (``agent.ports: ...``)."""


class HelperFailed(GuildsError):
    """The helper printed no envelope; the message quotes its stderr's tail."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class SandboxError(GuildsError):
    """The sandbox could not start, run a process or write a file."""


class BudgetExhausted(GuildsError):
    """The run has no tool calls left (``max_tool_calls``)."""


class BadInput(GuildsError):
    """A caller's input refused before any call was made (e.g. a bad run id)."""


class RecordError(GuildsError):
    """The run record, the data folder or a file in it could not be written or read
    (a full disk, a folder not ours): the message names what, in one line."""
