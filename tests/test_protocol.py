"""The request and envelope: every malformed request gets one line naming the field."""

from __future__ import annotations

import ast
import base64
import importlib.util
import json
import marshal
import subprocess

import pytest

from conftest import PYTHON, error_text, ok_text
from guilds.sandbox import helpers
from guilds.sandbox.helpers import build_bytes
from guilds_code import codec, limits, protocol
from guilds_code.protocol import decode_envelope


def _b64(raw: str) -> str:
    return base64.b64encode(raw.encode()).decode()


def _envelope_of(sandbox, arg: str) -> dict:
    proc = sandbox.run_raw(arg)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert b"Traceback" not in proc.stdout + proc.stderr
    from guilds_code.protocol import decode_envelope

    return decode_envelope(lines[0])


@pytest.mark.parametrize(
    "arg, needle",
    [
        ("not base64!", "request: not valid base64"),
        ("eyJvcCI", "request: not valid base64"),  # bad padding
        (_b64("{not json"), "request: not valid JSON"),
        (_b64("[1, 2]"), "request: must be a JSON object"),
        (base64.b64encode(b"\xff\xfe").decode(), "request: not UTF-8"),
    ],
)
def test_undecodable_request_is_named(sandbox, arg, needle):
    assert needle in error_text(_envelope_of(sandbox, arg))


def test_base64_with_junk_characters_is_refused(sandbox):
    good = _b64(json.dumps(sandbox.request("shell_status", {})))
    assert "not valid base64" in error_text(_envelope_of(sandbox, good[:8] + "*" + good[8:]))


def test_nan_is_refused(sandbox):
    raw = json.dumps(sandbox.request("shell", {"command": "true"}))
    raw = raw.replace('"command": "true"', '"command": "true", "timeout_seconds": NaN')
    assert "NaN is not valid JSON" in error_text(_envelope_of(sandbox, _b64(raw)))


@pytest.mark.parametrize(
    "op, args, needle",
    [
        ("shell", {}, "command: required by shell"),
        ("shell", {"command": 5}, "command: must be a string"),
        ("shell", {"command": "  "}, "command: must not be empty"),
        ("shell", {"command": "true", "timeout_seconds": True}, "timeout_seconds: must be an integer, got true"),
        ("shell", {"command": "true", "timeout_seconds": "5"}, "timeout_seconds: must be an integer"),
        ("shell", {"command": "true", "timeout_seconds": 1.5}, "timeout_seconds: must be an integer"),
        ("shell", {"command": "true", "timeout_seconds": 0}, "timeout_seconds: must be from 1 to 600, got 0"),
        ("shell", {"command": "true", "timeout_seconds": 601}, "timeout_seconds: must be from 1 to 600, got 601"),
        ("shell", {"command": "true", "background": "false"}, "background: must be true or false"),
        ("shell", {"command": "true", "cwd": "/"}, "cwd: unknown argument for shell"),
        ("shell_status", {"id": "../x"}, "id: must look like b1"),
        ("shell_status", {"stop": True}, "stop: needs an id"),
        ("file_read", {"path": "a", "limit": 501}, "limit: must be from 1 to 500, got 501"),
        ("file_read", {"path": "a", "limit": 0}, "limit: must be from 1 to 500, got 0"),
        ("file_read", {"path": "a", "offset": 0}, "offset: must be at least 1, got 0"),
        ("file_read", {"path": ""}, "path: must not be empty"),
        ("code_search", {"pattern": "x", "mode": "lines"}, "mode: must be 'files' or 'content'"),
        ("code_search", {"pattern": "x", "context": 6}, "context: must be from 0 to 5, got 6"),
        ("code_search", {"pattern": ""}, "pattern: must not be empty"),
    ],
)
def test_bad_arguments_name_the_field(sandbox, op, args, needle):
    assert needle in error_text(sandbox.call(op, args))


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("op", "rm", "op: unknown op"),
        ("run_id", "../etc", "run_id: must be letters"),
        ("run_id", "a/b", "run_id: must be letters"),
        ("call_id", "", "call_id: required"),
        ("agent_id", "a\nb", "agent_id: must be letters"),
        ("agent_id", "ab\n", "agent_id: must be letters"),  # a regex's $ let this one pass
        ("home", "relative", "home: must be an absolute path"),
        ("max_bytes", limits.MIN_MAX_BYTES - 1, "max_bytes: must be from 1024"),
        ("max_bytes", True, "max_bytes: must be an integer"),
        ("args", [], "args: must be an object"),
        ("redact_env", ["A B"], "redact_env: must be a list"),
        ("redact_env", ["A\n"], "redact_env: must be a list"),
    ],
)
def test_bad_request_fields_name_the_field(sandbox, field, value, needle):
    req = sandbox.request("shell_status", {})
    req[field] = value
    assert needle in error_text(sandbox.call_request(req))


def test_wrong_argument_count(sandbox):
    proc = sandbox.run_raw("x")
    assert proc.returncode == 0
    # two arguments: run the helper by hand
    import subprocess

    from conftest import PYTHON

    out = subprocess.run([PYTHON, "-I", "-S", str(sandbox.helper), "a", "b"], check=False, capture_output=True)
    assert out.returncode == 0 and out.stdout[-1:] == b"\n"
    assert out.stdout.count(b"\n") == 1


def _request_file(sandbox, body: bytes):
    requests = sandbox.state / "requests"
    requests.mkdir(exist_ok=True)
    path = requests / "run1-c9.json"
    path.write_bytes(body)
    return path


def test_request_file_is_read_then_deleted(sandbox):
    req = sandbox.request("file_read", {"path": "x", "limit": 501})
    path = _request_file(sandbox, json.dumps(req).encode())
    env = _envelope_of(sandbox, str(path))
    assert "limit: must be from 1 to 500" in error_text(env)  # parsed, then validated
    assert not path.exists()


def test_bad_request_file_is_deleted_too(sandbox):
    path = _request_file(sandbox, b"{broken")
    assert "not valid JSON" in error_text(_envelope_of(sandbox, str(path)))
    assert not path.exists()


def test_request_file_outside_requests_folder_is_refused_and_kept(sandbox, tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    assert "request: file must be in" in error_text(_envelope_of(sandbox, str(victim)))
    assert victim.exists()


def test_missing_request_file(sandbox):
    (sandbox.state / "requests").mkdir()
    text = error_text(_envelope_of(sandbox, str(sandbox.state / "requests" / "nope.json")))
    assert text.startswith("request: cannot open")


# --- the wire's JSON and base64 without the json module --------------------------
_DOCUMENTS = [
    '{"a": 1, "b": [1.5, -2e10, true, false, null, "x\\u00e9\\ud800"]}', " \n[1]\t", '"s"', "-0",
    "[] x", "", "\ufeff{}", '{"a": NaN}', '{"a":1,}', "1e999", '"\\ud83d\\ude00"', '{"k": "\x01"}',
]
_VALUES = [
    {"ok": True, "text": "h\u00e9\x00\ud800\n\"", "meta": {"a": [1, 2.5, None, float("inf")], "b": {}}},
    {1: 2, None: 3, False: 4}, {(1,): 2}, {"x": object()}, [10**30], "text",
]


def _outcome(call):
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("doc", _DOCUMENTS)
def test_codec_loads_is_json_loads(doc):
    def reject(name):
        raise ValueError(name)

    assert repr(_outcome(lambda: codec.loads(doc, reject))) == repr(
        _outcome(lambda: json.loads(doc, parse_constant=reject))
    )


@pytest.mark.parametrize("value", _VALUES)
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_codec_dumps_is_json_dumps(value, separators):
    assert _outcome(lambda: codec.dumps(value, separators)) == _outcome(
        lambda: json.dumps(value, ensure_ascii=False, separators=separators)
    )


@pytest.mark.parametrize("data", [b"", b"QQ==", b"QQ", b"QQ=", b"Q===", b"=QQ=", b"QU JD", b"QUJD\n", b"QQ==QQ=="])
def test_codec_b64decode_is_validating_b64decode(data):
    def outcome(call):
        try:
            return call()
        except ValueError as exc:
            return type(exc)

    assert outcome(lambda: codec.b64decode(data)) == outcome(lambda: base64.b64decode(data, validate=True))


def test_names_are_checked_without_regex_quirks():
    assert protocol.is_safe_name("run-1.a_b") and not protocol.is_safe_name("run1\n")
    assert not protocol.is_safe_name("a..b") and not protocol.is_safe_name("x" * (limits.NAME_MAX_CHARS + 1))
    assert protocol.is_env_name("_A1") and not protocol.is_env_name("1A") and not protocol.is_env_name("A\n")
    assert protocol.is_background_id("b12") and not protocol.is_background_id("b01")
    assert not protocol.is_background_id("b\u0661")  # an Arabic-Indic digit is no digit here


# --- start-up --------------------------------------------------------------------
def _restubbed(code=None, source=None, magic=None) -> bytes:
    """The built guilds-code script with its code or source section stubbed, or another magic number."""
    script, rest = build_bytes("guilds_code").decode().split("#code\n")
    code_part, source_part = rest.split("#source\n")
    names = {name: is_package for name, is_package, _, _ in helpers._sources("guilds_code")}
    if code is not None:
        code_part = helpers._comments({n: (p, marshal.dumps(compile(code, n, "exec"))) for n, p in names.items()})
    if source is not None:
        source_part = helpers._comments({n: (p, source) for n, p in names.items()})
    if magic is not None:
        script = script.replace(f"MAGIC = {importlib.util.MAGIC_NUMBER!r}\n", f"MAGIC = {magic!r}\n")
    return f"{script}#code\n{code_part}#source\n{source_part}".encode()


def test_the_helper_runs_from_its_embedded_code(sandbox, tmp_path):
    """Same interpreter: every module comes from its marshal'd code object; no source is compiled."""
    sandbox.helper = tmp_path / "stubbed"
    sandbox.helper.write_bytes(_restubbed(source=b"raise SystemExit('source read')\n"))
    assert ok_text(sandbox.call("shell", {"command": "echo hi"})) == "hi"


def test_another_python_version_runs_the_embedded_source(sandbox, tmp_path):
    """Another bytecode magic number: the code objects are never loaded; the source is compiled."""
    sandbox.helper = tmp_path / "other-magic"
    sandbox.helper.write_bytes(_restubbed(code="raise SystemExit('code loaded')\n", magic=b"\0\0\r\n"))
    assert ok_text(sandbox.call("shell", {"command": "echo hi"})) == "hi"
    sandbox.helper.write_bytes(_restubbed(code="raise SystemExit('code loaded')\n"))
    proc = subprocess.run([PYTHON, "-I", "-S", str(sandbox.helper), "x"], capture_output=True, check=False)
    assert b"code loaded" in proc.stderr  # the stub is what a loaded code object runs


def test_the_helpers_hold_nothing_optimize_2_strips():
    """The helpers compile with optimize=2: an assert or a __doc__ read would differ from the tests'."""
    for package in ("guilds_code", "guilds_harness"):
        for _, _, rel, source in helpers._sources(package):
            tree = ast.parse(source)
            assert not any(isinstance(node, ast.Assert) for node in ast.walk(tree)), rel
            assert not any(isinstance(node, (ast.Name, ast.Attribute)) and "__doc__" in (
                getattr(node, "id", None), getattr(node, "attr", None)) for node in ast.walk(tree)), rel
            assert b"__debug__" not in source, rel


def test_the_build_is_deterministic():
    assert build_bytes("guilds_code") == build_bytes("guilds_code")


HEAVY_MODULES = {
    "dataclasses", "typing", "inspect", "subprocess", "selectors", "threading", "shutil", "tempfile",
    "random", "urllib.parse", "ipaddress", "json", "re", "enum", "base64", "shlex", "signal", "locale",
    "hashlib",
}
"""What a plain call must not import: together they cost several times the call's own work."""


@pytest.mark.parametrize(
    "op, args, want",
    [
        ("shell", {"command": "echo hi"}, "hi"),
        ("shell_status", {}, "no background commands"),
        ("file_read", {"path": "small.txt"}, "small.txt lines 1–1 of 1\n1  hi"),
        ("code_search", {"pattern": "hi"}, "small.txt: 1 match\n1 match in 1 file"),
    ],
)
def test_a_plain_call_imports_nothing_heavy(sandbox, op, args, want):
    (sandbox.home / "small.txt").write_text("hi\n")
    req = sandbox.request(op, args)
    arg = base64.b64encode(json.dumps(req).encode()).decode()
    proc = subprocess.run(
        [PYTHON, "-X", "importtime", "-I", "-S", str(sandbox.helper), arg],
        check=False, env=sandbox.process_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
    )
    assert ok_text(decode_envelope(proc.stdout.strip())) == want
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
    assert imported & HEAVY_MODULES == set()
