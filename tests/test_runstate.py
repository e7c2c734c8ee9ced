"""runstate: the run folder, the working directory, repository tokens."""

from __future__ import annotations

import json
import os
import time

import pytest

from guilds_code import limits, runstate
from guilds_code.protocol import OpError, Request


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


def test_run_dir_is_made_private_and_refuses_links(req, tmp_path):
    path = runstate.run_dir(req)
    assert path == os.path.join(req.home, ".runs", "run1")
    assert os.stat(path).st_mode & 0o777 == 0o700
    req.run_id = "run2"
    os.symlink(tmp_path, os.path.join(req.home, ".runs", "run2"))
    with pytest.raises(OpError, match="run2 is a link"):
        runstate.run_dir(req)


def test_runs_link_refused(req, tmp_path):
    os.symlink(tmp_path, os.path.join(req.home, ".runs"))
    with pytest.raises(OpError, match=r"\.runs is a link"):
        runstate.run_dir(req)


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


def test_cwd_round_trip_and_fallbacks(req, tmp_path):
    assert runstate.current_cwd(req) == req.home
    sub = tmp_path / "home" / "sub"
    sub.mkdir()
    runstate.save_cwd(req, str(sub))
    assert runstate.current_cwd(req) == str(sub)
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
