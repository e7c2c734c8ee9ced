"""Error lines kept through elision: shell and shell_status through the built helper, real bash."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from conftest import ok_text
from guilds_code import errorlines, limits
from guilds_code.redact import Redactor
from guilds_code.shaping import ERRORS_HEADER

MARKER_RE = re.compile(r"\[… (\d+) bytes elided; full output: (/.+) …\]")
NOISE = 'for i in $(seq 1 {n}); do echo "step $i ok"; done'


def sh(sandbox, command, extra=None, **args):
    return sandbox.call("shell", dict(command=command, **args), **(extra or {}))


def listed(text: str) -> list[tuple[int, str]]:
    lines = text.split("\n")
    if ERRORS_HEADER not in lines:
        return []
    out = []
    for line in lines[lines.index(ERRORS_HEADER) + 1:]:
        m = re.fullmatch(r"(\d+): (.*)", line)
        if not m:
            break
        out.append((int(m.group(1)), m.group(2)))
    return out


def log_line(path: str, n: int) -> str:
    return Path(path).read_text().split("\n")[n - 1]


def test_errors_of_the_elided_middle_are_listed_with_their_log_lines(sandbox):
    command = (f"{NOISE.format(n=800)}; echo 'src/a.c:10:5: error: bad type'; {NOISE.format(n=300)}; "
               "echo 'E   assert 1 == 2'; echo 'FAILED tests/test_x.py::test_y'; "
               f"{NOISE.format(n=800)}; exit 2")
    env = sh(sandbox, command)
    text = ok_text(env)
    assert len(text.encode()) <= 8192 and text.endswith("exit_code: 2")
    errors = listed(text)
    assert [e[1] for e in errors] == ["src/a.c:10:5: error: bad type", "E   assert 1 == 2",
                                      "FAILED tests/test_x.py::test_y"]
    log = env["meta"]["log_path"]
    assert [log_line(log, n) for n, _ in errors] == [e[1] for e in errors]
    assert env["meta"]["error_lines"] == [801, 1102, 1103]
    # the block sits right under the marker, and the marker still counts every elided byte
    lines = text.split("\n")
    at = lines.index(ERRORS_HEADER)
    assert MARKER_RE.fullmatch(lines[at - 1])
    elided = int(MARKER_RE.search(text).group(1))
    body = text.split("\n")
    head = "\n".join(body[: at - 1]) + "\n"
    tail = "\n".join(body[at + 4: -1])
    assert len(head.encode()) + elided + len(tail.encode()) + 1 == len(Path(log).read_bytes())
    assert env["meta"]["bytes_elided"] == elided


def test_at_most_five_the_first_first(sandbox):
    command = f"{NOISE.format(n=300)}; for i in $(seq 1 9); do echo \"fatal: number $i\"; done; {NOISE.format(n=900)}"
    env = sh(sandbox, command)
    errors = listed(ok_text(env))
    assert [e[1] for e in errors] == [f"fatal: number {i}" for i in range(1, limits.ERROR_LINES_MAX + 1)]
    assert env["meta"]["error_lines"] == list(range(301, 301 + limits.ERROR_LINES_MAX))


def test_no_block_when_the_errors_are_in_the_head_or_the_tail(sandbox):
    env = sh(sandbox, f"echo 'Error: early'; {NOISE.format(n=2000)}; echo 'Error: late'")
    text = ok_text(env)
    assert ERRORS_HEADER not in text and "error_lines" not in env["meta"]
    assert text.startswith("Error: early\n") and text.endswith("Error: late")


def test_no_block_when_nothing_was_elided(sandbox):
    env = sh(sandbox, "echo 'Traceback (most recent call last)'; echo 'ValueError: x'; exit 1")
    assert ok_text(env) == "Traceback (most recent call last)\nValueError: x\nexit_code: 1"
    assert set(env["meta"]) == {"exit_code", "cwd", "timed_out"}


def test_lines_are_shown_shaped_redacted_and_clipped(sandbox):
    sandbox.env["MY_TOKEN"] = "s3cr3t-value-123"
    long = "x" * 300
    command = (f"{NOISE.format(n=500)}; printf '\\033[1;31merror\\033[0m: token %s\\n' \"$MY_TOKEN\"; "
               f"echo 'panic: {long}'; {NOISE.format(n=800)}")
    env = sh(sandbox, command, extra={"redact_env": ["MY_TOKEN"]})
    errors = listed(ok_text(env))
    assert errors[0] == (501, "error: token [REDACTED]")
    assert (
        errors[1][1]
        == "panic: " + "x" * (limits.ERROR_LINE_MAX_CHARS - 7) + f"… [+{307 - limits.ERROR_LINE_MAX_CHARS} chars]"
    )
    assert "s3cr3t" not in ok_text(env)


@pytest.mark.parametrize("max_bytes, shown", [(limits.MIN_MAX_BYTES, 1), (2048, 3), (8192, 5)])
def test_the_tail_gives_way_never_the_cap(sandbox, max_bytes, shown):
    errors = f"for i in 1 2 3 4 5; do echo \"Error: {'y' * 200} $i\"; done"
    command = f"{NOISE.format(n=400)}; {errors}; {NOISE.format(n=600)}"
    env = sh(sandbox, command, extra={"max_bytes": max_bytes})
    text = ok_text(env)
    assert len(text.encode()) <= max_bytes
    assert len(listed(text)) == shown and text.endswith("step 600 ok")
    tail = text.split("\n")[len(text.split("\n")) - 5:]
    assert all(line.startswith("step ") for line in tail)  # the tail keeps whole lines after the block


def test_an_error_uncovered_when_the_tail_gives_way_is_listed(sandbox):
    # The error sits where the tail would start without the block: the block
    # pushes the tail past it, so it must be listed too.
    env = sh(sandbox, f"{NOISE.format(n=600)}; echo 'Error: one'; {NOISE.format(n=560)}; "
                      f"echo 'Error: two'; {NOISE.format(n=580)}")
    text = ok_text(env)
    shown = [e[1] for e in listed(text)]
    assert shown[0] == "Error: one"
    assert ("Error: two" in shown) != ("\nError: two\n" in text)  # listed, or shown in the tail: never lost


@pytest.mark.parametrize("line, hit", [
    ("src/x.c:1:2: error: no", True), ("make: *** [all] Error 1", True), ("ValueError: bad", True),
    ("--- FAIL: TestX", True), ("Exception in thread main", True), ("npm ERR! code 1", True),
    ("thread 'main' panicked at", True), ("fatal: not a git repository", True), ("E   assert x", True),
    ("Segmentation fault (core dumped)", True), ("ERROR: boom", True),
    ("cc -Werror -c x.c", False), ("0 errors, 3 warnings", False), ("error_count = 0", False),
    ("E  two spaces", False), ("all good", False), ("Errors: 0", False),
])
def test_what_counts_as_an_error_line(tmp_path, line, hit):
    log = tmp_path / "l.log"
    log.write_text(f"a\n{line}\nb\n")
    assert errorlines.scan(str(log), 1, Redactor([])) == ([(2, line)] if hit else [])


def test_a_scan_reads_at_most_its_limit(tmp_path):
    log = tmp_path / "big.log"
    filler = b"ok\n" * (limits.ERROR_SCAN_MAX_BYTES // 3)
    log.write_bytes(filler + b"error: past the limit\n")
    assert errorlines.scan(str(log), 1, None, seconds=120) == []
    log.write_bytes(filler[: -6] + b"error\n")
    assert errorlines.scan(str(log), 1, None, seconds=120) == [(len(filler) // 3 - 1, "error")]
    began = time.monotonic()
    assert errorlines.scan(str(log), 1, None, seconds=0.05) == []  # the clock stops it first
    assert time.monotonic() - began < 0.05 + 1.0


def test_a_scan_starts_at_its_first_line_and_stops_before_its_offset(tmp_path):
    log = tmp_path / "l.log"
    log.write_bytes(b"error one\nok\nerror three\nerror four\n")
    assert errorlines.scan(str(log), 2, None) == [(3, "error three"), (4, "error four")]
    assert errorlines.scan(str(log), 1, None, stop_offset=len(b"error one\nok\n")) == [(1, "error one")]
    assert errorlines.scan(str(tmp_path / "missing.log"), 1, None) == []


# --- a background command's last lines --------------------------------------------------
def _wait_exit(sandbox, bid):
    for _ in range(200):
        env = sandbox.call("shell_status", {"id": bid})
        if "exited" in ok_text(env).split("\n")[0]:
            return env
        time.sleep(0.05)
    raise AssertionError("did not exit")


def test_status_lists_errors_before_its_last_lines(sandbox):
    start = sh(sandbox, f"{NOISE.format(n=50)}; echo 'Traceback (most recent call last)'; "
                        f"echo 'KeyError: 3'; {NOISE.format(n=60)}", background=True)
    bid = start["meta"]["background_id"]
    env = _wait_exit(sandbox, bid)
    lines = ok_text(env).split("\n")
    header = f"[error lines before the last {limits.STATUS_TAIL_LINES} lines, by line number in the log:]"
    at = lines.index(header)
    assert lines[at + 1: at + 3] == ["51: Traceback (most recent call last)", "52: KeyError: 3"]
    assert lines[at + 3] == f"last {limits.STATUS_TAIL_LINES} lines of the log:"
    assert env["meta"]["error_lines"] == [51, 52]


def test_status_without_earlier_errors_is_as_before(sandbox):
    start = sh(sandbox, f"{NOISE.format(n=60)}; echo 'Error: in the last lines'", background=True)
    env = _wait_exit(sandbox, start["meta"]["background_id"])
    assert "error lines before" not in ok_text(env) and "error_lines" not in env["meta"]
    assert ok_text(env).endswith("step 60 ok\nError: in the last lines")


@pytest.mark.parametrize("max_bytes, shown", [(limits.MIN_MAX_BYTES, 2), (8192, 5)])
def test_status_errors_stay_inside_the_cap(sandbox, max_bytes, shown):
    zs = "z" * 150
    errors = "; ".join(f"echo 'Error: {zs} {i}'" for i in range(1, 6))
    start = sh(sandbox, f"{errors}; {NOISE.format(n=60)}", background=True)
    bid = start["meta"]["background_id"]
    _wait_exit(sandbox, bid)
    env = sandbox.call("shell_status", {"id": bid}, max_bytes=max_bytes)
    text = ok_text(env)
    assert len(text.encode()) <= max_bytes and env["meta"]["error_lines"] == list(range(1, shown + 1))
    assert f"last {limits.STATUS_TAIL_LINES} lines of the log:" in text and text.endswith("step 60 ok")
