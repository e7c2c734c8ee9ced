"""The platform pipeline: redaction, the 64 KiB cap, the remaining_tool_calls trailer."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from urllib.parse import quote

import pytest

from guilds.record.redaction import redact_meta
from guilds.record.values import with_trailer
from guilds.toolbox.pipeline import CUT_MARK, cap, run_pipeline
from guilds_code.limits import PLATFORM_CAP_BYTES
from guilds_code.redact import MARK, Redactor

SECRET = "sk-live-0123456789abcdef"


def nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def test_a_text_that_fits_is_untouched():
    shaped = cap("hello\n")
    assert (shaped.text, shaped.cut) == ("hello\n", False)
    exact = "x" * PLATFORM_CAP_BYTES
    assert cap(exact).text == exact and not cap(exact).cut


def test_a_long_text_is_cut_to_the_cap_at_a_line_and_says_so():
    text = "".join(f"line {i:06d}\n" for i in range(20000))
    shaped = cap(text)
    assert shaped.cut
    assert nbytes(shaped.text) <= PLATFORM_CAP_BYTES
    head, _, mark = shaped.text.rpartition("\n[cut by the platform")
    assert head.endswith("\n") is False and head.split("\n")[-1].startswith("line ")
    assert "at 65536 bytes" in mark
    left = nbytes(text) - nbytes(head)
    assert mark.endswith(f"{left} bytes left out]")


def test_the_cap_never_splits_a_character():
    text = "é" * PLATFORM_CAP_BYTES  # one line, two bytes each
    shaped = cap(text)
    assert shaped.cut and nbytes(shaped.text) <= PLATFORM_CAP_BYTES
    shaped.text.encode("utf-8")  # no lone surrogate: whole characters only
    assert set(shaped.text.split("\n")[0]) == {"é"}


def test_the_trailer_goes_on_its_own_line():
    assert with_trailer("out\n", 3) == "out\nremaining_tool_calls: 3"
    assert with_trailer("out", 0) == "out\nremaining_tool_calls: 0"
    assert with_trailer("", 1) == "remaining_tool_calls: 1"


def test_redaction_then_cap_then_trailer():
    redactor = Redactor([SECRET])
    shaped = run_pipeline(redactor, f"key={SECRET}\n" + "y" * PLATFORM_CAP_BYTES, 5)
    assert shaped.cut
    assert shaped.text.startswith(f"key={MARK}\n")
    assert shaped.text.endswith("bytes left out]\nremaining_tool_calls: 5")
    body = shaped.text.rsplit("\n", 1)[0]
    assert nbytes(body) <= PLATFORM_CAP_BYTES  # the trailer comes after the cap


ODD = 'p@ss/w"rd+1234'


@pytest.mark.parametrize(
    "encoded",
    [
        ODD,
        base64.b64encode(ODD.encode()).decode().rstrip("="),
        quote(ODD, safe=""),
        json.dumps(ODD)[1:-1],
    ],
)
def test_every_value_and_its_encodings_are_redacted(encoded):
    text = run_pipeline(Redactor([SECRET, ODD]), f"before {encoded} after", 1).text
    assert text == f"before {MARK} after\nremaining_tool_calls: 1"


def test_a_secret_that_only_redaction_would_cut_is_never_half_kept():
    secret = "Z" * 40
    text = ("a" * (PLATFORM_CAP_BYTES - 20)) + secret
    shaped = run_pipeline(Redactor([secret]), text, 0)
    assert "ZZZZZZZZ" not in shaped.text  # redacted before the cap could cut it


def test_meta_strings_are_redacted_keys_kept():
    meta = {"cwd": f"/home/{SECRET}", "lines": 3, "range": [1, 2], "nested": {"x": [SECRET]}}
    out = redact_meta(Redactor([SECRET]), meta)
    assert out == {"cwd": f"/home/{MARK}", "lines": 3, "range": [1, 2], "nested": {"x": [MARK]}}
    assert redact_meta(Redactor([]), meta) is meta


def test_the_cut_mark_is_worded_for_a_model():
    assert CUT_MARK.format(cap=65536, left=10) == "\n[cut by the platform at 65536 bytes: 10 bytes left out]"


# --- end to end: the real helper clips, the pipeline redacts again -----------------
SECRET_ENV = "DEPLOY_KEY"
KEY = "dk_7Qm2Xv9Lp4Rt8Wz1Nb6Hc3Jy5Fs0Gd"
TOKEN = "ghp_Tk9Lm2Qw8Er4Ty6Ui1Op3As5Df7Gh0"
FRAGMENT = 8


def leaks(text: str, secret: str) -> list[str]:
    """Every 8-character piece of secret found in text."""
    return [secret[i:i + FRAGMENT] for i in range(len(secret) - FRAGMENT + 1) if secret[i:i + FRAGMENT] in text]


def assert_clean(text: str) -> None:
    assert not leaks(text, KEY) and not leaks(text, TOKEN), text[:300]


@pytest.fixture
def secret_box(tmp_path):
    from toolbox_kit import local_toolbox

    (tmp_path / "home/repos/web").mkdir(parents=True)

    def make(max_bytes=8192):
        return local_toolbox(tmp_path, agent={"result_max_bytes": max_bytes},
                             secrets={SECRET_ENV: KEY}, repos={"web": {"token": TOKEN}})

    return make


def py(code: str) -> str:
    return f"python3 -c {shlex.quote(code)}"


@pytest.mark.parametrize("max_bytes", [1024, 8192])
async def test_no_fragment_survives_the_head_tail_cut_or_the_byte_cap(secret_box, max_bytes):
    shifted = ("import os\nk=os.environ['DEPLOY_KEY']; t=os.environ['GH_TOKEN']\n"
               "for i in range(900): print('y'*(i%41) + (k if i%2 else t) + 'z'*(i%13))")
    glued = "import os\nprint('q'*5 + (os.environ['DEPLOY_KEY'] + os.environ['GH_TOKEN'])*700)"
    async with secret_box(max_bytes) as tb:
        for code in (shifted, glued):
            result = await tb.call("r", "shell", {"command": py(code)})
            assert "bytes elided" in result.text and "[REDACTED]" in result.text
            assert_clean(result.text)


async def test_no_fragment_survives_the_400_and_300_character_line_clips(secret_box, tmp_path):
    lines = [f"{'a' * (clip - k)}{secret}{'b' * 60}"
             for clip in (300, 400) for k in range(1, len(KEY) + 2) for secret in (KEY, TOKEN)]
    (tmp_path / "home/repos/web/wide.txt").write_text("\n".join(lines) + "\n")
    async with secret_box(65536) as tb:
        read = await tb.call("r", "file_read", {"path": "wide.txt", "limit": 500})
        assert "… [+" in read.text and "[REDACTED]" in read.text
        assert_clean(read.text)
        found = await tb.call("r", "code_search", {"pattern": "bbbbbbbbbb", "mode": "content", "limit": 40})
        assert not found.is_error, found.text
        assert_clean(found.text)


async def test_a_full_log_read_back_is_redacted(secret_box, tmp_path):
    code = "import os\nfor i in range(3000): print(i, os.environ['DEPLOY_KEY'], os.environ['GH_TOKEN'])"
    async with secret_box() as tb:
        shell = await tb.call("r", "shell", {"command": py(code)})
        log = shell.meta["log_path"]
        assert KEY in Path(log).read_text()  # stored unredacted, in the home, as the page says
        for offset in (1, 1500, 2990):
            read = await tb.call("r", "file_read", {"path": log, "offset": offset, "limit": 20})
            assert not read.is_error and "[REDACTED]" in read.text
            assert_clean(read.text)


async def test_the_record_keeps_arguments_redacted(secret_box):
    async with secret_box() as tb:
        shell = await tb.call("r", "shell", {"command": f"echo {KEY} {TOKEN} | wc -c"})
        assert not shell.is_error, shell.text
        assert shell.text.startswith(str(len(f"{KEY} {TOKEN}\n")))  # the command ran with the values
        unknown = await tb.call("r", KEY, {"why": TOKEN})
        assert unknown.is_error
        recorded = await tb.store.calls("r")
    assert [c.args for c in recorded] == [{"command": "echo [REDACTED] [REDACTED] | wc -c"}, {"why": "[REDACTED]"}]
    assert recorded[1].tool == "[REDACTED]"
    for call in recorded:
        assert_clean(f"{call.tool} {call.args} {call.text} {call.meta} {call.row}")
