"""The orchestrator's errors, one root, a shallow tree.

    GuildsError
    ├── ConfigError       the agent's settings (or a command's input) are wrong;
    │                     the message names the key, e.g. ``agent.sandbx``
    ├── HelperFailed      the helper printed no envelope: "code helper failed"
    │                     and the last lines of its stderr
    ├── SandboxError      the sandbox could not start, run or write
    ├── NoAnswer          a request sent to the helper got no envelope back:
    │                     HelperFailed or SandboxError, mapped once, where
    │                     requests leave (``Toolbox.send``)
    ├── BadInput          a caller's input refused before any call (a run id
    │                     that is not a safe file name, ...)
    └── RecordError       the run record or the data folder could not be
                          written (a full disk): one line saying what

``Toolbox.send``, the one door to the helper, maps HelperFailed and
SandboxError to NoAnswer; a tool call turns NoAnswer into an error result in
exactly one place (``guilds.toolbox.toolbox``); fronts turn the others into a
message and an exit code. A call past the run's budget is no error: it gets
an error result (``BUDGET_REFUSED``) and runs nothing.
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


class NoAnswer(GuildsError):
    """A request sent to the helper got no envelope back (``Toolbox.send`` maps it once).

    ``reason``: the text of the error mapped (HelperFailed's or SandboxError's);
    the message is what a tool result says: HelperFailed's own text, or
    ``sandbox error: <reason>``.
    """

    def __init__(self, reason: str, *, sandbox: bool):
        super().__init__(f"sandbox error: {reason}" if sandbox else reason)
        self.reason = reason


class BadInput(GuildsError):
    """A caller's input refused before any call was made (e.g. a bad run id)."""


class RecordError(GuildsError):
    """The run record, the data folder or a file in it could not be written or read
    (a full disk, a folder not ours): the message names what, in one line."""
