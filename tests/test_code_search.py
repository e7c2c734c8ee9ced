"""code_search through the built helper with the real rg: formats, limits, hostile inputs."""

from __future__ import annotations

import os
import sys
import time

import pytest

from conftest import error_text, ok_text, write
from guilds_code.ops import code_search


def search(sandbox, pattern, **kw):
    arg_names = ("path", "glob", "mode", "fixed", "ignore_case", "context", "limit")
    args = {"pattern": pattern, **{k: kw.pop(k) for k in list(kw) if k in arg_names}}
    return sandbox.call("code_search", args, **kw)


# --- files mode -------------------------------------------------------------------------
def test_files_mode_counts_matches_highest_first_ties_in_path_order(sandbox):
    write(sandbox, "b.py", "foo foo foo\n")
    write(sandbox, "a.py", "foo\nfoo\nfoo\n")
    write(sandbox, "c/d.py", "foo\n")
    write(sandbox, "none.py", "bar\n")
    envelope = search(sandbox, "foo")
    assert ok_text(envelope) == "a.py: 3 matches\nb.py: 3 matches\nc/d.py: 1 match\n7 matches in 3 files"
    assert envelope["meta"] == {"matches": 7, "files": 3}


def test_files_mode_lists_30_then_says_how_many_more(sandbox):
    for i in range(35):
        write(sandbox, f"f{i:02d}.txt", "hit\n" * (i + 1))
    lines = ok_text(search(sandbox, "hit")).split("\n")
    assert len(lines) == 32
    assert lines[0] == "f34.txt: 35 matches" and lines[29] == "f05.txt: 6 matches"
    assert lines[30:] == ["… 5 more files", "630 matches in 35 files"]


def test_limit_lowers_and_is_clamped_to_the_mode_maximum(sandbox):
    for i in range(35):
        write(sandbox, f"f{i:02d}.txt", "hit\n")
    assert ok_text(search(sandbox, "hit", limit=3)).split("\n")[3] == "… 32 more files"
    assert ok_text(search(sandbox, "hit", limit=40)).split("\n")[30] == "… 5 more files"
    assert error_text(search(sandbox, "hit", limit=41)) == "limit: must be from 1 to 40, got 41"


def test_no_match_names_the_pattern_and_path(sandbox):
    write(sandbox, "src/a.py", "x\n")
    envelope = search(sandbox, "nothing here")
    assert ok_text(envelope) == "no matches for 'nothing here' in ."
    assert envelope["meta"] == {"matches": 0, "files": 0}
    assert ok_text(search(sandbox, "zz", path="src")) == "no matches for 'zz' in src"
    assert ok_text(search(sandbox, "zz", path="~/src")) == "no matches for 'zz' in src"


def test_paths_are_relative_to_the_working_directory(sandbox):
    write(sandbox, "proj/src/a.py", "needle\n")
    write(sandbox, "other/b.py", "needle\n")
    cwd = str(sandbox.home / "proj")
    assert ok_text(search(sandbox, "needle", cwd=cwd)).split("\n")[0] == "src/a.py: 1 match"
    assert ok_text(search(sandbox, "needle", path="src", cwd=cwd)).split("\n")[0] == "src/a.py: 1 match"
    assert ok_text(search(sandbox, "needle", path="~/other", cwd=cwd)).split("\n")[0] == "~/other/b.py: 1 match"
    assert ok_text(search(sandbox, "needle", path="src/a.py", cwd=cwd)).split("\n")[0] == "src/a.py: 1 match"


def test_fixed_ignore_case_and_glob(sandbox):
    write(sandbox, "a.py", "a.b\nAXB\n")
    write(sandbox, "a.md", "a.b\n")
    assert ok_text(search(sandbox, "a.b", glob="*.py")) == "a.py: 1 match\n1 match in 1 file"
    assert ok_text(search(sandbox, "a.b", glob="*.py", ignore_case=True)).startswith("a.py: 2 matches")
    assert ok_text(search(sandbox, "a.b", fixed=True)).endswith("2 matches in 2 files")
    assert ok_text(search(sandbox, "a.b", glob="!*.md")) == "a.py: 1 match\n1 match in 1 file"


# --- content mode -------------------------------------------------------------------------
def test_content_mode_matches_context_and_groups(sandbox):
    write(sandbox, "a.py", "one\ntwo hit\nthree\nfour\nfive\nsix hit\nseven\n")
    write(sandbox, "b.py", "hit\n")
    envelope = search(sandbox, "hit", mode="content", context=1)
    assert ok_text(envelope) == "\n".join([
        "a.py-1- one", "a.py:2: two hit", "a.py-3- three", "--",
        "a.py-5- five", "a.py:6: six hit", "a.py-7- seven", "--",
        "b.py:1: hit", "3 matches in 2 files",
    ])
    assert envelope["meta"] == {"matches": 3, "files": 2}


def test_content_mode_without_context_has_no_group_breaks(sandbox):
    write(sandbox, "a.py", "hit\nx\nhit\n")
    assert ok_text(search(sandbox, "hit", mode="content")) == "a.py:1: hit\na.py:3: hit\n2 matches in 1 file"


def test_ten_matching_lines_per_file(sandbox):
    write(sandbox, "a.py", "hit\n" * 15)
    text = ok_text(search(sandbox, "hit", mode="content"))
    lines = text.split("\n")
    assert lines[:10] == [f"a.py:{i}: hit" for i in range(1, 11)]
    assert lines[10:] == ["10 matches in 1 file (counting at most 10 matching lines per file)"]


def test_forty_lines_then_how_many_more(sandbox):
    for i in range(6):
        write(sandbox, f"f{i}.py", "hit\n" * 8)
    envelope = search(sandbox, "hit", mode="content")
    lines = ok_text(envelope).split("\n")
    assert len([line for line in lines if ":" in line and "hit" in line]) == 40
    assert lines[-2:] == ["… 8 more lines", "48 matches in 6 files"]
    lines = ok_text(search(sandbox, "hit", mode="content", limit=5)).split("\n")
    assert lines[-2:] == ["… 43 more lines", "48 matches in 6 files"]


def test_300_characters_kept_longer_clipped(sandbox):
    write(sandbox, "a.txt", "hit" + "a" * 297 + "\n" + "hit" + "b" * 298 + "\n" + "hit" + "c" * 200_000 + "\n")
    lines = ok_text(search(sandbox, "hit", mode="content", max_bytes=65536)).split("\n")
    assert lines[0] == "a.txt:1: hit" + "a" * 297
    assert lines[1] == "a.txt:2: hit" + "b" * 297 + "… [+1 chars]"
    assert lines[2] == "a.txt:3: hit" + "c" * 297 + "… [+199703 chars]"


def test_crlf_and_separators_inside_lines(sandbox):
    write(sandbox, "a.txt", "hit one\r\nhit\ftwo\u2028x\n")
    text = ok_text(search(sandbox, "hit", mode="content"))
    assert text == "a.txt:1: hit one\na.txt:2: hit\ftwo\u2028x\n2 matches in 1 file"


def test_cap_stops_at_a_line_and_counts_what_it_left_out(sandbox):
    for i in range(4):
        write(sandbox, f"f{i}.txt", ("hit " + "x" * 200 + "\n") * 10)
    envelope = search(sandbox, "hit", mode="content", max_bytes=1024)
    text = ok_text(envelope)
    assert len(text.encode()) <= 1024
    lines = text.split("\n")
    shown = len(lines) - 2
    assert lines[-2] == f"[stopped to stay under 1024 bytes; {40 - shown} lines left out]"
    assert lines[-1] == "40 matches in 4 files (counting at most 10 matching lines per file)"


def test_files_mode_cap_counts_files_left_out(sandbox):
    for i in range(35):
        write(sandbox, f"{'d' * 60}/{i:02d}{'n' * 100}.txt", "hit\n")
    text = ok_text(search(sandbox, "hit", max_bytes=1024))
    lines = text.split("\n")
    assert len(text.encode()) <= 1024
    assert lines[-2] == f"[stopped to stay under 1024 bytes; {35 - (len(lines) - 2)} lines left out]"
    assert lines[-1] == "35 matches in 35 files"


# --- what is searched ---------------------------------------------------------------------
def test_gitignore_is_respected_hidden_files_searched_git_and_runs_skipped(sandbox):
    write(sandbox, ".gitignore", "ignored/\n*.log\n")
    write(sandbox, "ignored/a.txt", "hit\n")
    write(sandbox, "x.log", "hit\n")
    write(sandbox, ".hidden/conf", "hit\n")
    write(sandbox, ".git/config", "hit\n")
    write(sandbox, ".runs/run1/c1.log", "hit\n")
    write(sandbox, "kept.txt", "hit\n")
    assert ok_text(search(sandbox, "hit")) == ".hidden/conf: 1 match\nkept.txt: 1 match\n2 matches in 2 files"


def test_links_inside_the_tree_are_not_followed(sandbox, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("hit\n")
    os.symlink(str(tmp_path / "outside"), sandbox.home / "out")
    os.symlink(str(tmp_path / "outside" / "secret.txt"), sandbox.home / "secret-link")
    write(sandbox, "a.txt", "hit\n")
    assert ok_text(search(sandbox, "hit")) == "a.txt: 1 match\n1 match in 1 file"
    assert error_text(search(sandbox, "hit", path="out")) == "path: out is outside the home"


@pytest.mark.parametrize("path", ["..", "/etc", "/proc/self/root/etc", "~/.."])
def test_search_path_outside_the_home_is_refused(sandbox, path):
    assert error_text(search(sandbox, "root", path=path)) == f"path: {path} is outside the home"


def test_after_cd_slash_the_default_path_is_refused(sandbox):
    assert error_text(search(sandbox, "root", cwd="/")) == "path: . is outside the home"


def test_fifo_in_the_tree_is_skipped_and_as_the_path_refused(sandbox):
    write(sandbox, "a.txt", "hit\n")
    os.mkfifo(sandbox.home / "pipe")
    started = time.monotonic()
    assert ok_text(search(sandbox, "hit", timeout=20)) == "a.txt: 1 match\n1 match in 1 file"
    assert error_text(search(sandbox, "hit", path="pipe", timeout=20)) == "path: pipe is not a regular file (fifo)"
    assert time.monotonic() - started < 20


# --- hostile patterns, globs and config ----------------------------------------------------
def _marker_script(sandbox, tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "pre.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\ncat \"$1\"\n")
    script.chmod(0o755)
    return script, marker


def test_patterns_and_globs_starting_with_a_dash_are_not_options(sandbox, tmp_path):
    script, marker = _marker_script(sandbox, tmp_path)
    write(sandbox, "a.txt", f"--pre={script}\n-e\n")
    text = ok_text(search(sandbox, f"--pre={script}", fixed=True))
    assert text == "a.txt: 1 match\n1 match in 1 file"
    assert ok_text(search(sandbox, "-e", mode="content")) == "a.txt:2: -e\n1 match in 1 file"
    assert ok_text(search(sandbox, "-e", glob=f"--pre={script}")) == "no matches for '-e' in ."
    assert not marker.exists()


def test_a_planted_ripgreprc_is_ignored(sandbox, tmp_path):
    script, marker = _marker_script(sandbox, tmp_path)
    rc = write(sandbox, ".ripgreprc", f"--pre={script}\n--glob=!*.txt\n--max-count=1\n")
    sandbox.env["RIPGREP_CONFIG_PATH"] = str(rc)
    write(sandbox, "a.txt", "hit\nhit\n")
    assert ok_text(search(sandbox, "hit", glob="*.txt")) == "a.txt: 2 matches\n2 matches in 1 file"
    assert not marker.exists()


def test_invalid_regex_and_glob_are_errors_with_rgs_message(sandbox):
    write(sandbox, "a.txt", "x\n")
    assert error_text(search(sandbox, "(")) == "code_search: regex parse error: unclosed group"
    assert error_text(search(sandbox, "x", glob="{")).startswith("code_search: error parsing glob '{'")


# --- secrets ---------------------------------------------------------------------------------
def test_secrets_are_redacted_before_the_clip(sandbox):
    secret = "s3cr3t-" + "k" * 40
    sandbox.env["API_KEY"] = secret
    write(sandbox, "a.txt", "hit" + "x" * 290 + secret + "\n")
    text = ok_text(search(sandbox, "hit", mode="content", redact_env=["API_KEY"]))
    assert secret[:4] not in text
    assert text.split("\n")[0] == "a.txt:1: hit" + "x" * 290 + "[REDACT… [+3 chars]"


# --- the runner -------------------------------------------------------------------------------
def test_the_runner_kills_a_search_past_its_timeout():
    started = time.monotonic()
    code, _, timed_out = code_search.run_rg(["/bin/sleep", "30"], None, 0.5, lambda data: None)
    assert timed_out and code == -9
    assert time.monotonic() - started < 5


def test_the_runner_streams_stdout_and_keeps_a_bounded_stderr():
    chunks = []
    script = "import sys; sys.stdout.write('x' * 1000000); sys.stderr.write('e' * 100000)"
    code, err, timed_out = code_search.run_rg([sys.executable, "-c", script], None, 30, chunks.append)
    assert (code, timed_out) == (0, False)
    assert sum(map(len, chunks)) == 1_000_000 and len(err) == 4096


@pytest.mark.parametrize(
    "stderr, want",
    [
        (
            b"regex parse error:\n    (\n    ^\nerror: unclosed group\n",
            "code_search: regex parse error: unclosed group",
        ),
        (
            b"rg: regex parse error:\n    (?:()\n    ^\nerror: unclosed group\n",
            "code_search: regex parse error: unclosed group",
        ),
        (
            b"error parsing glob '{': unclosed alternate group\n",
            "code_search: error parsing glob '{': unclosed alternate group",
        ),
        (b"", "code_search: rg failed"),
    ],
)
def test_rg_errors_become_one_line(stderr, want):
    assert code_search.rg_error(stderr) == want


def test_content_parser_reads_notes_stats_and_split_chunks():
    lines = code_search.ContentLines(40, 1, None)
    out = (b"./b.dat: WARNING: stopped searching binary file after match (found \"\\0\" byte around offset 9)\n"
           b"./a.py\x001:hit\n./a.py\x002-ctx\n--\n./a.py\x009:hit\n"
           b"--\n\n3 matches\n2 matched lines\n2 files contained matches\n")
    for i in range(len(out)):
        lines.feed(out[i : i + 1])
    rows = [(row.kind, row.path, row.number, row.text) for row in lines.rows()]
    assert rows[:5] == [(":", b"./a.py", 1, "hit"), ("-", b"./a.py", 2, "ctx"), ("--", b"", 0, ""),
                        (":", b"./a.py", 9, "hit"), ("--", b"", 0, "")]
    assert rows[5][:2] == ("!", b"./b.dat") and rows[5][3].startswith("WARNING: stopped")
    assert lines.totals() == (3, 2)


def test_content_keeps_the_smallest_paths_whatever_the_order_rg_prints():
    lines = code_search.ContentLines(3, 0, None)
    for name in [b"d", b"b", b"e", b"a", b"c"]:
        lines.feed(b"./" + name + b"\x001:x\n./" + name + b"\x002:y\n")
    assert [(row.path, row.number) for row in lines.rows()] == [(b"./a", 1), (b"./a", 2), (b"./b", 1)]
    assert lines.entries == 10


def test_a_path_holding_a_newline_is_one_path():
    lines = code_search.ContentLines(40, 0, None)
    lines.feed(b"./odd\nname.py\x003:hit\n")
    assert [(row.path, row.number, row.text) for row in lines.rows()] == [(b"./odd\nname.py", 3, "hit")]


def test_a_timed_out_search_shows_what_it_found_then_says_so():
    counts = code_search.FileCounts()
    counts.feed(b"./a.py\x002\n./b.py\x001\n./c.p")
    args = {"pattern": "x", "mode": "files", "limit": None}
    tail = ["[timed out after 60s; the search was stopped]"]
    text = code_search._text(args, counts, ".", False, tail, 8192)
    assert text == "a.py: 2 matches\nb.py: 1 match\n3 matches in 2 files\n[timed out after 60s; the search was stopped]"
    assert code_search._text(args, code_search.FileCounts(), "src", False, tail, 8192) == (
        "no matches for 'x' in src\n[timed out after 60s; the search was stopped]"
    )


def test_a_link_to_a_folder_inside_the_home_is_searched_under_its_own_path(sandbox):
    write(sandbox, "real/a.txt", "hit\n")
    os.symlink("real", sandbox.home / "alias")
    assert ok_text(search(sandbox, "hit", path="alias")) == "real/a.txt: 1 match\n1 match in 1 file"
