"""Background commands and shell_status through the built helper, real bash."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import error_text, ok_text
from guilds_code import limits
from guilds_code.protocol import decode_envelope

START_RE = re.compile(
    r"started (b\d+) in the background \(pid (\d+)\)\n"
    r"log: (/\S+\.log)\n"
    r"check it with shell_status id=\1; stop it with shell_status id=\1 stop=true"
)


def _records(sandbox):
    folder = sandbox.state / sandbox.agent_id / "background"
    return [json.loads(p.read_text()) for p in folder.glob("b*.json")] if folder.is_dir() else []


def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _start_time(pid):
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _state(pid):
    fields = _stat(pid)
    return fields[0] if fields else None


@pytest.fixture
def bg(sandbox):
    """The sandbox; afterwards every still-running background group is killed."""
    yield sandbox
    for record in _records(sandbox):
        if _start_time(record["pid"]) == record["start_time"]:
            try:
                os.killpg(record["pid"], signal.SIGKILL)
            except OSError:
                pass


def start(sandbox, command, **extra):
    env = sandbox.call("shell", {"command": command, "background": True}, **extra)
    match = START_RE.fullmatch(ok_text(env))
    assert match, ok_text(env)
    bid, pid, log = match.group(1), int(match.group(2)), match.group(3)
    assert env["meta"] == {"background_id": bid, "log_path": log}
    return bid, pid, log


def status(sandbox, **args):
    return sandbox.call("shell_status", args)


def wait_state(sandbox, bid, prefix, timeout=8.0):
    deadline = time.monotonic() + timeout
    while True:
        env = status(sandbox, id=bid)
        if env["meta"]["state"].startswith(prefix) or time.monotonic() > deadline:
            return env
        time.sleep(0.1)


def test_start_returns_at_once_and_runs_detached(bg):
    began = time.monotonic()
    bid, pid, log = start(bg, "echo hello; sleep 30")
    assert time.monotonic() - began < 3
    assert bid == "b1" and log == str(bg.home / ".runs" / "run1" / "c1.log")
    fields = _stat(pid)
    assert int(fields[3]) == int(fields[2]) == pid  # session and group leader
    deadline = time.monotonic() + 5
    while os.path.getsize(log) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    env = status(bg, id="b1")
    expected = f"b1 running [0-9]s echo hello; sleep 30\nlog: {re.escape(log)}\nlast 40 lines of the log:\nhello"
    assert re.fullmatch(expected, ok_text(env))
    assert env["meta"] == {"background_id": "b1", "state": "running", "log_path": log}
    assert re.fullmatch("b1 running [0-9]s echo hello; sleep 30", ok_text(status(bg)))


def test_exited_with_code_and_last_40_lines(bg):
    command = "printf '\\033[32mgreen\\033[0m\\n'; seq 1 100; printf 'a\\rb\\n'; exit 3"
    bid, _, log = start(bg, command)
    env = wait_state(bg, bid, "exited")
    lines = ok_text(env).split("\n")
    assert re.fullmatch(f"{bid} exited 3 [0-9]s " + re.escape(command), lines[0])
    assert lines[1:3] == [f"log: {log}", "last 40 lines of the log:"]
    assert lines[3:] == [str(i) for i in range(62, 101)] + ["b"]
    assert env["meta"] == {"background_id": bid, "state": "exited 3", "log_path": log, "exit_code": 3}
    assert os.path.exists(log)  # a background log is always kept


def test_no_output_and_empty_list(bg):
    assert ok_text(status(bg)) == "no background commands"
    bid, _, _ = start(bg, "true")
    text = ok_text(wait_state(bg, bid, "exited"))
    assert text.endswith("\nthe log is empty") and "exited 0" in text


def test_stop_a_running_command(bg):
    bid, pid, _ = start(bg, "sleep 30")
    env = status(bg, id=bid, stop=True)
    assert re.fullmatch(f"stopped {bid}\n{bid} stopped [0-9]s sleep 30", ok_text(env))
    assert env["meta"]["state"] == "stopped" and "exit_code" not in env["meta"]
    assert _state(pid) in (None, "Z")
    assert ok_text(status(bg, id=bid, stop=True)) == f"{bid} is not running: stopped"


@pytest.mark.slow
def test_stop_escalates_to_sigkill_without_blocking(bg):
    bid, _pid, _ = start(bg, "trap '' TERM; echo armed; sleep 60 & wait")
    time.sleep(0.3)
    began = time.monotonic()
    env = status(bg, id=bid, stop=True)
    assert time.monotonic() - began < 3  # not the 5 s grace
    assert env["meta"]["state"] == "stopping"
    assert ok_text(env).startswith(f"sent SIGTERM to {bid}; SIGKILL follows 5s later")
    assert ok_text(status(bg)).startswith(f"{bid} stopping ")
    env = wait_state(bg, bid, "stopped", timeout=8)
    assert env["meta"]["state"] == "stopped"
    assert time.monotonic() - began >= 4.5


def test_ended_when_gone_without_exit_code(bg):
    bid, pid, _ = start(bg, "sleep 30")
    os.killpg(pid, signal.SIGKILL)
    env = wait_state(bg, bid, "ended")
    assert env["meta"]["state"] == "ended"
    first = ok_text(status(bg)).split(" ")
    assert first[:2] == [bid, "ended"]


def test_reused_pid_is_not_ours(bg):
    bid, pid, _ = start(bg, "sleep 30")
    record_path = bg.state / "agent1" / "background" / f"{bid}.json"
    record = json.loads(record_path.read_text())
    record["start_time"] -= 1  # as if the pid now named another process
    record_path.write_text(json.dumps(record))
    assert status(bg, id=bid)["meta"]["state"] == "ended"
    assert "is not running: ended" in ok_text(status(bg, id=bid, stop=True))
    assert _start_time(pid) is not None  # not signalled
    os.killpg(pid, signal.SIGKILL)


def test_background_environment_and_cwd(bg):
    (bg.home / "sub").mkdir()
    bg.call("shell", {"command": "cd sub"})
    bid, _, log = start(bg, 'pwd; echo "$TERM $PAGER $GUILD_RUN_ID"; cd /; exit 0')
    wait_state(bg, bid, "exited")
    with open(log) as fh:
        assert fh.read() == f"{bg.home}/sub\ndumb cat run1\n"
    assert ok_text(bg.call("shell", {"command": "pwd"})) == f"{bg.home}/sub"


def test_status_tail_is_redacted_and_capped(bg):
    secret = "bg-secret-value-0123456789"
    bg.env["BG_SECRET"] = secret
    command = "for i in $(seq 1 50); do printf 'x%.0s' $(seq 1 200); echo \" $BG_SECRET\"; done"
    bid, _, log = start(bg, command, redact_env=["BG_SECRET"])
    wait_state(bg, bid, "exited")
    env = bg.call("shell_status", {"id": bid}, redact_env=["BG_SECRET"], max_bytes=1024)
    text = ok_text(env)
    assert len(text.encode()) <= 1024
    assert "[REDACTED]" in text and secret[:8] not in text and secret[-8:] not in text
    assert re.search(r"\[… \d+ bytes elided; full output: " + re.escape(log) + " …\\]", text)


def test_unknown_and_bad_ids(bg):
    assert error_text(status(bg, id="b7")) == "id: no background command b7"
    assert error_text(status(bg, id="x1")).startswith("id: must look like b1")
    assert error_text(status(bg, stop=True)) == "stop: needs an id"


def test_long_list_keeps_the_newest(bg):
    folder = bg.state / "agent1" / "background"
    folder.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for n in range(1, 301):
        record = {"id": f"b{n}", "pid": dead.pid, "start_time": None, "command": f"cmd number {n} " + "y" * 80,
                  "started_at": time.time() - 200, "log_path": "/nowhere.log", "exit_file": f".exit-{n}"}
        (folder / f"b{n}.json").write_text(json.dumps(record))
    text = ok_text(status(bg))
    lines = text.split("\n")
    assert len(text.encode()) <= 8192
    assert re.fullmatch(r"… \d+ earlier commands not shown", lines[0])
    assert lines[-1].startswith("b300 ended 3m2") and lines[-1].endswith("… [+15 chars]")


@pytest.mark.slow
def test_fifty_concurrent_starts_get_distinct_ids(bg):
    def one(i):
        req = bg.request("shell", {"command": "true", "background": True})
        req["call_id"] = f"par{i}"
        proc = bg.run_raw(base64.b64encode(json.dumps(req).encode()).decode())
        return decode_envelope(proc.stdout)["meta"]["background_id"]

    with ThreadPoolExecutor(max_workers=50) as pool:
        ids = list(pool.map(one, range(50)))
    assert sorted(ids, key=lambda b: int(b[1:])) == [f"b{n}" for n in range(1, 51)]
    assert len(_records(bg)) == 50


def test_huge_command_still_listed(bg):
    command = "true # " + "z" * 80_000  # a record with all of it would pass 64 KiB
    _bid, _, _ = start(bg, command)
    assert re.fullmatch(r"b1 (running|exited 0) \ds true # z{73}… \[\+\d+ chars\]", ok_text(status(bg)))


def test_background_command_longer_than_one_argv_string(bg):
    command = "v='" + "x" * 150_000 + "'\necho ${#v}"
    req = bg.request("shell", {"command": command, "background": True})
    folder = bg.state / "requests"
    folder.mkdir()
    (folder / "run1-c1.json").write_text(json.dumps(req))
    env = decode_envelope(bg.run_raw(str(folder / "run1-c1.json")).stdout)
    bid = env["meta"]["background_id"]
    assert ok_text(wait_state(bg, bid, "exited")).endswith("\n150000")
    assert re.search(f"{bid} exited 0 [0-9]+s v='xxx", ok_text(status(bg)))


def test_run_folder_of_a_running_command_outlives_pruning(bg):
    bid, _pid, log = start(bg, "sleep 30")
    runs = bg.home / ".runs"
    (runs / "run1").touch()
    past = time.time() - 3600
    os.utime(runs / "run1", (past, past))
    for i in range(limits.RUNS_KEPT + 1):
        ok_text(bg.call("shell", {"command": "true"}, run_id=f"later{i}"))
    assert os.path.exists(log), "a running command's log was pruned"
    assert "run1" in os.listdir(runs)
    ok_text(status(bg, id=bid, stop=True))
    wait_state(bg, bid, "stopped")
    os.utime(runs / "run1", (past, past))
    ok_text(bg.call("shell", {"command": "true"}, run_id="after-stop"))
    assert "run1" not in os.listdir(runs)


def _victim_group(leader_exits: bool) -> subprocess.Popen:
    """A real process group this sandbox did not start (its leader gone when leader_exits)."""
    script = "sleep 60 & exit 0" if leader_exits else "sleep 60; :"
    victim = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    if leader_exits:
        victim.wait()
    return victim


def _forge(sandbox, bid: str, pid: int) -> None:
    """The agent's own command rewrites record bid to name group pid, with its real start time."""
    folder = sandbox.state / sandbox.agent_id / "background"
    command = (
        f"f={folder}/{bid}.json; st=$(cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null || echo 0); "
        f'sed -E -i "s/\\"pid\\": [0-9]+/\\"pid\\": {pid}/; '
        f's/\\"start_time\\": [0-9]+/\\"start_time\\": ${{st:-0}}/" $f; cat $f'
    )
    text = ok_text(sandbox.call("shell", {"command": command}))
    assert f'"pid": {pid}' in text


@pytest.mark.parametrize("leader_exits", [False, True])
def test_forged_record_never_steers_stop_at_another_group(bg, leader_exits):
    bid, _, _ = start(bg, "sleep 0.2")
    wait_state(bg, bid, "exited")
    for name in os.listdir(bg.state / "agent1" / "background"):
        if name.startswith(".exit-"):
            os.unlink(bg.state / "agent1" / "background" / name)  # no exit status: looks live
    victim = _victim_group(leader_exits)
    try:
        _forge(bg, bid, victim.pid)
        text = ok_text(status(bg, id=bid, stop=True))
        assert text.startswith((f"{bid} is not running", f"not stopped {bid}: its process group is not verified")), text
        time.sleep(0.3)
        os.killpg(victim.pid, 0)  # the group still lives: it was not signalled
        assert not (bg.state / "agent1" / "background" / f"{bid}.stop").exists()
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_forged_record_of_a_live_own_command_cannot_be_redirected(bg):
    bid, pid, _ = start(bg, "sleep 30")
    victim = _victim_group(False)
    try:
        _forge(bg, bid, victim.pid)
        assert ok_text(status(bg, id=bid, stop=True)).startswith(f"{bid} is not running")
        os.killpg(victim.pid, 0)
        assert _state(pid) not in (None, "Z")  # and the real command was not touched either
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        os.killpg(pid, signal.SIGKILL)
        victim.wait()


def test_a_background_folder_replaced_by_a_link_is_not_followed_and_is_rebuilt(bg, tmp_path):
    bid, _, _ = start(bg, "true")
    wait_state(bg, bid, "exited")
    elsewhere = tmp_path / "elsewhere"
    folder = bg.state / "agent1" / "background"
    ok_text(bg.call("shell", {"command": f"cp -r {folder} {elsewhere}; rm -rf {folder}; ln -s {elsewhere} {folder}"}))
    assert ok_text(status(bg)) == "no background commands"  # the link is not followed
    assert error_text(status(bg, id=bid)) == f"id: no background command {bid}"
    env = bg.call("shell", {"command": "echo again", "background": True})
    text = ok_text(env)
    assert text.startswith("started b1 in the background") and f"note: {folder} was a link; moved it to " in text
    assert folder.is_dir() and not folder.is_symlink() and sorted(os.listdir(elsewhere))[0].startswith(".exit-")


def _rewrite_record(sandbox, bid: str, **fields) -> None:
    path = sandbox.state / sandbox.agent_id / "background" / f"{bid}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_command_of_an_earlier_sandbox_is_ended_whatever_its_pid_names_now(bg):
    """A state root that outlives its sandbox (docker's volume, a pod's claim): the record's
    pid and start time may name a process of the new sandbox; its instance does not match."""
    bid, pid, _ = start(bg, "echo the-old-log; sleep 30")
    assert status(bg, id=bid)["meta"]["state"] == "running"
    record = _records(bg)[0]
    assert record["call"] == "c1" and len(record["instance"].split(" ")) == 3
    _rewrite_record(bg, bid, instance=record["instance"] + "0")  # as an earlier sandbox wrote it
    env = wait_state(bg, bid, "ended", timeout=0)
    assert env["meta"]["state"] == "ended" and "the-old-log" in ok_text(env)  # its own log still
    assert re.fullmatch(f"{bid} ended [0-9]s echo the-old-log; sleep 30", ok_text(status(bg)))
    assert ok_text(status(bg, id=bid, stop=True)).startswith(f"{bid} is not running: ended")
    assert _state(pid) not in (None, "Z")  # never signalled
    assert ok_text(status(bg, wait=1)).startswith("no command is running")


def test_a_group_of_a_new_pod_under_the_old_records_pid_is_not_the_old_command(bg):
    """The claim keeps the records when a pod is replaced; in the new pod the old pid may
    number a live group whose leader is gone (no start time to compare): ended, never signalled."""
    bid, _, _ = start(bg, "sleep 0.2")
    wait_state(bg, bid, "exited")
    for name in os.listdir(bg.state / "agent1" / "background"):
        if name.startswith(".exit-"):
            os.unlink(bg.state / "agent1" / "background" / name)  # killed with its pod: no exit status
    victim = _victim_group(True)
    try:
        _forge(bg, bid, victim.pid)
        _rewrite_record(bg, bid, instance=_records(bg)[0]["instance"] + "0")
        assert status(bg, id=bid)["meta"]["state"] == "ended"
        assert ok_text(status(bg, id=bid, stop=True)).startswith(f"{bid} is not running: ended")
        os.killpg(victim.pid, 0)  # the group still lives: it was not signalled
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_started_by_another_call_reads_ended_and_nothing_of_that_id(bg):
    """Following a command by the call that started it: this sandbox's b1 of another call
    (a replaced sandbox begins again at b1) is neither read nor signalled."""
    bid, pid, _ = start(bg, "echo another-runs-output; sleep 30")
    held = status(bg, id=bid, stop=False)
    assert held["meta"]["state"] == "running"
    ended = f"{bid} ended: it ran in an earlier sandbox (this sandbox's {bid}, if any, is another command)"
    for args in ({"id": bid}, {"id": bid, "stop": True}, {"id": "b7"}):
        env = bg.call("shell_status", args, started_by="c0earlier")
        assert ok_text(env) == ended.replace(bid, args["id"]) and "another-runs-output" not in ok_text(env)
        assert env["meta"] == {"background_id": args["id"], "state": "ended"}
    assert _state(pid) not in (None, "Z") and not (bg.state / "agent1" / "background" / f"{bid}.stop").exists()
    own = bg.call("shell_status", {"id": bid}, started_by="c1")
    assert own["meta"]["state"] == "running" and "another-runs-output" in ok_text(own)
    assert ok_text(bg.call("shell_status", {"id": bid, "stop": True}, started_by="c1")).startswith(f"stopped {bid}")


@pytest.mark.parametrize(("op", "args", "started_by", "error"), [
    ("shell_status", {}, "c1", "started_by: only with shell_status and an id"),
    ("shell", {"command": "true"}, "c1", "started_by: only with shell_status and an id"),
    ("shell_status", {"id": "b1"}, "../c1", "started_by: must be letters, digits, '.', '_' or '-', got \"../c1\""),
    ("shell_status", {"id": "b1"}, 7, "started_by: required, a non-empty string"),
])
def test_started_by_is_checked(sandbox, op, args, started_by, error):
    assert error_text(sandbox.call(op, args, started_by=started_by)) == error


def test_a_background_command_outlives_the_exec_that_started_it(bg):
    """The kubernetes backends run the resident helper under ``ending_argv``: when its exec
    ends (the orchestrator that opened it died, or closed it), every process carrying its
    token is stopped (``kill_argv``). A background command carries none: it lives on in
    the sandbox, for whichever orchestrator asks next."""
    from guilds.sandbox._container import EXEC_ENV, kill_argv

    token = f"bg-test-{os.getpid()}-{time.monotonic_ns()}"
    bg.env[EXEC_ENV] = token
    bid, pid, _ = start(bg, "sleep 30")
    subprocess.run(kill_argv(token), timeout=60, check=True, capture_output=True)
    del bg.env[EXEC_ENV]  # the helper that carried it is gone: the next call opens another
    assert _state(pid) not in (None, "Z")
    assert status(bg, id=bid)["meta"]["state"] == "running"
