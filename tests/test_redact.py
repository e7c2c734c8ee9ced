"""Redaction forms: escaped (tests/fixtures/secret_forms.py, URL quoting, JSON,
re.escape, in any mix), base64 at every alignment, overlapping secrets, escape
sequences and carriage returns inside a value, a stream fed in any pieces."""

from __future__ import annotations

import base64
import json
import random
import re
import shlex
from pathlib import Path
from urllib.parse import quote_plus

import pytest

from fixtures import secret_forms
from guilds.record.redaction import redact_meta
from guilds.toolbox.pipeline import run_pipeline
from guilds_code.limits import ESCAPE_DEPTH
from guilds_code.redact import MARK, Redactor

SECRET = "dk_7Qm2Xv9Lp4Rt8Wz1Nb6Hc3Jy5Fs0Gd"
SHORT = "p@ss"


def recovered(text: str, secret: str, least: int = 4) -> list:
    """Pieces of secret (least bytes or more) that decoding what is left of text, at any
    alignment, gives back."""
    found = []
    for part in text.replace("\n", "").split(MARK):
        piece = part.rstrip("=")
        for pad in range(4):
            chunk = "A" * pad + piece
            chunk = chunk[: len(chunk) // 4 * 4]
            for alphabet in (None, b"-_"):
                try:
                    data = base64.b64decode(chunk, altchars=alphabet) if chunk else b""
                except ValueError:
                    continue
                raw = secret.encode()
                found += [raw[i:i + least] for i in range(len(raw) - least + 1) if raw[i:i + least] in data]
    return found


@pytest.mark.parametrize("secret", [SECRET, SHORT, "ünïcödé-sécret-42"])
@pytest.mark.parametrize("prefix", ["", "x", "xy", "user:", "ab:", "Basic "])
@pytest.mark.parametrize("suffix", ["", "\n", ":", "@host:443\n"])
@pytest.mark.parametrize("urlsafe", [False, True])
def test_base64_at_every_alignment_leaves_nothing_recoverable(secret, prefix, suffix, urlsafe):
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    encoded = encode((prefix + secret + suffix).encode()).decode()
    text = Redactor([secret]).redact(f"out: {encoded} end")
    assert MARK in text
    assert recovered(text, secret) == [], text


@pytest.mark.parametrize("name", sorted(secret_forms.FORMS))
def test_each_escaped_form_is_redacted(name):
    form, shown = secret_forms.FORMS[name]
    assert Redactor([secret_forms.SECRET]).redact(f"x={form(secret_forms.SECRET)};") == f"x={shown};"


@pytest.mark.parametrize(("secret", "text"), [
    ("my pass/word", quote_plus("my pass/word")),  # a space as +
    ("ab\U0001f600cd", json.dumps("ab\U0001f600cd")[1:-1]),  # a surrogate pair
    ("ab\U0001f600cd", "ab\\uD83D\\uDE00cd"),
    ("C:\\key\\x1", json.dumps("C:\\key\\x1")[1:-1]),  # a backslash, escaped
    ("C:\\key\\x1", re.escape("C:\\key\\x1")),
    ("tab\there", json.dumps("tab\there")[1:-1]),  # JSON's \t
])
def test_spaces_pairs_backslashes_and_controls_escaped(secret, text):
    assert Redactor([secret]).redact(f"<{text}>") == f"<{MARK}>"


def test_escapes_behind_at_most_escape_depth_backslashes():
    value = "ab.cd-ef/gh"
    deep = "".join("\\" * ESCAPE_DEPTH + c if not c.isalnum() else c for c in value)
    assert Redactor([value]).redact(f"<{deep}>") == f"<{MARK}>"
    deeper = "".join("\\" * (ESCAPE_DEPTH + 1) + c if not c.isalnum() else c for c in value)
    assert Redactor([value]).redact(f"<{deeper}>") == f"<{deeper}>"


def test_an_escape_that_is_not_a_secret_is_left_as_it_is():
    text = 'say \\"hi\\" at 50%25 and %2Fpath \\u00e9 a\\/b'
    assert Redactor([secret_forms.SECRET, SECRET]).redact(text) == text


def test_overlapping_secrets_leave_no_tail():
    first, second = "AAAA-head-XYZ0123", "XYZ0123-tail-of-the-second-one!!"
    text = "q" + first + second[len("XYZ0123"):] + "w"
    assert Redactor([first, second]).redact(text) == f"q{MARK}w"
    inner, outer = "inner-secret", "outer-inner-secret-and-more"
    assert Redactor([inner, outer]).redact(f"a {outer} b {inner}") == f"a {MARK} b {MARK}"


@pytest.mark.parametrize("split", [
    "{a}\x1b[0m{b}", "{a}\x1b[1;31m{b}\x1b[m", "{a}\r{b}", "{a}\x1b]0;title\x07{b}", "\x1b[2K{a}\x1b[32m{b}\r\n",
])
def test_a_secret_split_by_escapes_or_carriage_returns(split):
    a, b = SECRET[:13], SECRET[13:]
    text = "line one\n" + "before " + split.format(a=a, b=b) + " after\nlast"
    out = Redactor([SECRET]).redact(text)
    assert a not in out and b not in out, repr(out)
    assert out.startswith("line one\n") and out.endswith("\nlast") and MARK in out


def test_an_escape_without_a_secret_is_left_as_it_is():
    text = "\x1b[1mbold\x1b[0m and 50%\r100%"
    assert Redactor([SECRET]).redact(text) == text


def test_a_stream_in_any_pieces_equals_the_whole():
    rng = random.Random(7)
    secrets = [SECRET, "AAAA-head-XYZ0123", "XYZ0123-tail-of-the-second-one!!", "aaaa", secret_forms.SECRET]
    redactor = Redactor(secrets)
    parts = secrets + ["aaaaaaaaaa", "xyz", "\n", base64.b64encode(b"u:" + SECRET.encode()).decode(), "-" * 50,
                       "%", "\\", *secret_forms.lines(secret_forms.SECRET)]
    for _ in range(200):
        data = "".join(rng.choice(parts) for _ in range(rng.randint(1, 30))).encode()
        stream = redactor.stream()
        out, pos = b"", 0
        while pos < len(data):
            size = rng.randint(1, 40)
            out += stream.feed(data[pos:pos + size])
            pos += size
        assert out + stream.flush() == redactor.redact_bytes(data), data


def test_secret_as_an_argument_name_is_redacted():
    args = {SECRET: "x", "command": f"echo {SECRET}", "nested": [{SECRET: 1}]}
    assert redact_meta(Redactor([SECRET]), args) == {MARK: "x", "command": f"echo {MARK}", "nested": [{MARK: 1}]}


def test_pipeline_redacts_an_escape_split_secret_in_file_read_text():
    text = f"     1\tkey={SECRET[:9]}\x1b[0m{SECRET[9:]}\n     2\tnext"
    shaped = run_pipeline(Redactor([SECRET]), text, 3).text
    assert SECRET[:9] not in shaped and SECRET[9:] not in shaped
    assert shaped == f"     1\tkey={MARK}\n     2\tnext\nremaining_tool_calls: 3"


# --- end to end: the agent's own commands, the real helper, the pipeline, the record ---
KEY = "dk_7Qm2Xv9Lp4Rt8Wz1Nb6Hc3Jy5Fs0Gd"
TOKEN = "ghp_Tk9Lm2Qw8Er4Ty6Ui1Op3As5Df7Gh0"


@pytest.fixture
def secret_box(tmp_path):
    from toolbox_kit import local_toolbox

    (tmp_path / "home/repos/web").mkdir(parents=True)
    return lambda: local_toolbox(tmp_path, secrets={"DEPLOY_KEY": KEY}, repos={"web": {"token": TOKEN}})


@pytest.mark.parametrize("command", [
    "printf 'x%s' \"$DEPLOY_KEY\" | base64",
    "printf 'xy%s' \"$DEPLOY_KEY\" | base64 -w0",
    "echo \"user:$GH_TOKEN\" | base64",
    "printf '%s' \"$GH_TOKEN\" | base64 | tr '+/' '-_'",
    "echo \"Authorization: Basic $(printf 'git:%s' \"$GH_TOKEN\" | base64)\"",
])
async def test_base64_of_a_secret_at_any_offset_is_not_recoverable(secret_box, command):
    async with secret_box() as tb:
        result = await tb.call("r", "shell", {"command": command})
        assert not result.is_error and MARK in result.text, result.text
        assert recovered(result.text, KEY) == [] and recovered(result.text, TOKEN) == [], result.text
        [record] = await tb.store.calls("r")
        assert recovered(record.text, KEY) == [] and recovered(record.text, TOKEN) == []


async def test_an_escape_split_secret_read_back_from_a_log(secret_box, tmp_path):
    code = ("import os\nk=os.environ['DEPLOY_KEY']\n"
            "for i in range(3000): print(i, k[:11] + '\\x1b[0m' + k[11:], k[:5] + '\\r' + k[5:])")
    async with secret_box() as tb:
        shell = await tb.call("r", "shell", {"command": f"python3 -c {shlex.quote(code)}"})
        log = shell.meta["log_path"]
        assert "\x1b[0m" in Path(log).read_text()  # the log keeps the raw bytes
        read = await tb.call("r", "file_read", {"path": log, "offset": 1500, "limit": 30})
        assert not read.is_error and MARK in read.text
        assert KEY[:11] not in read.text and KEY[11:] not in read.text and KEY[5:] not in read.text
        found = await tb.call("r", "code_search", {"pattern": "^15", "path": log, "mode": "content"})
        assert not found.is_error and MARK in found.text, found.text
        assert KEY[:11] not in found.text and KEY[11:] not in found.text


async def test_every_escaped_form_in_a_log_read_back(tmp_path):
    """An elided shell output: its result, and its full log read back with file_read, show each
    form redacted (the helper redacts the log it reads, the pipeline again)."""
    from toolbox_kit import local_toolbox

    command = f"python3 {shlex.quote(secret_forms.__file__)} DEPLOY_KEY 3000"
    async with local_toolbox(tmp_path, secrets={"DEPLOY_KEY": secret_forms.SECRET}) as tb:
        shell = await tb.call("r", "shell", {"command": command})
        assert "bytes elided; full output:" in shell.text
        log = shell.meta["log_path"]
        assert secret_forms.lines(secret_forms.SECRET)[0] in Path(log).read_text()  # the log keeps the values
        read = await tb.call("r", "file_read", {"path": log, "offset": 3001})
    for text in (shell.text, read.text):
        shown = [re.sub(r"^ *\d+  ", "", line) for line in text.splitlines()]  # file_read's line numbers off
        assert all(line in shown for line in secret_forms.redacted_lines()), text
        assert not any(form in text for form in secret_forms.lines(secret_forms.SECRET)), text


async def test_a_secret_used_as_an_argument_name_is_not_recorded(secret_box):
    async with secret_box() as tb:
        result = await tb.call("r", "shell", {"command": "true", KEY: TOKEN})
        assert result.is_error
        [record] = await tb.store.calls("r")
    assert KEY not in json.dumps(record.args) and TOKEN not in json.dumps(record.args)
    assert MARK in record.args
