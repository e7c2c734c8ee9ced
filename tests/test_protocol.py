"""The request and envelope: every malformed request gets one line naming the field."""

from __future__ import annotations

import base64
import json

import pytest

from conftest import error_text
from guilds_code import limits


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
        ("home", "relative", "home: must be an absolute path"),
        ("max_bytes", limits.MIN_MAX_BYTES - 1, "max_bytes: must be from 1024"),
        ("max_bytes", True, "max_bytes: must be an integer"),
        ("args", [], "args: must be an object"),
        ("redact_env", ["A B"], "redact_env: must be a list"),
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

    out = subprocess.run([PYTHON, "-I", "-S", str(sandbox.helper), "a", "b"], capture_output=True)
    assert out.returncode == 0 and b"\n" == out.stdout[-1:]
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
