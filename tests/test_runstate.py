"""runstate: the run folder, the working directory, repository tokens."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from guilds_code import limits, runstate
from guilds_code.protocol import Request


@pytest.fixture
def req(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv(limits.STATE_DIR_ENV, str(state))
    return Request(
        op="shell", args={}, run_id="run1", agent_id="agent1", call_id="c1",
        home=str(home), cwd=str(home),
    )


def test_atomic_write_replaces_a_link_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "state"
    link.symlink_to(victim)
    runstate.atomic_write(str(link), b"new")
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert oct(link.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "victim"]


def test_run_dir_is_made_private_and_moves_a_link_aside(req, tmp_path):
    path = runstate.run_dir(req)
    assert path == os.path.join(req.home, ".runs", "run1")
    assert os.stat(path).st_mode & 0o777 == 0o700
    req.run_id = "run2"
    link = os.path.join(req.home, ".runs", "run2")
    os.symlink(tmp_path, link)
    notes = []
    assert runstate.run_dir(req, notes) == link
    assert os.path.isdir(link) and not os.path.islink(link)
    [note] = notes
    aside = note.split(" moved it to ")[1].split(" and ")[0]
    assert note == f"note: {link} was a link; moved it to {aside} and made the state anew"
    assert os.readlink(aside) == str(tmp_path)  # kept, not followed, not deleted


@pytest.mark.parametrize("kind", ["link", "file"])
def test_runs_link_or_file_moved_aside(req, tmp_path, kind):
    runs = os.path.join(req.home, ".runs")
    if kind == "link":
        os.symlink(tmp_path, runs)
    else:
        with open(runs, "wb") as fh:
            fh.write(b"mine")
    notes = []
    assert runstate.run_dir(req, notes) == os.path.join(runs, "run1")
    assert len(notes) == 1 and f"{runs} was a {kind}; moved it to {runs}.aside-" in notes[0]
    assert sorted(os.listdir(tmp_path)) == ["home", "state"]


def test_run_dir_that_cannot_be_had_is_a_note(req, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    req.home = str(blocker / "home")  # no folder can be made under a file, even by root
    notes = []
    assert runstate.run_dir(req, notes) is None
    assert notes == [(f"note: this call's working directory and log could not be kept: "
                     f"cannot make {blocker}/home/.runs: Not a directory")]


def test_new_run_prunes_to_the_most_recent(req, tmp_path):
    runs = os.path.join(req.home, ".runs")
    os.mkdir(runs)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    now = time.time()
    for i in range(limits.RUNS_KEPT + 3):
        path = os.path.join(runs, f"old{i:02d}")
        os.mkdir(path)
        os.symlink(outside, os.path.join(path, "link"))
        os.utime(path, (now - 1000 + i, now - 1000 + i))
    os.symlink(outside, os.path.join(runs, "alink"))
    runstate.run_dir(req)
    kept = sorted(e for e in os.listdir(runs) if e.startswith("old"))
    assert len(kept) == limits.RUNS_KEPT - 1
    assert kept[0] == "old04"
    assert "run1" in os.listdir(runs) and os.path.islink(os.path.join(runs, "alink"))
    assert (outside / "precious").exists()


def test_a_folder_a_call_holds_is_not_pruned_however_many_runs_follow(req):
    """A call holds its run folder (a shared lock) while it runs: more than RUNS_KEPT newer
    runs made meanwhile prune the others, never it; let go, the next prune takes it."""
    first = runstate.run_dir(req)
    held = runstate.hold(first)
    assert held is not None
    old = time.time() - 1000
    os.utime(first, (old, old))
    other = os.path.join(req.home, ".runs", "other")
    os.mkdir(other)
    os.utime(other, (old - 1, old - 1))
    try:
        for i in range(limits.RUNS_KEPT + 2):
            req.run_id = f"later{i:02d}"
            runstate.run_dir(req)
        assert os.path.isdir(first) and not os.path.exists(other)
    finally:
        os.close(held)
    req.run_id = "last"
    runstate.run_dir(req)
    assert not os.path.exists(first)


def test_held_run_dir_makes_a_folder_pruned_before_its_hold_again(req, monkeypatch):
    """A prune of another run that took the folder between run_dir and the lock: the call
    gets it made anew, and holds that one."""
    real_hold, holds = runstate.hold, []

    def pruned_meanwhile(folder):
        fd = real_hold(folder)
        holds.append(folder)
        if len(holds) == 1:
            shutil.rmtree(folder)
        return fd

    monkeypatch.setattr(runstate, "hold", pruned_meanwhile)
    folder, fd = runstate.held_run_dir(req, [])
    try:
        assert len(holds) == 2 and fd is not None
        assert os.path.samestat(os.fstat(fd), os.stat(folder))
    finally:
        os.close(fd)


def test_cwd_round_trip_and_fallbacks(req, tmp_path):
    assert runstate.current_cwd(req) == req.home
    sub = tmp_path / "home" / "sub"
    sub.mkdir()
    notes = []
    runstate.save_cwd(req, str(sub), notes)
    assert runstate.current_cwd(req) == str(sub) and notes == []
    sub.rmdir()
    assert runstate.current_cwd(req) == req.home
    req.cwd = str(tmp_path)
    assert runstate.current_cwd(req) == str(tmp_path)
    req.cwd = str(tmp_path / "gone")
    assert runstate.current_cwd(req) == req.home


@pytest.mark.parametrize("content", [b"relative/path", b"/no/such/dir", b"/" * (limits.STATE_FILE_MAX_BYTES + 1)])
def test_bad_cwd_file_is_ignored(req, content):
    cwd_file = os.path.join(runstate.run_dir(req), "cwd")
    with open(cwd_file, "wb") as fh:
        fh.write(content)
    assert runstate.current_cwd(req) == req.home


def test_cwd_file_link_or_fifo_is_not_followed(req, tmp_path):
    run = runstate.run_dir(req)
    target = tmp_path / "target"
    target.write_text(str(tmp_path))
    os.symlink(target, os.path.join(run, "cwd"))
    assert runstate.current_cwd(req) == req.home
    os.unlink(os.path.join(run, "cwd"))
    os.mkfifo(os.path.join(run, "cwd"))
    assert runstate.current_cwd(req) == req.home


def test_repo_tokens(req, tmp_path):
    assert runstate.load_repo_tokens(req) == {}
    adir = tmp_path / "state" / "agent1"
    adir.mkdir()
    (adir / "repos.json").write_text(json.dumps({"/h/repos/web/": "tok1", "rel": "x", "/h/a": 5}))
    assert runstate.agent_dir(req) == str(adir)
    assert runstate.load_repo_tokens(req) == {"/h/repos/web": "tok1"}
    (adir / "repos.json").write_text("[1, 2]")
    assert runstate.load_repo_tokens(req) == {}
    (adir / "repos.json").write_text("{not json")
    assert runstate.load_repo_tokens(req) == {}
