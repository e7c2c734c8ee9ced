"""Error lines kept through elision: shell and shell_status through the built helper, real bash."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import pytest

from conftest import ok_text, write
from guilds_code import errorlines, fileprint, limits
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


@pytest.mark.parametrize("line, rank", [
    ("src/x.c:1:2: error: no", 0), ("make: *** [all] Error 1", 1), ("ValueError: bad", 0),
    ("--- FAIL: TestX", 0), ("Exception in thread main", 1), ("npm ERR! code 1", 0),
    ("thread 'main' panicked at", 1), ("fatal: not a git repository", 0), ("E   assert x", 0),
    ("Segmentation fault (core dumped)", 0), ("ERROR: boom", 0), ("error[E0308]: mismatched types", 0),
    ("FAILED tests/t.py::test_a - ValueError: bad", 0),
    ("Exception in thread \"main\" java.lang.IllegalStateException: boom", 0),
    ('    raise ValueError("bad")', 1), ("src/a.py:10: ValueError", 1), ("except ValueError:", 1),
    ("Traceback (most recent call last):", 1),
    ("cc -Werror -c x.c", None), ("0 errors, 3 warnings", None), ("error_count = 0", None),
    ("E  two spaces", None), ("all good", None), ("Errors: 0", None),
])
def test_what_counts_as_an_error_line_and_its_rank(tmp_path, line, rank):
    """Rank 0 states an error, rank 1 only names one (errorlines.classify)."""
    log = tmp_path / "l.log"
    log.write_text(f"a\n{line}\nb\n")
    assert errorlines.scan(str(log), 1, Redactor([])) == ([] if rank is None else [(2, line.strip(), rank)])


def test_a_scan_reads_at_most_its_limit(tmp_path):
    log = tmp_path / "big.log"
    filler = b"ok\n" * (limits.ERROR_SCAN_MAX_BYTES // 3)
    log.write_bytes(filler + b"error: past the limit\n")
    assert errorlines.scan(str(log), 1, None, seconds=120) == []
    log.write_bytes(filler[: -6] + b"error\n")
    assert errorlines.scan(str(log), 1, None, seconds=120) == [(len(filler) // 3 - 1, "error", 0)]
    began = time.monotonic()
    assert errorlines.scan(str(log), 1, None, seconds=0.05) == []  # the clock stops it first
    assert time.monotonic() - began < 0.05 + 1.0


def test_a_scan_starts_at_its_first_line_and_stops_before_its_offset(tmp_path):
    log = tmp_path / "l.log"
    log.write_bytes(b"error one\nok\nerror three\nerror four\n")
    assert errorlines.scan(str(log), 2, None) == [(3, "error three", 0), (4, "error four", 0)]
    assert errorlines.scan(str(log), 1, None, stop_offset=len(b"error one\nok\n")) == [(1, "error one", 0)]
    assert errorlines.scan(str(tmp_path / "missing.log"), 1, None) == []


# --- only errors, and distinct ones ---------------------------------------------------
SOURCE = Path(argparse.__file__).read_text()  # a real module: raise ValueError(...), ArgumentError


@pytest.mark.parametrize("command", [
    "cat src/cli.py", "sed -n '1,2500p' src/cli.py", "head -n 2000 src/cli.py",
    "nl -ba src/cli.py | sed -n '40,2400p'", "cd src && cat cli.py 2>&1",
    "git --no-pager diff --no-index /dev/null src/cli.py || true",
    "for f in src/*.py; do echo \"== $f\"; cat \"$f\"; done",
])
def test_a_printed_source_file_lists_no_error_lines(sandbox, command):
    write(sandbox, "src/cli.py", SOURCE)
    env = sh(sandbox, command)
    text = ok_text(env)
    assert MARKER_RE.search(text) and ERRORS_HEADER not in text and "error_lines" not in env["meta"]
    # what the log's elided part holds: the file's own raise and except lines, that a list would show
    in_log = errorlines.scan(env["meta"]["log_path"], 60, None)
    assert len(in_log) >= limits.ERROR_LINES_MAX and any("raise ValueError" in t for _, t, _ in in_log)


def test_a_file_printed_beside_a_failing_command_lists_its_errors(sandbox):
    write(sandbox, "src/cli.py", SOURCE)
    env = sh(sandbox, "cat src/cli.py; python3 -c 'raise ValueError(\"bad flag\")'; seq 1 3000")
    assert any(text == "ValueError: bad flag" for _, text in listed(ok_text(env)))


@pytest.mark.parametrize("command, prints", [
    ("cat a.py", True), ("sed -n 1,400p src/a.py", True), ("cd src && cat a.py | head -300", True),
    ("LC_ALL=C grep -rn raise src", True), ("git -C repo --no-pager show HEAD:a.py", True),
    ("while read f; do head -50 \"$f\"; done < list", True), ("find . -name '*.py' | xargs cat", True),
    ("cat a.py; pytest", False), ("cat a.py\npython3 x.py", False), ("pytest", False), ("echo hi", False),
    ("cat $(ls)", False), ("cat <<EOF\nx\nEOF", False), ("cat 'unbalanced", False), ("git commit -m x", False),
    ("(cat a.py)", False), ("cat a.py > b.py; make", False),
])
def test_what_counts_as_a_file_print(command, prints):
    assert fileprint.prints_files(command) is prints


PYTEST_MODULE = '''
def _parse(text, depth):
    if not isinstance(text, str):
        raise TypeError(f"not text: {text!r}")
    if depth:
        return _parse(text, depth - 1)
    if not text.isdigit():
        raise ValueError(f"not a number: {text!r}")
    return int(text)


def test_a_long_traceback():
    try:
        _parse("x", 20)
    except ValueError as exc:
        raise RuntimeError("parsing the config failed") from exc


def test_lists():
    assert [1, 2, 3] == [1, 2, 4]


def test_dicts():
    assert {"name": "a", "size": 1} == {"name": "a", "size": 2}


def test_missing_key():
    raise KeyError("missing")
''' + "".join(f"\n\ndef test_more_{i}():\n    assert {i} * 2 == {i * 2 + 1}\n" for i in range(30))


def test_a_failing_test_run_lists_distinct_errors(sandbox):
    """pytest --tb=long prints _parse's source in each of its 21 frames, each with
    `raise TypeError(...)`: the first error lines of the elided part are all that
    one line of one traceback; the list names five different errors instead."""
    write(sandbox, "test_fail.py", PYTEST_MODULE)
    env = sh(sandbox, f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -p no:cacheprovider "
                      "--tb=long test_fail.py")
    text = ok_text(env)
    assert text.endswith("exit_code: 1"), text
    shown = [" ".join(t.split()) for _, t in listed(text)]
    assert shown == ["E ValueError: not a number: 'x'", "E RuntimeError: parsing the config failed",
                     "E assert [1, 2, 3] == [1, 2, 4]",
                     "E AssertionError: assert {'name': 'a', 'size': 1} == {'name': 'a', 'size': 2}",
                     "E KeyError: 'missing'"]
    log = env["meta"]["log_path"]
    assert [log_line(log, n) for n in env["meta"]["error_lines"]] == [t for _, t in listed(text)]
    first = env["meta"]["error_lines"][0]
    before = [n for n, _, _ in errorlines.scan(log, 1, None, want=100) if n < first]
    assert len(before) >= 20 and {log_line(log, n).strip() for n in before[:20]} == {
        'raise TypeError(f"not text: {text!r}")'}  # the first lines in order: one line of one traceback


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
