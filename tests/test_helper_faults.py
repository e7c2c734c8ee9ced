"""The helper under faults, through the built helper and real bash: killed by
SIGKILL mid-command, its state folder tampered with by the agent's own commands,
a full disk."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import PYTHON, ok_text, sized_tmpfs
from guilds_code.proc import live_groups


def _wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_command_dies_with_a_helper_killed_by_sigkill(sandbox, tmp_path):
    marker = tmp_path / "pgid"
    command = f"sleep 300 & echo $$ > {marker}; sleep 300; :"
    arg = base64.b64encode(json.dumps(sandbox.request("shell", {"command": command, "timeout_seconds": 600})).encode())
    helper = subprocess.Popen([PYTHON, "-I", "-S", str(sandbox.helper), arg.decode()], env=sandbox.process_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pgid = None
    try:
        assert _wait_for(lambda: marker.exists() and marker.read_text().strip())
        pgid = int(marker.read_text())
        assert pgid in live_groups()
        helper.kill()
        helper.wait()
        assert _wait_for(lambda: pgid not in live_groups()), "the command outlived its helper"
    finally:
        helper.kill()
        helper.wait()
        if pgid is not None and pgid in live_groups():
            os.killpg(pgid, signal.SIGKILL)


def test_a_finished_call_leaves_its_background_grandchild_alone(sandbox, tmp_path):
    marker = tmp_path / "pid"
    text = ok_text(sandbox.call("shell", {"command": f"sleep 30 >/dev/null 2>&1 & echo $! > {marker}; echo done"}))
    assert text == "done"
    pid = int(marker.read_text())
    time.sleep(0.3)
    try:
        os.kill(pid, 0)  # released watchdog: the grandchild runs on as before
    finally:
        os.kill(pid, signal.SIGKILL)


# --- .runs tampered with by the agent's own commands ------------------------------------
def sh(sandbox, command, **args):
    return sandbox.call("shell", {"command": command, **args})


def _notes(text):
    return [line for line in text.split("\n") if line.startswith("note: ")]


def _asides(folder):
    return sorted(p for p in folder.iterdir() if ".aside-" in p.name)


@pytest.mark.parametrize("replacement", ["ln -s {victim} ~/.runs", "echo mine > ~/.runs"])
def test_runs_replaced_by_a_link_or_file(sandbox, tmp_path, replacement):
    victim = tmp_path / "victim"
    victim.mkdir()
    sub = sandbox.home / "sub"
    sub.mkdir()
    assert ok_text(sh(sandbox, "echo first")) == "first"
    text = ok_text(sh(sandbox, f"rm -rf ~/.runs; {replacement.format(victim=victim)}; cd sub; echo ran"))
    assert text.split("\n")[0] == "ran"
    [note] = _notes(text)
    assert f"{sandbox.home}/.runs was a " in note and " moved it to " in note
    [aside] = _asides(sandbox.home)
    assert aside.is_symlink() or aside.read_text() == "mine\n"  # kept, not deleted
    assert list(victim.iterdir()) == []  # never followed
    env = sh(sandbox, "pwd")
    assert ok_text(env) == str(sub) and env["meta"]["cwd"] == str(sub)  # the state is whole again
    assert _notes(ok_text(env)) == []


@pytest.mark.parametrize("kind", ["folder", "link", "fifo"])
def test_cwd_file_replaced(sandbox, tmp_path, kind):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (sandbox.home / "sub").mkdir()
    make = {"folder": "mkdir -p {f}/inner", "link": "ln -s {v} {f}", "fifo": "mkfifo {f}"}[kind]
    cwd_file = sandbox.home / ".runs" / "run1" / "cwd"
    assert ok_text(sh(sandbox, "cd sub")) == "(no output)\n[working directory now: ~/sub]"
    text = ok_text(sh(sandbox, f"rm -f {cwd_file}; {make.format(f=cwd_file, v=victim)}; cd ~/sub; seq 3"))
    assert text.startswith("1\n2\n3\nnote: ")
    [note] = _notes(text)
    assert note.startswith(f"note: {cwd_file} was a ") and " moved it to " in note
    assert cwd_file.read_text() == str(sandbox.home / "sub") and victim.read_text() == "keep"
    assert len(_asides(cwd_file.parent)) == 1
    assert ok_text(sh(sandbox, "pwd")) == str(sandbox.home / "sub")


def test_run_folder_replaced_by_a_link_mid_command_is_not_written_through(sandbox, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    run = sandbox.home / ".runs" / "run1"
    sh(sandbox, "true")
    text = ok_text(sh(sandbox, f"mv {run} {run}.mine; ln -s {victim} {run}; cd /tmp; echo ran"))
    assert text.startswith("ran\nnote: ")
    assert list(victim.iterdir()) == []
    assert (run / "cwd").read_text() == "/tmp" and (sandbox.home / ".runs" / "run1.mine").is_dir()


# --- a full disk ----------------------------------------------------------------------
def small_tmpfs(folder):
    """A 64 KiB tmpfs mounted on folder while the block runs (skipped where it cannot be)."""
    return sized_tmpfs(folder, "64k")


@pytest.fixture
def full_home(sandbox):
    """The sandbox with its home on a 64 KiB tmpfs (unmounted afterwards)."""
    with small_tmpfs(sandbox.home):
        yield sandbox


FILL = "head -c 1M /dev/zero > ~/fill 2>/dev/null; "


def test_cd_on_a_full_disk_is_not_lost_silently(full_home):
    (full_home.home / "sub").mkdir()
    assert ok_text(sh(full_home, "echo warm")) == "warm"  # the run folder exists
    env = sh(full_home, FILL + "cd sub; echo ran")
    text = ok_text(env)
    assert text.split("\n")[0] == "ran"
    [note] = _notes(text)
    assert note.startswith("note: the working directory ") and "could not be kept" in note
    assert env["meta"]["cwd"] == str(full_home.home)
    env = sh(full_home, "rm ~/fill; cd sub; pwd")
    assert ok_text(env) == str(full_home.home / "sub") + "\n[working directory now: ~/sub]"
    assert env["meta"]["cwd"] == str(full_home.home / "sub")


def test_elided_output_whose_log_could_not_be_written_says_so(full_home):
    assert ok_text(sh(full_home, "echo warm")) == "warm"
    env = sh(full_home, FILL + "seq 1 200000")
    text = ok_text(env)
    assert "bytes elided; full output: not kept (the log could not be written: No space left on device) …]" in text
    # The shell's final directory goes to a memfd, not the full disk: unchanged, nothing lost, no note.
    assert "\n200000" in text and "working directory" not in text and env["meta"]["cwd"] == str(full_home.home)
    assert "log_path" not in env["meta"]
    assert not (full_home.home / ".runs" / "run1" / "c2.log").exists()


def test_a_run_folder_that_cannot_be_made_on_a_full_disk(full_home):
    sh(full_home, "echo warm")
    used = int(subprocess.run(["df", "--output=iused", str(full_home.home)], capture_output=True,
                              text=True, check=True).stdout.split()[-1])
    subprocess.run(["mount", "-o", f"remount,nr_inodes={used}", str(full_home.home)], check=True)
    full_home.run_id = "run2"  # a new run: its folder cannot be made, no inode is left
    env = sh(full_home, "echo still runs; cd /tmp; seq 1 3000")
    text = ok_text(env)
    assert text.startswith("still runs\n1\n") and text.rstrip().endswith("3000\n" + _notes(text)[0])
    assert _notes(text) == [(f"note: this call's working directory and log could not be kept: "
                            f"cannot make {full_home.home}/.runs/run2: No space left on device")]
    assert "full output: not kept (no run folder)" in text and "log_path" not in env["meta"]
    assert env["meta"]["cwd"] == str(full_home.home)


@pytest.fixture
def full_state(sandbox):
    """The sandbox with its state root on a 64 KiB tmpfs, filled once the agent's
    background folder is made (unmounted afterwards)."""
    with small_tmpfs(sandbox.state):
        (sandbox.state / sandbox.agent_id / "background").mkdir(parents=True)
        subprocess.run(["sh", "-c", f"head -c 1M /dev/zero > {sandbox.state}/fill"], check=False, capture_output=True)
        yield sandbox


def test_a_background_start_whose_record_cannot_be_written_stops_the_command(full_state, tmp_path):
    marker = tmp_path / "ran"
    assert ok_text(sh(full_state, "echo fore")) == "fore"  # a call in the foreground needs no state root
    env = sh(full_state, f"sleep 0.5; touch {marker}; sleep 300", background=True)
    folder = full_state.state / full_state.agent_id / "background"
    assert env == {"ok": False, "error": f"cannot keep a record of the background command in {folder}: "
                                         "No space left on device; the command was stopped"}
    time.sleep(1)
    assert not marker.exists()
    (full_state.state / "fill").unlink()
    assert ok_text(sh(full_state, "echo bg", background=True)).startswith("started b1 in the background")


def test_a_background_start_moves_a_runs_link_aside_and_says_so(sandbox, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    # the agent's own background command swaps .runs for a link once the call that started it is over
    ok_text(sh(sandbox, f"sleep 0.3; mv ~/.runs ~/.runs.mine; ln -s {victim} ~/.runs", background=True))
    assert _wait_for((sandbox.home / ".runs").is_symlink)
    env = sh(sandbox, "echo bg", background=True)
    text = ok_text(env)
    assert text.startswith("started b2 in the background") and "\nnote: " in text
    assert env["meta"]["log_path"].startswith(f"{sandbox.home}/.runs/run1/")
    assert list(victim.iterdir()) == []
