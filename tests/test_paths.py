"""Path confinement: every path the model gives must resolve, links followed, inside the home.

Behaviour is checked through file_read run by the built helper (a real process,
real links, FIFOs and sockets); the pure helpers of paths.py are table-tested.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from conftest import error_text, ok_text
from guilds_code import paths


@pytest.fixture
def home(sandbox):
    (sandbox.home / "sub").mkdir()
    (sandbox.home / "sub" / "f.txt").write_text("in sub\n")
    (sandbox.home / "top.txt").write_text("at top\n")
    outside = sandbox.home.parent / "outside.txt"
    outside.write_text("secret outside\n")
    evil = sandbox.home.parent / (sandbox.home.name + "-evil")
    evil.mkdir()
    (evil / "secret.txt").write_text("evil\n")
    return sandbox.home


def read(sandbox, path, **extra):
    return sandbox.call("file_read", {"path": path}, **extra)


def read_meta_path(sandbox, path, **extra):
    envelope = read(sandbox, path, **extra)
    ok_text(envelope)
    return envelope["meta"]["path"]


def outside(sandbox, path, **extra):
    assert error_text(read(sandbox, path, **extra)) == f"path: {path} is outside the home"


# --- which path is meant ----------------------------------------------------------
def test_relative_tilde_and_absolute_inside(sandbox, home):
    want = str(home / "sub" / "f.txt")
    assert read_meta_path(sandbox, "sub/f.txt") == want
    assert read_meta_path(sandbox, "~/sub/f.txt") == want
    assert read_meta_path(sandbox, want) == want
    assert read_meta_path(sandbox, "./sub/../sub/./f.txt") == want


def test_relative_path_starts_at_the_run_cwd(sandbox, home):
    assert read_meta_path(sandbox, "f.txt", cwd=str(home / "sub")) == str(home / "sub" / "f.txt")
    assert read_meta_path(sandbox, "../top.txt", cwd=str(home / "sub")) == str(home / "top.txt")


@pytest.mark.parametrize("path", ["..", "../outside.txt", "sub/../../outside.txt", "~/..", "~/../outside.txt"])
def test_dot_dot_out_of_the_home_is_refused(sandbox, home, path):
    outside(sandbox, path)


@pytest.mark.parametrize("path", ["/etc/passwd", "/", "/proc/self/environ", "/proc/self/root/etc/passwd",
                                  "/proc/self/cwd/top.txt", "/proc/self/fd/0"])
def test_absolute_outside_and_proc_magic_links_are_refused(sandbox, home, path):
    outside(sandbox, path)


def test_home_prefix_sibling_is_outside(sandbox, home):
    evil = f"{home}-evil/secret.txt"
    outside(sandbox, evil)
    outside(sandbox, f"../{home.name}-evil/secret.txt")
    os.symlink(evil, home / "to-evil")
    outside(sandbox, "to-evil")


def test_after_cd_slash_a_relative_path_is_outside(sandbox, home):
    runs = home / ".runs" / sandbox.run_id
    runs.mkdir(parents=True)
    (runs / "cwd").write_text("/")
    outside(sandbox, "etc/passwd")
    outside(sandbox, ".")
    assert read_meta_path(sandbox, str(home / "top.txt")) == str(home / "top.txt")


def test_request_cwd_outside_the_home(sandbox, home):
    outside(sandbox, "etc/passwd", cwd="/")
    rel = str(home / "top.txt").lstrip("/")
    assert read_meta_path(sandbox, rel, cwd="/") == str(home / "top.txt")


# --- links ------------------------------------------------------------------------
def test_link_to_outside_absolute_and_relative(sandbox, home):
    os.symlink(str(home.parent / "outside.txt"), home / "abs-out")
    os.symlink("../outside.txt", home / "rel-out")
    os.symlink("../../outside.txt", home / "sub" / "rel-out2")
    os.symlink("/proc/self/root/etc/passwd", home / "proc-out")
    for path in ["abs-out", "rel-out", "sub/rel-out2", "proc-out"]:
        outside(sandbox, path)


def test_link_inside_by_absolute_target_is_allowed(sandbox, home):
    os.symlink(str(home / "sub" / "f.txt"), home / "abs-in")
    os.symlink("sub/f.txt", home / "rel-in")
    want = str(home / "sub" / "f.txt")
    assert read_meta_path(sandbox, "abs-in") == want
    assert read_meta_path(sandbox, "rel-in") == want


def test_dot_dot_after_a_folder_link_is_physical(sandbox, home):
    (home / "sub" / "inner").mkdir()
    os.symlink("sub/inner", home / "d")
    assert read_meta_path(sandbox, "d/../f.txt") == str(home / "sub" / "f.txt")


def test_home_named_through_a_link(sandbox, home, tmp_path):
    alias = tmp_path / "alias"
    os.symlink(str(home), alias)
    os.symlink(str(home / "top.txt"), home / "real-abs")
    got = read_meta_path(sandbox, "real-abs", home=str(alias), cwd=str(alias))
    assert got == str(alias / "top.txt")


def test_link_loops_stop(sandbox, home):
    os.symlink("b", home / "a")
    os.symlink("a", home / "b")
    assert error_text(read(sandbox, "a")) == "path: a has too many levels of symbolic links"


def test_forty_links_are_followed_forty_one_are_not(sandbox, home):
    for i in range(41):
        os.symlink("top.txt" if i == 0 else f"l{i - 1}", home / f"l{i}")
    assert read_meta_path(sandbox, "l39") == str(home / "top.txt")
    assert "too many levels" in error_text(read(sandbox, "l40"))


# --- what is found ------------------------------------------------------------------
def test_missing_directory_and_not_a_directory(sandbox, home):
    assert error_text(read(sandbox, "nope.txt")) == "path: nope.txt not found"
    assert error_text(read(sandbox, "sub")) == "path: sub is a directory"
    assert error_text(read(sandbox, "~")) == "path: ~ is a directory"
    assert "not found" in error_text(read(sandbox, "top.txt/x"))


def test_fifo_is_refused_at_once(sandbox, home):
    os.mkfifo(home / "pipe")
    os.symlink("pipe", home / "to-pipe")
    started = time.monotonic()
    assert error_text(read(sandbox, "pipe", timeout=10)) == "path: pipe is not a regular file (fifo)"
    assert error_text(read(sandbox, "to-pipe", timeout=10)) == "path: to-pipe is not a regular file (fifo)"
    assert time.monotonic() - started < 10


def test_socket_and_device_are_refused(sandbox, home):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(home / "sock"))
        assert error_text(read(sandbox, "sock")) == "path: sock is not a regular file (socket)"
    try:
        os.mknod(home / "null", 0o600 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make a device here")
    assert error_text(read(sandbox, "null")) == "path: null is not a regular file (character device)"


def test_a_long_path_is_clipped_in_the_error(sandbox, home):
    given = "missing/" * 200 + "x"
    text = error_text(read(sandbox, given))
    assert len(text) < 300 and text.endswith("not found")


# --- the pure helpers -----------------------------------------------------------------
@pytest.mark.parametrize(
    "comps, base, want",
    [
        (["home", "agent", "x"], ["home", "agent"], ["x"]),
        (["home", "agent"], ["home", "agent"], []),
        (["home", "agent-evil", "x"], ["home", "agent"], None),
        (["home"], ["home", "agent"], None),
    ],
)
def test_below_compares_whole_components(comps, base, want):
    assert paths.below(comps, base) == want


@pytest.mark.parametrize(
    "path, cwd, want",
    [
        ("/h/a/src/x.py", "/h/a", "src/x.py"),
        ("/h/a", "/h/a", "."),
        ("/h/notes.md", "/h/a", "~/notes.md"),
        ("/h", "/h/a", "~"),
        ("/h/a/x", None, "~/a/x"),
        ("/h/ab/x", "/h/a", "~/ab/x"),
    ],
)
def test_display(path, cwd, want):
    assert paths.display(path, "/h", cwd) == want


def test_absolute_expands_tilde_and_joins_relative():
    assert paths.absolute("/h", "/h/a", "~") == "/h"
    assert paths.absolute("/h", "/h/a", "~/x") == "/h/x"
    assert paths.absolute("/h", "/h/a", "~x") == "/h/a/~x"
    assert paths.absolute("/h", "/h/a", "/etc") == "/etc"
