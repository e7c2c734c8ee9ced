"""The wire protocol between the orchestrator and the helper, defined once.

Request (orchestrator -> helper): ``python3 -I -S guilds-code ARG`` where ARG is
base64 (standard alphabet, validated) of UTF-8 JSON, or the absolute path of a
request file (``*.json``) under ``<state root>/requests/`` that the helper reads and then
deletes, also when the request inside it is bad. Fields:

    op          "shell" | "shell_status" | "file_read" | "code_search" | "log_read"
                (log_read serves the app's Full output log; no tool of the model)
    args        the tool's arguments as the model gave them (validated here)
    run_id, agent_id, call_id
                names that become file names: [A-Za-z0-9._-], at most 128, no ".."
    home        absolute path of the agent's home
    cwd         the run's default working directory, absolute (default: home)
    max_bytes   the result's byte cap (default 8192, at least 1024)
    seq         the message seq this call's result will have (default 0)
    reads       file_read only: earlier reads that may be pointed to, each
                {"path", "range": [a, b], "content_hash", "seq"}
    redact_env  names of environment variables whose values are secrets; the
                helper replaces them (and the repository tokens of repos.json)
                by [REDACTED] before it clips anything, so no clip can cut a
                secret in two. Names only: values never travel on a command line.
    started_by  shell_status with an id only, optional: the call id of the shell
                call that started the command asked about (a name, as call_id).
                The answer is about that command only: a record bN started by
                another call (a later sandbox's bN) is never read nor signalled,
                and the command reads ``ended`` (ops/shell_status.py). For
                callers that follow a command outside the model's calls.

Envelope (helper -> orchestrator): exactly one line on stdout, base64 of UTF-8
JSON, ``{"ok": true, "text": str, "meta": {...}}`` or
``{"ok": false, "error": "one line"}``; the helper exits 0 whenever it printed one.
"""

from __future__ import annotations

import binascii
import os
import stat

from . import codec, limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

OPS = ("shell", "shell_status", "file_read", "code_search", "log_read")
"""log_read serves the app's Full output log: it is no tool of the model."""
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_CHARS = _ALNUM | frozenset("._-")
_ENV_NAME_CHARS = _ALNUM | frozenset("_")
_DIGITS = frozenset("0123456789")


class RequestError(Exception):
    """A malformed request: the message is one line that names the field."""


class OpError(Exception):
    """An op could not do what was asked (missing file, path outside the home...).

    Turned into ``{"ok": false, "error": message}`` in exactly one place.
    """


class Reply:
    """What an op returns: the shaped text and the call's metadata."""

    __slots__ = ("text", "meta")

    def __init__(self, text: str, meta: Optional[Dict[str, Any]] = None):
        self.text = text
        self.meta = {} if meta is None else meta

    def __repr__(self) -> str:
        return f"Reply(text={self.text!r}, meta={self.meta!r})"


class Request:
    """One validated request (see the module docstring for the fields)."""

    __slots__ = ("op", "args", "run_id", "agent_id", "call_id", "home", "cwd",
                 "max_bytes", "seq", "reads", "redact_env", "started_by")

    def __init__(
        self, op: str, args: Dict[str, Any], run_id: str, agent_id: str, call_id: str,
        home: str, cwd: str, max_bytes: int = limits.DEFAULT_MAX_BYTES, seq: int = 0,
        reads: Optional[List[Dict[str, Any]]] = None, redact_env: Optional[List[str]] = None,
        started_by: Optional[str] = None,
    ):
        self.op = op
        self.args = args
        self.run_id = run_id
        self.agent_id = agent_id
        self.call_id = call_id
        self.home = home
        self.cwd = cwd
        self.max_bytes = max_bytes
        self.seq = seq
        self.reads = [] if reads is None else reads
        self.redact_env = [] if redact_env is None else redact_env
        self.started_by = started_by

    def wire(self) -> Dict[str, Any]:
        """The request as the orchestrator sends it, what ``parse_request`` reads back:
        every field, ``reads`` only for file_read, ``started_by`` only when set."""
        out = {name: getattr(self, name) for name in Request.__slots__}
        if self.op != "file_read":
            del out["reads"]
        if out["started_by"] is None:
            del out["started_by"]
        return out


def is_safe_name(value: Any) -> bool:
    """True when value can name a file: [A-Za-z0-9][A-Za-z0-9._-]*, at most
    limits.NAME_MAX_CHARS, no '..'. The rule for run, agent and call ids."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= limits.NAME_MAX_CHARS
        and value[0] in _ALNUM
        and _NAME_CHARS.issuperset(value)
        and ".." not in value
    )


def is_env_name(value: Any) -> bool:
    """True for an environment variable name: [A-Za-z_][A-Za-z0-9_]*."""
    return (
        isinstance(value, str)
        and value != ""
        and value[0] not in _DIGITS
        and _ENV_NAME_CHARS.issuperset(value)
    )


def is_background_id(value: str) -> bool:
    """True for b1 ... b999999999."""
    return 2 <= len(value) <= 10 and value[0] == "b" and value[1] != "0" and _DIGITS.issuperset(value[1:])


# --- argument specs: (type, default, (min, max) or choices) -----------------
# type is one of "str", "int", "bool"; REQUIRED marks a required argument.
REQUIRED = object()

ARG_SPECS: Dict[str, Dict[str, Tuple[str, Any, Any]]] = {
    "shell": {
        "command": ("str", REQUIRED, None),
        "timeout_seconds": (
            "int",
            limits.SHELL_TIMEOUT_DEFAULT,
            (limits.SHELL_TIMEOUT_MIN, limits.SHELL_TIMEOUT_MAX),
        ),
        "background": ("bool", False, None),
    },
    "shell_status": {
        "id": ("str", None, None),
        "stop": ("bool", False, None),
        "wait": ("int", None, (limits.STATUS_WAIT_MIN, limits.STATUS_WAIT_MAX)),
        "until": ("str", None, None),
    },
    "file_read": {
        "path": ("str", REQUIRED, None),
        "offset": ("int", 1, (1, 2**63 - 1)),
        "limit": ("int", limits.READ_LIMIT_DEFAULT, (1, limits.READ_LIMIT_MAX)),
    },
    "code_search": {
        "pattern": ("str", REQUIRED, None),
        "path": ("str", None, None),
        "glob": ("str", None, None),
        "mode": ("str", "files", ("files", "content")),
        "fixed": ("bool", False, None),
        "ignore_case": ("bool", False, None),
        "context": ("int", 0, (0, limits.SEARCH_CONTEXT_MAX)),
        "limit": (
            "int",
            None,
            (1, max(limits.SEARCH_FILES_MAX, limits.SEARCH_LINES_MAX)),
        ),
    },
}

OP_ARG_SPECS: Dict[str, Dict[str, Tuple[str, Any, Any]]] = {
    "log_read": {
        "path": ("str", REQUIRED, None),
    },
}
"""The arguments of the ops that are no tool of the model (no schema is made of them)."""


def show(value: Any) -> str:
    """value as JSON for an error message, at most 40 characters."""
    import json  # only on the way to an error

    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def check_int(name: str, value: Any, bounds: Tuple[int, int]) -> int:
    """An integer (or a float with an integer value) within bounds, inclusive."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name}: must be an integer, got {show(value)}")
    if isinstance(value, float):
        import math  # only for a float

        if not math.isfinite(value) or value != int(value):
            raise RequestError(f"{name}: must be an integer, got {show(value)}")
        value = int(value)
    lo, hi = bounds
    if not lo <= value <= hi:
        span = f"at least {lo}" if hi >= 2**63 - 1 else f"from {lo} to {hi}"
        raise RequestError(f"{name}: must be {span}, got {value}")
    return value


def check_str(name: str, value: Any, choices: Any) -> str:
    """A string without NUL, one of choices when they are given."""
    if not isinstance(value, str):
        raise RequestError(f"{name}: must be a string, got {show(value)}")
    if "\x00" in value:
        raise RequestError(f"{name}: must not contain a NUL character")
    if choices and value not in choices:
        allowed = " or ".join(repr(c) for c in choices)
        raise RequestError(f"{name}: must be {allowed}, got {show(value)}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{name}: must be true or false, got {show(value)}")
    return value


def validate_args(op: str, args: Any) -> Dict[str, Any]:
    """Check a tool's arguments against ARG_SPECS; fill defaults.

    A null value counts as absent. Unknown arguments are refused by name.
    """
    if not isinstance(args, dict):
        raise RequestError(f"args: must be an object, got {show(args)}")
    specs = ARG_SPECS[op] if op in ARG_SPECS else OP_ARG_SPECS[op]
    for key in args:
        if key not in specs:
            known = ", ".join(specs)
            raise RequestError(f"{key}: unknown argument for {op} (known: {known})")
    out: Dict[str, Any] = {}
    for name, (kind, default, extra) in specs.items():
        value = args.get(name)
        if value is None:
            if default is REQUIRED:
                raise RequestError(f"{name}: required by {op}")
            out[name] = default
            continue
        if kind == "int":
            out[name] = check_int(name, value, extra)
        elif kind == "bool":
            out[name] = check_bool(name, value)
        else:
            out[name] = check_str(name, value, extra)
    _check_op_rules(op, out)
    return out


def _check_op_rules(op: str, args: Dict[str, Any]) -> None:
    if op == "shell":
        if not args["command"].strip():
            raise RequestError("command: must not be empty")
        if len(args["command"]) > limits.COMMAND_MAX_CHARS:
            raise RequestError(
                f"command: longer than {limits.COMMAND_MAX_CHARS} characters"
            )
    elif op == "shell_status":
        if args["id"] is not None and not is_background_id(args["id"]):
            raise RequestError(f"id: must look like b1, got {show(args['id'])}")
        if args["stop"] and args["id"] is None:
            raise RequestError("stop: needs an id")
        _check_wait(args)
    elif op == "file_read":
        if not args["path"]:
            raise RequestError("path: must not be empty")
    elif op == "code_search" and not args["pattern"]:
        raise RequestError("pattern: must not be empty")


def _check_wait(args: Dict[str, Any]) -> None:
    """shell_status's wait and until: no wait with stop; until needs an id and
    must compile as a Python regular expression."""
    until = args["until"]
    if args["stop"] and (args["wait"] is not None or until is not None):
        raise RequestError(f"{'wait' if args['wait'] is not None else 'until'}: not with stop")
    if until is None:
        return
    if args["id"] is None:
        raise RequestError("until: needs an id")
    if not until or len(until) > limits.UNTIL_MAX_CHARS:
        raise RequestError(f"until: must be 1 to {limits.UNTIL_MAX_CHARS} characters")
    import re  # only for an until

    try:
        re.compile(until)
    except (re.error, RecursionError, OverflowError) as exc:
        raise RequestError(f"until: not a valid regular expression ({exc})") from None


# --- request decoding ------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes, where: str) -> Any:
    """UTF-8 JSON (NaN and Infinity refused) -> the value; RequestError naming where."""
    try:
        return codec.loads(raw.decode("utf-8"), _reject_constant)
    except UnicodeDecodeError:
        raise RequestError(f"{where}: not UTF-8") from None
    except ValueError as exc:
        raise RequestError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise RequestError(f"{where}: JSON nested too deeply") from None


def state_root() -> str:
    """The state root: $GUILDS_STATE_DIR, else /run/guilds."""
    return os.environ.get(limits.STATE_DIR_ENV) or limits.DEFAULT_STATE_DIR


def _read_request_file(path: str) -> bytes:
    """Read a request file under <state root>/requests/, then delete it."""
    requests_dir = os.path.join(os.path.realpath(state_root()), "requests")
    parent = os.path.realpath(os.path.dirname(path))
    if parent != requests_dir:
        raise RequestError(f"request: file must be in {requests_dir}, got {path}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise RequestError(f"request: cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RequestError(f"request: {path} is not a regular file")
        if st.st_size > limits.REQUEST_FILE_MAX:
            raise RequestError(f"request: {path} is larger than {limits.REQUEST_FILE_MAX} bytes")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass


def decode_arg(arg: str) -> bytes:
    """The request's bytes from the one argument: base64, or a request file (read, deleted)."""
    # "." is not in the base64 alphabet, so a path ending in .json is never base64.
    if arg.startswith("/") and arg.endswith(".json"):
        return _read_request_file(arg)
    try:
        return codec.b64decode(arg.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise RequestError("request: not valid base64") from None


def name_field(data: Dict[str, Any], key: str) -> str:
    """data[key], a name that can become a file name (is_safe_name)."""
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{key}: required, a non-empty string")
    if not is_safe_name(value):
        raise RequestError(f"{key}: must be letters, digits, '.', '_' or '-', got {show(value)}")
    return value


def abs_path_field(data: Dict[str, Any], key: str, default: Optional[str] = None) -> str:
    """data[key] (or default), an absolute path, normalized."""
    value = data.get(key, default)
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise RequestError(f"{key}: must be an absolute path, got {show(value)}")
    return os.path.normpath(value)


def _reads(value: Any) -> List[Dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("reads: must be a list")
    out = []
    for i, item in enumerate(value):
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and isinstance(item.get("content_hash"), str)
            and isinstance(item.get("seq"), int)
            and not isinstance(item.get("seq"), bool)
            and isinstance(item.get("range"), list)
            and len(item["range"]) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in item["range"])
        )
        if not ok:
            raise RequestError(f"reads[{i}]: must be {{path, range: [a, b], content_hash, seq}}")
        out.append(item)
    return out


def env_names(value: Any) -> List[str]:
    """redact_env: a list of environment variable names ([] when absent)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(is_env_name(v) for v in value):
        raise RequestError("redact_env: must be a list of environment variable names")
    return value


def parse_request(data: Any) -> Request:
    """Validate a decoded request object into a Request."""
    if not isinstance(data, dict):
        raise RequestError("request: must be a JSON object")
    op = data.get("op")
    if op not in OPS:
        raise RequestError(f"op: unknown op {show(op)} (known: {', '.join(OPS)})")
    home = abs_path_field(data, "home")
    max_bytes = data.get("max_bytes", limits.DEFAULT_MAX_BYTES)
    return Request(
        op=op,
        args=validate_args(op, data.get("args", {})),
        run_id=name_field(data, "run_id"),
        agent_id=name_field(data, "agent_id"),
        call_id=name_field(data, "call_id"),
        home=home,
        cwd=abs_path_field(data, "cwd", home),
        max_bytes=check_int("max_bytes", max_bytes, (limits.MIN_MAX_BYTES, limits.PLATFORM_CAP_BYTES)),
        seq=check_int("seq", data.get("seq", 0), (0, 2**63 - 1)),
        reads=_reads(data.get("reads")),
        redact_env=env_names(data.get("redact_env")),
        started_by=_started_by(data, op),
    )


def _started_by(data: Dict[str, Any], op: str) -> Optional[str]:
    """The started_by field: absent, or a call id on a shell_status request that names an id."""
    if data.get("started_by") is None:
        return None
    if op != "shell_status" or not isinstance(data.get("args"), dict) or data["args"].get("id") is None:
        raise RequestError("started_by: only with shell_status and an id")
    return name_field(data, "started_by")


def decode_request(argv: List[str]) -> Request:
    """argv (without the program name) -> Request, or RequestError."""
    if len(argv) != 1:
        raise RequestError(f"request: expected one argument, got {len(argv)}")
    return parse_request(parse_json(decode_arg(argv[0]), "request"))


def encode_request(request: Dict[str, Any]) -> str:
    """The orchestrator's side: a request object -> the base64 argv string."""
    return codec.b64encode(codec.dumps(request).encode("utf-8")).decode("ascii")


# --- envelopes -----------------------------------------------------------
def _encode(obj: Dict[str, Any]) -> bytes:
    return codec.b64encode(codec.dumps(obj).encode("utf-8", "surrogateescape")) + b"\n"


def ok_envelope(reply: Reply) -> bytes:
    return _encode({"ok": True, "text": reply.text, "meta": reply.meta})


def error_envelope(message: str) -> bytes:
    one_line = " ".join(message.split()) or "error"
    return _encode({"ok": False, "error": one_line})


def decode_envelope(line: bytes) -> Dict[str, Any]:
    """The orchestrator's side: one stdout line -> the envelope object.

    Raises ValueError when the line is not a well-formed envelope.
    """
    raw = codec.b64decode(line.strip())
    obj = codec.loads(raw.decode("utf-8"), _reject_constant)
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise ValueError("envelope has no boolean 'ok'")
    if obj["ok"] and not (isinstance(obj.get("text"), str) and isinstance(obj.get("meta"), dict)):
        raise ValueError("envelope has no text and meta")
    if not obj["ok"] and not isinstance(obj.get("error"), str):
        raise ValueError("envelope has no error")
    return obj
