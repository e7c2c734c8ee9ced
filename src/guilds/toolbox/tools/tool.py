"""What a tool is: the one object every part of guilds asks about a tool.

A ``Tool`` holds what a model sees (name, description, input schema) and
answers every question the toolbox, the transport and the fronts have about a
call of it, so none of them names a tool:

    check(args)       the arguments checked as the helper will (RequestError if bad)
    wait(args)        how long the orchestrator waits for the helper's answer
    rerunnable(args)  whether the call may run once more when the resident helper
                      died under it: only a call that changes nothing
    extra_fields(site)  the request fields the tool adds (file_read's read ledger,
                      code_task's harness and repositories) and how a pointer's
                      savings are measured
    failed(meta)      whether a result the helper gave counts as an error result
    task(args)        whether the call becomes an MCP task, and of which kind
    hints             the MCP annotations (title, read-only, destructive, ...)

One instance per tool, in a module of its own beside this one; the registry
(``guilds.toolbox.tools``) lists them in the product page's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from guilds_code import limits
from guilds_code.protocol import REQUIRED, Request, validate_args

from ...sandbox.helpers import CODE_HELPER

if TYPE_CHECKING:
    from ...config.settings import AgentSettings
    from ...record.store import Store

TASK_COMMAND = "command"
"""``Tool.task``: the call starts a background command, and the task follows the command."""
TASK_CALL = "call"
"""``Tool.task``: a call still running after MCP_TASK_AFTER_SECONDS goes on as a task."""


@dataclass(frozen=True)
class Hints:
    """The truthful MCP annotations of one tool (annotations are per tool, not per call)."""

    title: str
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool


@dataclass(frozen=True)
class CallSite:
    """What a tool may look at to add to its request: the call's run and seq, the run
    record, the agent's settings, and each repository's folder as the sandbox sees it."""

    run_id: str
    seq: int
    store: Store
    settings: AgentSettings
    repos: dict[str, str]


def _no_pointer(meta: Mapping[str, Any]) -> int | None:
    return None


@dataclass(frozen=True)
class Extra:
    """What a tool adds to one call: ``fields``, keyword arguments of its request type
    (``Tool.request_type``); ``pointed_bytes(meta)``, the size of the earlier result a
    pointer result points to (None for any other result)."""

    fields: dict[str, Any] = field(default_factory=dict)
    pointed_bytes: Callable[[Mapping[str, Any]], int | None] = _no_pointer


def valid_int(value: Any, lo: int, hi: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


@dataclass(frozen=True)
class Tool:
    """One tool (see the module docstring). The defaults are a check tool's of guilds-code:
    checked by ``guilds_code.protocol.validate_args``, a wait of OP_WAIT_SECONDS, not
    rerunnable, nothing extra, failed only when the helper refuses, never a task."""

    name: str
    description: str
    input_schema: dict[str, Any]
    hints: Hints
    helper: str = CODE_HELPER
    """The one-file helper that runs it inside the sandbox."""
    request_type: type[Request] = Request
    """The request it is sent as (``guilds_code.protocol.Request`` or a subclass the helper parses)."""

    def check(self, args: Any) -> Any:
        """args checked as the helper will check them (RequestError if bad)."""
        return validate_args(self.name, args)

    def wait(self, args: Any) -> float:
        """Seconds to wait for the helper, from the checked args. A value the helper
        refuses counts as its default: the refusal comes at once."""
        return float(limits.OP_WAIT_SECONDS)

    def rerunnable(self, args: Any) -> bool:
        """True when a call with these (checked) args changes nothing, so it may run once
        more when the resident helper died while it ran."""
        return False

    async def extra_fields(self, site: CallSite) -> Extra:
        """The fields this call's request carries beyond the common ones."""
        return Extra()

    def failed(self, meta: Mapping[str, Any]) -> bool:
        """True when a result the helper gave (with this metadata) is an error result."""
        return False

    def task(self, args: Mapping[str, Any]) -> str | None:
        """TASK_COMMAND, TASK_CALL, or None: how a call with the client's args becomes an MCP task."""
        return None

    def checkpoint_moments(self) -> tuple[str, ...]:
        """When a checkpoint of the home is taken around a call (agent.checkpoints): "before"
        it is sent, "after" it answered; none for a tool that changes no file."""
        return ()


# --- the check tools' schemas, from the helper's own table ---------------------
_TYPES = {"str": "string", "int": "integer", "bool": "boolean"}


def _property(kind: str, default: Any, extra: Any, description: str) -> dict[str, Any]:
    prop: dict[str, Any] = {"type": _TYPES[kind], "description": description}
    if default is not REQUIRED and default is not None:
        prop["default"] = default
    if kind == "int" and extra:
        prop["minimum"] = extra[0]
        if extra[1] < 2**63 - 1:
            prop["maximum"] = extra[1]
    elif kind == "str" and extra:
        prop["enum"] = list(extra)
    return prop


def arg_schema(specs: Mapping[str, tuple[str, Any, Any]], descriptions: Mapping[str, str]) -> dict[str, Any]:
    """The JSON Schema of a check tool's arguments from its ``ARG_SPECS`` entry, so
    names, defaults and ranges cannot drift from what the helper accepts."""
    props = {
        name: _property(kind, default, extra, descriptions[name])
        for name, (kind, default, extra) in specs.items()
    }
    required = [name for name, (_, default, _) in specs.items() if default is REQUIRED]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}
