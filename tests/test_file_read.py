"""file_read through the built helper: formats and limits at their edges, repeated reads, big files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from conftest import PYTHON, error_text, ok_text, write

DASH = "\u2013"


def read(sandbox, path, **kw):
    extra = {k: kw.pop(k) for k in list(kw) if k not in ("offset", "limit")}
    return sandbox.call("file_read", {"path": path, **kw}, **extra)


def numbered(n):
    return "".join(f"line {i}\n" for i in range(1, n + 1))


# --- the format -----------------------------------------------------------------------
def test_header_and_numbered_lines(sandbox):
    path = write(sandbox, "a.txt", "alpha\n\n  indented\n")
    envelope = read(sandbox, "a.txt")
    assert ok_text(envelope) == f"a.txt lines 1{DASH}3 of 3\n1  alpha\n2\n3    indented"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert envelope["meta"] == {"path": str(path), "range": [1, 3], "content_hash": digest, "lines": 3}


def test_numbers_align_to_the_widest_shown(sandbox):
    write(sandbox, "a.txt", numbered(12))
    text = ok_text(read(sandbox, "a.txt", offset=8, limit=3))
    assert text == f"a.txt lines 8{DASH}10 of 12\n 8  line 8\n 9  line 9\n10  line 10"


def test_default_limit_is_200_of_the_file(sandbox):
    write(sandbox, "a.txt", numbered(250))
    envelope = read(sandbox, "a.txt")
    assert ok_text(envelope).splitlines()[0] == f"a.txt lines 1{DASH}200 of 250"
    assert envelope["meta"]["range"] == [1, 200]


def test_limit_500_is_allowed_501_is_refused(sandbox):
    write(sandbox, "a.txt", "x\n" * 600)
    envelope = read(sandbox, "a.txt", limit=500, max_bytes=65536)
    assert envelope["meta"]["range"] == [1, 500]
    assert error_text(read(sandbox, "a.txt", limit=501)) == "limit: must be from 1 to 500, got 501"
    assert error_text(read(sandbox, "a.txt", offset=0)).startswith("offset: must be at least 1")


def test_range_stops_at_the_last_line(sandbox):
    write(sandbox, "a.txt", numbered(5))
    envelope = read(sandbox, "a.txt", offset=4, limit=10)
    assert ok_text(envelope) == f"a.txt lines 4{DASH}5 of 5\n4  line 4\n5  line 5"
    assert envelope["meta"]["range"] == [4, 5]


def test_offset_past_the_end_says_so(sandbox):
    path = write(sandbox, "a.txt", numbered(3))
    envelope = read(sandbox, "a.txt", offset=4)
    assert ok_text(envelope) == "a.txt has 3 lines; offset 4 is past the end"
    assert envelope["meta"] == {
        "path": str(path), "lines": 3, "content_hash": hashlib.sha256(path.read_bytes()).hexdigest()
    }
    write(sandbox, "one.txt", "x")
    assert ok_text(read(sandbox, "one.txt", offset=2)) == "one.txt has 1 line; offset 2 is past the end"


def test_empty_file_says_so(sandbox):
    write(sandbox, "e.txt", "")
    envelope = read(sandbox, "e.txt")
    assert ok_text(envelope) == "e.txt is empty"
    assert envelope["meta"]["lines"] == 0 and "range" not in envelope["meta"]


# --- what a line is -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "data, lines",
    [
        ("a\nb", 2),  # a last line without newline counts
        ("a\nb\n", 2),  # a trailing newline does not start a line
        ("\n", 1),
        ("\n\n", 2),
        ("a\fb\u2028c\u2029d\x85e\x0bf\x1cg\rh\n", 1),  # only \n splits
    ],
)
def test_line_count_is_wc_l_plus_a_last_line_without_newline(sandbox, data, lines):
    write(sandbox, "a.txt", data)
    envelope = read(sandbox, "a.txt")
    assert envelope["meta"]["lines"] == lines
    assert len(ok_text(envelope).splitlines()[1:]) >= 1


def test_separators_inside_a_line_do_not_split_it(sandbox):
    write(sandbox, "a.txt", "one\fform\u2028sep\nnext\n")
    text = ok_text(read(sandbox, "a.txt"))
    assert text.split("\n") == [f"a.txt lines 1{DASH}2 of 2", "1  one\fform\u2028sep", "2  next"]


def test_crlf_lines_show_without_the_carriage_return(sandbox):
    write(sandbox, "a.txt", b"one\r\ntwo\r\nthree")
    envelope = read(sandbox, "a.txt")
    assert ok_text(envelope) == f"a.txt lines 1{DASH}3 of 3\n1  one\n2  two\n3  three"


def test_invalid_utf8_shows_replacement_characters(sandbox):
    write(sandbox, "a.txt", b"caf\xe9\n")
    assert ok_text(read(sandbox, "a.txt")).endswith("1  caf\ufffd")


# --- clipping -------------------------------------------------------------------------------
def test_400_characters_are_kept_401_are_clipped(sandbox):
    write(sandbox, "a.txt", "a" * 400 + "\n" + "b" * 401 + "\n" + "é" * 401 + "\n" + "c" * 100_000 + "\r\n")
    rows = ok_text(read(sandbox, "a.txt")).split("\n")[1:]
    assert rows[0] == "1  " + "a" * 400
    assert rows[1] == "2  " + "b" * 400 + "… [+1 chars]"
    assert rows[2] == "3  " + "é" * 400 + "… [+1 chars]"
    assert rows[3] == "4  " + "c" * 400 + "… [+99600 chars]"


def test_long_line_of_wide_characters_counts_characters(sandbox):
    write(sandbox, "a.txt", "😀" * 5000 + "\n")
    row = ok_text(read(sandbox, "a.txt")).split("\n")[1]
    assert row == "1  " + "😀" * 400 + "… [+4600 chars]"


# --- binary ---------------------------------------------------------------------------------
def test_nul_in_the_first_8000_bytes_is_binary(sandbox):
    path = write(sandbox, "b.bin", b"x" * 7999 + b"\0" + b"y" * 100)
    envelope = read(sandbox, "b.bin")
    assert ok_text(envelope) == "b.bin is a binary file (8100 bytes); not shown"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert envelope["meta"] == {"path": str(path), "content_hash": digest}


def test_nul_after_8000_bytes_is_text(sandbox):
    write(sandbox, "t.txt", b"x" * 8000 + b"\0\nnext\n")
    envelope = read(sandbox, "t.txt")
    assert envelope["meta"]["lines"] == 2
    assert ok_text(envelope).endswith("2  next")


# --- the byte cap -----------------------------------------------------------------------------
def _cap_rows(text):
    return [row for row in text.split("\n")[1:] if not row.startswith("[")]


def test_cap_stops_at_a_line_and_says_where_to_continue(sandbox):
    write(sandbox, "a.txt", "".join(f"{i:03d} " + "x" * 95 + "\n" for i in range(1, 101)))
    envelope = read(sandbox, "a.txt", max_bytes=1024)
    text = ok_text(envelope)
    assert len(text.encode()) <= 1024
    last = envelope["meta"]["range"][1]
    lines = text.split("\n")
    assert lines[0] == f"a.txt lines 1{DASH}{last} of 100"
    assert lines[-1] == f"[stopped at line {last} to stay under 1024 bytes; continue with offset {last + 1}]"
    assert _cap_rows(text)[-1].startswith(f"{last}  {last:03d} ")
    # one more line would not have fitted: each row is 3 + 4 + 95 characters and a newline
    assert len(text.encode()) + 103 > 1024
    following = ok_text(read(sandbox, "a.txt", offset=last + 1, max_bytes=1024))
    assert _cap_rows(following)[0].startswith(f"{last + 1}  {last + 1:03d} ")


def test_a_range_that_fits_exactly_has_no_stop_line(sandbox):
    write(sandbox, "a.txt", "x" * 10 + "\n")
    text = ok_text(read(sandbox, "a.txt"))
    envelope = read(sandbox, "a.txt", max_bytes=1024)
    assert ok_text(envelope) == text and "[stopped" not in text


def test_one_line_wider_than_the_cap_is_clipped_to_fit(sandbox):
    write(sandbox, "a.txt", "😀" * 500 + "\nnext\n")
    envelope = read(sandbox, "a.txt", max_bytes=1024)
    text = ok_text(envelope)
    assert len(text.encode()) <= 1024
    assert envelope["meta"]["range"] == [1, 1]
    assert text.endswith("[stopped at line 1 to stay under 1024 bytes; continue with offset 2]")


# --- relative paths in the header ----------------------------------------------------------------
def test_header_path_is_relative_to_the_cwd_or_under_the_home(sandbox):
    write(sandbox, "proj/src/a.py", "x\n")
    write(sandbox, "notes.md", "n\n")
    cwd = str(sandbox.home / "proj")
    assert ok_text(read(sandbox, "src/a.py", cwd=cwd)).startswith(f"src/a.py lines 1{DASH}1 of 1")
    assert ok_text(read(sandbox, "../notes.md", cwd=cwd)).startswith(f"~/notes.md lines 1{DASH}1")
    assert ok_text(read(sandbox, str(sandbox.home / "notes.md"), cwd="/")).startswith("~/notes.md lines")


# --- repeated reads ----------------------------------------------------------------------------------
def _ledger(envelope, seq):
    meta = envelope["meta"]
    return {"path": meta["path"], "range": meta["range"], "content_hash": meta["content_hash"], "seq": seq}


def test_same_lines_same_hash_give_a_pointer(sandbox):
    write(sandbox, "a.txt", numbered(50))
    first = read(sandbox, "a.txt", offset=1, limit=30)
    again = read(sandbox, "a.txt", offset=5, limit=10, reads=[_ledger(first, 7)])
    assert ok_text(again) == f"a.txt lines 5{DASH}14: unchanged since step 7; read that result."
    assert again["meta"] == {
        "path": first["meta"]["path"], "range": [5, 14], "content_hash": first["meta"]["content_hash"],
        "lines": 50, "repeat_of": 7,
    }


def test_pointer_names_the_latest_covering_read(sandbox):
    write(sandbox, "a.txt", numbered(10))
    first = read(sandbox, "a.txt")
    reads = [_ledger(first, 3), _ledger(first, 9), {**_ledger(first, 12), "range": [2, 10]}]
    assert "unchanged since step 9;" in ok_text(read(sandbox, "a.txt", reads=reads))


def test_a_changed_file_returns_content(sandbox):
    path = write(sandbox, "a.txt", numbered(10))
    first = read(sandbox, "a.txt")
    path.write_text(numbered(10) + "more\n")
    again = read(sandbox, "a.txt", reads=[_ledger(first, 2)])
    assert "repeat_of" not in again["meta"]
    assert ok_text(again).startswith(f"a.txt lines 1{DASH}11 of 11")


def test_a_partly_covered_range_returns_content(sandbox):
    write(sandbox, "a.txt", numbered(50))
    first = read(sandbox, "a.txt", offset=1, limit=20)
    again = read(sandbox, "a.txt", offset=10, limit=20, reads=[_ledger(first, 2)])
    assert "repeat_of" not in again["meta"]
    assert ok_text(again).startswith(f"a.txt lines 10{DASH}29 of 50")


def test_another_path_with_the_same_content_returns_content(sandbox):
    write(sandbox, "a.txt", numbered(5))
    write(sandbox, "b.txt", numbered(5))
    first = read(sandbox, "a.txt")
    again = read(sandbox, "b.txt", reads=[_ledger(first, 2)])
    assert "repeat_of" not in again["meta"]


def test_pointer_through_a_link_names_the_resolved_file(sandbox):
    write(sandbox, "a.txt", numbered(5))
    os.symlink("a.txt", sandbox.home / "link.txt")
    first = read(sandbox, "a.txt")
    again = read(sandbox, "link.txt", reads=[_ledger(first, 4)])
    assert ok_text(again) == f"a.txt lines 1{DASH}5: unchanged since step 4; read that result."


# --- secrets ---------------------------------------------------------------------------------------
def test_secrets_are_redacted_before_the_clip(sandbox):
    secret = "s3cr3t-" + "k" * 40
    token = "ghp_" + "t" * 36
    sandbox.env["API_KEY"] = secret
    (sandbox.state / sandbox.agent_id).mkdir()
    (sandbox.state / sandbox.agent_id / "repos.json").write_text(json.dumps({str(sandbox.home): token}))
    write(sandbox, "a.txt", "x" * 390 + secret + "\n" + "y" * 395 + token + "\n")
    text = ok_text(read(sandbox, "a.txt", redact_env=["API_KEY"]))
    assert secret[:5] not in text and token[:5] not in text
    assert "x" * 390 + "[REDACTED]" in text
    assert "y" * 395 + "[REDA… [+5 chars]" in text


# --- big files ---------------------------------------------------------------------------------------
def _run_measured(sandbox, args, timeout=120):
    """Run one file_read in a wrapper process; (envelope, the helper's peak RSS in KiB)."""
    import base64

    req = base64.b64encode(json.dumps(sandbox.request("file_read", args)).encode()).decode()
    script = (
        "import resource, subprocess, sys\n"
        "out = subprocess.run(sys.argv[1:], capture_output=True).stdout\n"
        "sys.stdout.write(out.decode().strip() + ' ' + str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    )
    proc = subprocess.run(
        [PYTHON, "-c", script, PYTHON, "-I", "-S", str(sandbox.helper), req],
        env=sandbox.process_env(), capture_output=True, timeout=timeout, check=True,
    )
    from guilds_code.protocol import decode_envelope

    line, rss = proc.stdout.split()
    return decode_envelope(line), int(rss)


@pytest.mark.slow
def test_a_300_mb_single_line_reads_in_bounded_memory(sandbox):
    path = sandbox.home / "one-line.txt"
    with open(path, "wb") as fh:
        fh.write(b"start " + b"x" * 8000)
        fh.truncate(300 * 1024 * 1024)  # the rest reads as NUL bytes: one 300 MB line
    envelope, rss = _run_measured(sandbox, {"path": "one-line.txt"})
    row = ok_text(envelope).split("\n")[1]
    assert row == "1  start " + "x" * 394 + f"… [+{300 * 1024 * 1024 - 400} chars]"
    assert envelope["meta"]["lines"] == 1
    assert rss < 40 * 1024, f"peak RSS {rss} KiB"


@pytest.mark.slow
def test_a_large_sparse_file_hashes_whole_in_bounded_memory(sandbox):
    path = sandbox.home / "big.txt"
    size = 1024 * 1024 * 1024
    with open(path, "wb") as fh:
        fh.write(numbered(300).encode() + b"x" * 8000 + b"\n")
        fh.truncate(size)
    envelope, rss = _run_measured(sandbox, {"path": "big.txt", "offset": 299, "limit": 2})
    assert ok_text(envelope).split("\n")[:3] == [f"big.txt lines 299{DASH}300 of 302", "299  line 299", "300  line 300"]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    assert envelope["meta"]["content_hash"] == digest.hexdigest()
    assert rss < 40 * 1024, f"peak RSS {rss} KiB"


# --- counting lines beside the hash ------------------------------------------------------------
@pytest.mark.parametrize("count_mode", ["none", "wc", "wc-fails"])
def test_line_count_is_the_same_however_it_is_counted(tmp_path, count_mode):
    from guilds_code import redact
    from guilds_code.ops import file_read

    lines = 1_100_000
    path = tmp_path / "big.txt"
    path.write_bytes(b"0123456789abcdef\n" * lines + b"tail")
    assert path.stat().st_size >= file_read.limits.READ_COUNT_CHILD_MIN_BYTES
    fd = os.open(path, os.O_RDONLY)
    count_fd = {"none": None, "wc": os.open(path, os.O_RDONLY), "wc-fails": os.open(path, os.O_WRONLY)}[count_mode]
    try:
        result = file_read.scan(fd, 3, 4, redact.Redactor([]), count_fd)
    finally:
        for opened in (fd, count_fd):
            if opened is not None:
                os.close(opened)
    assert result.lines == lines + 1
    assert [text for text, _ in result.rows] == ["0123456789abcdef"] * 2
    assert result.digest == hashlib.sha256(path.read_bytes()).hexdigest()
