"""Shaping: the pure transforms, their stream forms, the bounded capture, render."""

from __future__ import annotations

import re

import pytest

from guilds_code import limits, shaping
from guilds_code.redact import Redactor

MARKER_RE = re.compile(r"\[… (\d+) bytes elided; full output: (.+) …\]\n")


def shape_in_pieces(data: bytes, size: int, redactor=None) -> bytes:
    shaper = shaping.Shaper(redactor)
    out = b"".join(shaper.feed(data[i : i + size]) for i in range(0, len(data), size))
    return out + shaper.flush()


@pytest.mark.parametrize(
    "raw, shaped",
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b[1;32;48;5;21mx\x1b[K", "x"),
        ("\x1b]0;title\x07a", "a"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),
        ("\x1bP1$r0m\x1b\\b", "b"),
        ("\x1b(Bc\x1b7d\x1b=e", "cde"),
        ("\x9b2Jf", "f"),
        ("stray\x1b\nonly", "stray\nonly"),
        ("no escapes at all", "no escapes at all"),
    ],
)
def test_strip_ansi(raw, shaped):
    assert shaping.strip_ansi(raw) == shaped


@pytest.mark.parametrize(
    "raw, shaped",
    [
        ("a\rb", "b"),
        ("abc\rX\n", "X\n"),
        ("one\r\ntwo\r\n", "one\ntwo\n"),
        ("keep\r\r\n", "keep\n"),
        ("10%\r50%\r100%\r", "100%"),
        ("x\r\ry", "y"),
        ("l1\nl2\rL2\nl3", "l1\nL2\nl3"),
    ],
)
def test_redraw(raw, shaped):
    assert shaping.redraw(raw) == shaped


def test_stream_shaping_equals_whole_shaping_at_every_split():
    raw = "é\x1b[31mred\x1b[0m\x1b]0;t\x1b\\ok 1%\r2%\r\n€ done\r\n\x1b[1A\x1b[2Klast\r".encode()
    whole = shaping.shape_bytes(raw)
    assert whole == "2%\n€ done\nlast".encode()
    for size in range(1, 9):
        assert shape_in_pieces(raw, size) == whole


def test_secret_split_by_an_escape_and_across_chunks_is_redacted():
    redactor = Redactor(["supersecretvalue"])
    raw = b"xx super\x1b[1msecr\x1b[0metvalue yy\n"
    for size in (1, 3, 7, 64):
        assert shape_in_pieces(raw, size, redactor) == b"xx [REDACTED] yy\n"


def test_open_escape_longer_than_the_limit_becomes_text():
    raw = b"\x1b]" + b"x" * (limits.ANSI_SEQUENCE_MAX + 10) + b"\n"
    out = shape_in_pieces(raw, 1000)
    assert out == b"]" + b"x" * (limits.ANSI_SEQUENCE_MAX + 10) + b"\n"


def test_invalid_utf8_is_replaced():
    assert shaping.shape_bytes(b"a\xffb\xe2\x82") == "a\ufffdb\ufffd".encode()


def test_redraw_state_stays_bounded_on_one_huge_line():
    shaper = shaping.Shaper()
    out = 0
    for _ in range(40):
        out += len(shaper.feed(b"y" * limits.READ_CHUNK))
        assert len(shaper._lines._line) <= limits.REDRAW_PENDING_MAX + limits.READ_CHUNK
    out += len(shaper.flush())
    assert out == 40 * limits.READ_CHUNK


def test_progress_redraws_keep_only_the_last_state_across_chunks():
    shaper = shaping.Shaper()
    out = b"".join(shaper.feed(f"\rprogress {i}%".encode()) for i in range(101))
    out += shaper.feed(b"\n") + shaper.flush()
    assert out == b"progress 100%\n"


def test_capture_keeps_start_and_tail_only():
    capture = shaping.Capture(1000)
    for i in range(10000):
        capture.add(b"%05d\n" % i)
    assert capture.total == 60000 and not capture.complete
    assert capture.start() == b"".join(b"%05d\n" % i for i in range(1000 // 6 + 1))[:1000]
    assert capture.tail(12) == b"\n09998\n09999\n"
    assert len(capture._tail) <= 2 * (limits.TAIL_BYTES + 1)


def _capture_of(data: bytes, max_bytes: int) -> shaping.Capture:
    capture = shaping.Capture(max_bytes)
    for i in range(0, len(data), 777):
        capture.add(data[i : i + 777])
    return capture


def test_render_fits_whole_with_trailers():
    cap = _capture_of(b"hello\nworld\n", 8192)
    assert shaping.render(cap, 8192, "/l.log", []) == ("hello\nworld", False)
    assert shaping.render(cap, 8192, "/l.log", ["exit_code: 2"]) == ("hello\nworld\nexit_code: 2", False)
    assert shaping.render(_capture_of(b"", 8192), 8192, "/l", ["exit_code: 1"]) == ("(no output)\nexit_code: 1", False)


def split_elided(text: str, data: bytes):
    """head, N, log, tail of an elided text (trailers left on the tail); the
    newline before the marker belongs to the head only when data has it."""
    match = MARKER_RE.search(text)
    assert match, text[:300]
    head = text[: match.start()]
    if not data.startswith(head.encode()):
        assert head.endswith("\n")
        head = head[:-1]
    return head, int(match.group(1)), match.group(2), text[match.end() :]


@pytest.mark.parametrize("max_bytes", [1024, 1500, 4096, 8192, 65536])
@pytest.mark.parametrize("kind", ["lines", "one_line", "multibyte"])
def test_render_elides_exactly_and_stays_under_the_cap(max_bytes, kind):
    if kind == "lines":
        data = "".join(f"line {i}\n" for i in range(20000)).encode()
    elif kind == "one_line":
        data = b"z" * 200000
    else:
        data = ("é€😀" * 30000 + "\n").encode()
    trailers = ["[timed out after 5s; the command was stopped]", "exit_code: 124"]
    text, elided = shaping.render(_capture_of(data, max_bytes), max_bytes, "/home/a/.runs/r/c1.log", trailers)
    assert elided and shaping.utf8_len(text) <= max_bytes
    head, n, log, tail = split_elided(text, data)
    assert log == "/home/a/.runs/r/c1.log"
    assert tail.endswith("\n" + "\n".join(trailers))
    tail = tail[: -len("\n".join(trailers)) - 1]
    head_b, tail_b = head.encode(), tail.encode()
    assert data.startswith(head_b) and len(head_b) <= min(limits.HEAD_BYTES, max_bytes // 4)
    assert data.rstrip(b"\n").endswith(tail_b)
    assert len(head_b) + n + len(tail_b) + (len(data) - len(data.rstrip(b"\n"))) == len(data)
    if kind == "lines":
        assert head.endswith("\n") and tail.startswith("line ")
    if max_bytes >= 8192:
        assert 5000 <= len(tail_b) <= limits.TAIL_BYTES


def test_secret_at_every_cut_never_leaves_a_fragment():
    secret = "Sx9-very-secret-token-value-42"
    redactor = Redactor([secret])
    s = secret.encode()
    for shift in range(0, 100, 3):
        for data in (
            b"a" * (2000 + shift) + s + b"b" * 40000 + s + b"c" * (6000 + shift),
            b"d" * (8150 + shift) + s + b"e" * 10,
            b"f" * (8150 + shift) + s,
        ):
            capture = _capture_of(shape_in_pieces(data, 4096, redactor), 8192)
            text, _ = shaping.render(capture, 8192, "/l.log", ["exit_code: 1"])
            for i in range(len(secret) - 7):
                assert secret[i : i + 8] not in text


def test_marker_is_never_shaped_twice():
    data = b"[\xe2\x80\xa6 7 bytes elided; full output: /fake \xe2\x80\xa6]\n" * 2000
    text, _ = shaping.render(_capture_of(data, 8192), 8192, "/real.log", [])
    assert len(re.findall(r"full output: /real\.log", text)) == 1


@pytest.mark.parametrize(
    "seconds, shown",
    [(0, "0s"), (12.7, "12s"), (59, "59s"), (60, "1m00s"), (184, "3m04s"), (3599, "59m59s"),
     (3600, "1h00m"), (3720, "1h02m"), (86399, "23h59m"), (86400, "1d00h"), (-3, "0s")],
)
def test_elapsed(seconds, shown):
    assert shaping.elapsed(seconds) == shown


def test_cap_text_cuts_on_a_character_boundary():
    assert shaping.cap_text("aé€", 4) == "aé"
    assert shaping.cap_text("abc", 3) == "abc"
