"""The answers `guilds mcp` gives before the MCP SDK has loaded: the opening requests
of a connection, from data made without the SDK (stdlib and the tool registry only).

    answers = QuickAnswers(coding)          coding: the live coding flag (Wired.coding)
    answers.answer(line) -> bytes | None    the response line, or None: the SDK answers it

Loading the SDK takes a second or more on a busy machine, and clients do not all
wait for a server that has not answered yet (Claude Code starts its session
without the tools of a server still "pending"). The stdio relay
(``guilds.fronts.mcp_stdio``) asks these answers first while the SDK loads, then
hands the SDK the whole stream, answered requests included; the SDK's own
answers to those are compared with what was sent and dropped.

What is answered here, and only in exactly these shapes (anything else, and
everything after the first request answered elsewhere, is the SDK's):

- the handshake era (the first request is ``initialize``): ``initialize`` with
  a protocol version, the client's capabilities and its info; after it,
  ``tools/list``, ``prompts/list``, ``resources/list`` and ``ping`` with no
  parameters;
- the 2026-07-28 revision (the first request carries the per-request envelope
  in its ``_meta``): ``server/discover``, ``tools/list``, ``prompts/list`` and
  ``resources/list`` whose only parameter is the envelope.

Each answer is the SDK's, byte for byte: its results' keys in the order it
writes them (sorted, ``_meta`` last; a tool's schema as the registry holds it),
compact JSON, non-ASCII as is. ``tools/list`` is ``guilds tools --format mcp``
(``formats.to_mcp``) of the tools offered now.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

SERVER_NAME = "guilds"
INSTRUCTIONS = (
    "Code tools running inside an agent's sandbox: shell (tests, builds, git), shell_status "
    "(background commands), file_read, code_search, code_task. One session is one run: a cd "
    "carries over to the next shell call. A result that starts with a run line (run: mcp-...) "
    "names its run: pass that id as the run argument of the next calls to stay in it."
)
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The revisions the SDK negotiates through ``initialize`` (mcp_types.version), oldest first:
a version it does not know is answered with the newest."""
MODERN_VERSION = "2026-07-28"
"""The per-request-envelope revision the SDK serves (mcp_types.version.MODERN_PROTOCOL_VERSIONS)."""
ENVELOPE_VERSION = "io.modelcontextprotocol/protocolVersion"
ENVELOPE_CLIENT = "io.modelcontextprotocol/clientInfo"
ENVELOPE_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CHECKPOINTS_EXTENSION = "dev.guilds/checkpoints"
SERVER_EXTENSIONS = (TASKS_EXTENSION, CHECKPOINTS_EXTENSION)
"""The extensions the server offers, by identifier, in the order it advertises them: the SDK
server (guilds.fronts.mcp_server) is made with these, and the early answers advertise these."""

HANDSHAKE, MODERN = "handshake", "modern"
"""A connection's era, decided by its first request as the SDK decides it."""


def server_version() -> str:
    """guilds' version as the server names itself (the package's own: no lookup of the
    installed distributions, a tenth of the way to the first answer on a busy machine)."""
    import guilds

    return guilds.__version__


def _capabilities(modern: bool) -> dict[str, Any]:
    listed = {"prompts": {"listChanged": False}, "resources": {"listChanged": False, "subscribe": False},
              "tools": {"listChanged": False}}
    return {"extensions": {identifier: {} for identifier in SERVER_EXTENSIONS}, **listed} if modern else listed


def _is_text_map(value: Any, required: tuple[str, ...], optional: tuple[str, ...]) -> bool:
    """A JSON object of strings holding every required key and no key outside the two lists."""
    return (isinstance(value, dict) and all(key in value for key in required)
            and all(key in required + optional and isinstance(item, str) for key, item in value.items()))


def _is_flag_map(value: Any, flags: tuple[str, ...]) -> bool:
    """A JSON object whose keys are among flags, each a boolean."""
    return isinstance(value, dict) and all(key in flags and isinstance(item, bool) for key, item in value.items())


def _is_object_map(value: Any, keys: tuple[str, ...] | None = None) -> bool:
    """A JSON object of JSON objects (keys among keys when given)."""
    return isinstance(value, dict) and all(
        isinstance(item, dict) and (keys is None or key in keys) for key, item in value.items())


CLIENT_INFO_OPTIONAL = ("title", "description", "websiteUrl")
CAPABILITY_CHECKS: dict[str, Callable[[Any], bool]] = {
    "roots": lambda value: _is_flag_map(value, ("listChanged",)),
    "elicitation": lambda value: _is_object_map(value, ("form", "url")) and all(not v for v in value.values()),
    "sampling": lambda value: _is_object_map(value, ("context", "tools")) and all(not v for v in value.values()),
    "experimental": _is_object_map,
    "extensions": _is_object_map,
}
"""The client capabilities taken as plainly valid, by name: anything else goes to the SDK."""


def plain_client(info: Any, capabilities: Any) -> bool:
    """The client's info and capabilities are of the shapes the SDK surely accepts."""
    return (_is_text_map(info, ("name", "version"), CLIENT_INFO_OPTIONAL) and isinstance(capabilities, dict)
            and all(name in CAPABILITY_CHECKS and CAPABILITY_CHECKS[name](value)
                    for name, value in capabilities.items()))


def response_line(request_id: Any, result: dict[str, Any]) -> bytes:
    """One JSON-RPC response as the SDK's stdio transport writes it, newline included."""
    message = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _listed(key: str, items: list[dict[str, Any]], modern: bool) -> dict[str, Any]:
    """A list result: the modern revision's cache hints and result type around it."""
    if not modern:
        return {key: items}
    return dict(sorted({"cacheScope": "private", key: items, "resultType": "complete", "ttlMs": 0}.items()))


HANDSHAKE_SCHEMA_FIELDS = ("$schema", "properties", "required", "type")
"""The input schema's keys the handshake era's wire model declares, in its order; the others follow as given."""


def _handshake_schema(schema: dict[str, Any]) -> dict[str, Any]:
    declared = {key: schema[key] for key in HANDSHAKE_SCHEMA_FIELDS if key in schema}
    return {**declared, **{key: value for key, value in schema.items() if key not in declared}}


def _tool(tool: Any, modern: bool) -> dict[str, Any]:
    """A tool as tools/list writes it: to_mcp's keys and its annotations' sorted; its schema as
    the registry holds it (modern) or in the handshake era's model's order."""
    from ..toolbox.tools.formats import to_mcp

    served = to_mcp(tool)
    schema = served["inputSchema"] if modern else _handshake_schema(served["inputSchema"])
    annotations = dict(sorted(served["annotations"].items()))
    return dict(sorted({**served, "inputSchema": schema, "annotations": annotations}.items()))


class QuickAnswers:
    """The opening requests' answers; see the module docstring for which."""

    def __init__(self, coding: Callable[[], bool], version: str | None = None):
        self.coding = coding
        self.version = server_version() if version is None else version
        self.era: str | None = None
        self.initialized = False
        self.open = True
        """False once a request went to the SDK: from then on it answers every request."""

    def answer(self, line: bytes) -> bytes | None:
        """The response line to one line from the client, or None (a notification,
        or a request the SDK answers). Never raises on what a client sends."""
        if not self.open:
            return None
        try:
            message = json.loads(line)
        except ValueError:
            self.open = False
            return None
        if isinstance(message, dict) and "id" not in message and isinstance(message.get("method"), str):
            return None  # a notification: the SDK acts on it as it is replayed
        try:
            result = self._result(message) if isinstance(message, dict) and message.get("jsonrpc") == "2.0" else None
        except Exception:  # noqa: BLE001 - the settings file turned bad: the SDK's answer says so
            result = None
        if result is None:
            self.open = False
            return None
        return response_line(message["id"], result)

    def _result(self, message: dict[str, Any]) -> dict[str, Any] | None:
        request_id, method, params = message.get("id"), message.get("method"), message.get("params")
        if (not isinstance(request_id, (str, int)) or isinstance(request_id, bool) or not isinstance(method, str)
                or set(message) - {"jsonrpc", "id", "method", "params"}):
            return None
        if self.era is None:
            self.era = MODERN if method != "initialize" and _envelope(params) is not None else HANDSHAKE
        if self.era == MODERN:
            return self._modern(method, params)
        return self._handshake(method, params)

    def _handshake(self, method: str, params: Any) -> dict[str, Any] | None:
        if method == "initialize":
            return self._initialize(params)
        if not self.initialized or params not in (None, {}):
            return None
        if method == "ping":
            return {}
        return self._list(method, modern=False)

    def _initialize(self, params: Any) -> dict[str, Any] | None:
        if (self.initialized or not isinstance(params, dict)
                or set(params) != {"protocolVersion", "capabilities", "clientInfo"}
                or not isinstance(params["protocolVersion"], str)
                or not plain_client(params["clientInfo"], params["capabilities"])):
            return None
        self.initialized = True
        requested = params["protocolVersion"]
        version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        return {"capabilities": _capabilities(modern=False), "instructions": INSTRUCTIONS,
                "protocolVersion": version, "serverInfo": self._server_info()}

    def _modern(self, method: str, params: Any) -> dict[str, Any] | None:
        envelope = _envelope(params)
        if (envelope is None or set(params) != {"_meta"} or envelope.get(ENVELOPE_VERSION) != MODERN_VERSION
                or set(envelope) != {ENVELOPE_VERSION, ENVELOPE_CLIENT, ENVELOPE_CAPABILITIES}
                or not plain_client(envelope[ENVELOPE_CLIENT], envelope[ENVELOPE_CAPABILITIES])):
            return None
        if method == "server/discover":
            result: dict[str, Any] | None = {
                "cacheScope": "private", "capabilities": _capabilities(modern=True), "instructions": INSTRUCTIONS,
                "resultType": "complete", "supportedVersions": [MODERN_VERSION], "ttlMs": 0}
        else:
            result = self._list(method, modern=True)
        return None if result is None else {**result, "_meta": {SERVER_INFO_KEY: self._server_info()}}

    def _list(self, method: str, modern: bool) -> dict[str, Any] | None:
        if method == "tools/list":  # the registry loads here: after the opening request's answer
            from ..toolbox.tools import TOOLS

            return _listed("tools", [_tool(tool, modern) for tool in TOOLS] if self.coding() else [], modern)
        if method in ("prompts/list", "resources/list"):
            return _listed(method.partition("/")[0], [], modern)
        return None

    def _server_info(self) -> dict[str, str]:
        return {"name": SERVER_NAME, "version": self.version}


def _envelope(params: Any) -> dict[str, Any] | None:
    """The request's 2026-07-28 envelope (its ``_meta`` naming a protocol version), or None."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) and ENVELOPE_VERSION in meta else None
