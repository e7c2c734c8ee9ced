"""guilds-code serve through its frames: the built helper under python3 -I -S, real bash.

Concurrency, cancellation, the in-flight bound, bad frames, the version, stdout
holding frames only, stdin's end, the idle exit, and flat memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from conftest import PYTHON, Sandbox, ok_text
from guilds_code import frames, limits
from resident_kit import ResidentServer
from test_shell import gone, kill_pids


@pytest.fixture
def sandbox(helper_path, tmp_path):
    """The conftest sandbox on the resident transport only (its calls go to ``server``)."""
    (tmp_path / "home").mkdir()
    (tmp_path / "state").mkdir()
    box = Sandbox(helper=helper_path, home=tmp_path / "home", state=tmp_path / "state", transport="resident")
    yield box
    box.close()


@pytest.fixture
def server(sandbox):
    return sandbox.server()


def eventually_gone(pid: int, timeout: float = 3) -> bool:
    """gone(pid) within timeout: the killed process is reaped by whoever inherits it."""
    deadline = time.monotonic() + timeout
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return gone(pid)


def shell(sandbox, command, **args):
    return sandbox.request("shell", {"command": command, **args})


def test_hello_says_version_bounds_and_pid(server):
    assert server.hello == {"v": 1, "hello": "guilds-code", "max_in_flight": frames.MAX_IN_FLIGHT_DEFAULT,
                            "max_frame_bytes": limits.REQUEST_FILE_MAX + frames.FRAME_SLACK_BYTES,
                            "pid": server.proc.pid}


def test_a_slow_request_delays_no_other(sandbox, server):
    began = time.monotonic()
    slow = server.request(shell(sandbox, "sleep 3; echo slow"))
    fast = [server.request(shell(sandbox, f"echo fast{i}")) for i in range(5)]
    answers = server.answers(5, timeout=10)
    assert time.monotonic() - began < 2.5
    assert sorted(a["id"] for a in answers) == sorted(fast)
    assert {ok_text(a["envelope"]) for a in answers} == {f"fast{i}" for i in range(5)}
    (last,) = server.answers(1, timeout=10)
    assert (last["id"], ok_text(last["envelope"])) == (slow, "slow")


@pytest.mark.parametrize("command", ["sleep 30 & echo $! > {p}; wait", "trap '' TERM; sleep 30 & echo $! > {p}; wait"])
def test_cancel_stops_the_commands_group_and_answers_cancelled(sandbox, server, command):
    pidfile = sandbox.home / "pid"
    try:
        frame_id = server.request(shell(sandbox, command.format(p=pidfile)))
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.monotonic()
        server.cancel(frame_id)
        (answer,) = server.answers(1, timeout=10)
        assert time.monotonic() - began < 2.5
        assert answer == {"v": 1, "id": frame_id, "envelope": {
            "ok": False, "error": "cancelled: the call was stopped before it finished"}}
        assert eventually_gone(int(pidfile.read_text()))
        server.cancel(frame_id)  # answered already: ignored, no second answer
        assert ok_text(server.call(shell(sandbox, "echo after"))) == "after"
    finally:
        kill_pids(pidfile)


def test_in_flight_bound_refuses_the_next_at_once(sandbox):
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--max-in-flight", "2")
    try:
        assert server.hello["max_in_flight"] == 2
        held = [server.request(shell(sandbox, "sleep 2")) for _ in range(2)]
        refused = server.request(shell(sandbox, f"touch {sandbox.home}/ran"))
        (answer,) = server.answers(1, timeout=1.5)
        assert answer["id"] == refused
        assert answer["envelope"] == {"ok": False, "error": "too many requests in flight: at most 2 at "
                                                            "once; this one was not run"}
        assert not (sandbox.home / "ran").exists()
        assert sorted(a["id"] for a in server.answers(2, timeout=10)) == sorted(held)
        assert ok_text(server.call(shell(sandbox, "echo room again"))) == "room again"
    finally:
        server.close()


@pytest.mark.parametrize("line, frame_id, error", [
    (b"garbage", None, "frame: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    (b'{"v":1,"id":"k1","request":{"op":"shell"', "k1", "frame: not valid JSON"),
    (b'{"v":2,"id":"k2","request":{}}', "k2", "frame: protocol version 2, this helper speaks 1"),
    (b'{"id":"k3","request":{}}', "k3", "frame: protocol version null, this helper speaks 1"),
    (b'{"v":1,"id":"../x","request":{}}', None, "frame: id must be letters, digits, '.', '_' or '-', got \"../x\""),
    (b'{"v":1,"id":"k4"}', "k4", "frame: needs a request or a cancel"),
    (b'{"v":1,"id":"k5","cancel":1}', "k5", "frame: cancel must be true"),
    (b'[1, 2]', None, "frame: must be a JSON object"),
    (b'{"v":1,"id":"k6","request":{"op":"shell","args":{"command":NaN}}}', "k6", "NaN is not valid JSON"),
    (b'{"v":1,"id":"k7","request":{"op":"nope"}}', "k7", 'op: unknown op "nope"'),
    (b'{"v":1,"id":"k8","request":"\xff"}', "k8", "frame: not UTF-8"),
    (b'{"v":1,"id":"k9","request":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "k9", "frame: JSON nested too deeply"),
    (b'{"v":1,"id":"' + b"x" * 129 + b'","request":{}}', None, "frame: id must be letters"),
    (b"\x00\x01\x02 binary", None, "frame: not valid JSON"),
    (b'{"v":1,"id":"k10","request":{},"v":1,"id":"k11"}', "k11", "op: unknown op null"),
])
def test_a_bad_frame_gets_an_error_and_the_channel_keeps_working(sandbox, server, line, frame_id, error):
    server.send(line + b"\n")
    (answer,) = server.answers(1, timeout=10)
    assert answer["id"] == frame_id and answer["envelope"]["ok"] is False
    assert error in answer["envelope"]["error"]
    assert ok_text(server.call(shell(sandbox, "echo still here"))) == "still here"


def test_a_frame_over_the_limit_is_refused_by_its_id(sandbox, server):
    big = json.dumps({"v": 1, "id": "big1", "request": shell(sandbox, "x" * (server.hello["max_frame_bytes"] + 10))})
    server.send(big.encode() + b"\n")
    (answer,) = server.answers(1, timeout=30)
    assert answer["id"] == "big1"
    assert answer["envelope"] == {"ok": False, "error": f"frame: longer than "
                                                        f"{server.hello['max_frame_bytes']} bytes; not read"}
    assert ok_text(server.call(shell(sandbox, "echo next"))) == "next"


@pytest.mark.parametrize("over", [0, 1])
def test_a_frame_at_the_limit_is_read_one_byte_more_is_not(sandbox, server, over):
    req = shell(sandbox, "true")
    pad = server.hello["max_frame_bytes"] - len(json.dumps({"v": 1, "id": "edge", "request": req}).encode())
    req["args"]["command"] = "true #" + "x" * (pad - 2 + over)
    line = json.dumps({"v": 1, "id": "edge", "request": req}).encode()
    assert len(line) == server.hello["max_frame_bytes"] + over
    server.send(line + b"\n")
    (answer,) = server.answers(1, timeout=30)
    assert answer["id"] == "edge"
    assert answer["envelope"]["error"] == (
        f"frame: longer than {server.hello['max_frame_bytes']} bytes; not read" if over
        else f"command: longer than {limits.COMMAND_MAX_CHARS} characters")


def test_stdout_carries_frames_only(sandbox, server):
    req = shell(sandbox, "echo to-stdout; readlink /proc/$$/fd/1 /proc/$PPID/fd/0 /proc/$PPID/fd/1; "
                         "echo to-parent > /proc/$PPID/fd/1")
    text = ok_text(server.call(req))
    assert text.splitlines()[1:] == ["pipe:" + text.splitlines()[1].split(":", 1)[1], "/dev/null", "/dev/null"]
    server.send(b'{"v":1,"id":"z1","cancel":true}\n')  # nothing in flight: no answer
    assert ok_text(server.call(shell(sandbox, "echo clean"))) == "clean"


def test_stdin_ending_cancels_what_runs_then_exits(sandbox, server):
    pidfile = sandbox.home / "pid"
    try:
        frame_id = server.request(shell(sandbox, f"sleep 30 & echo $! > {pidfile}; wait"))
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.proc.stdin.close()
        (answer,) = server.answers(1, timeout=10)
        assert (answer["id"], answer["envelope"]["ok"]) == (frame_id, False)
        assert server.proc.wait(10) == 0
        assert eventually_gone(int(pidfile.read_text()))
    finally:
        kill_pids(pidfile)


def test_sigterm_to_the_server_ends_it_cleanly(sandbox, server):
    server.request(shell(sandbox, "sleep 30"))
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    (answer,) = server.answers(1, timeout=10)
    assert answer["envelope"]["error"].startswith("cancelled")
    assert server.proc.wait(10) == 0
    assert server.proc.stderr.read() == b""


def test_background_commands_outlive_the_server(sandbox, server):
    started = ok_text(server.call(shell(sandbox, "sleep 30", background=True)))
    pid = int(started.split("(pid ")[1].split(")")[0])
    try:
        sandbox.close()
        assert server.proc.returncode == 0 and not gone(pid)
        status = ok_text(sandbox.call("shell_status", {"id": "b1"}))  # a new server finds its record
        assert status.startswith("b1 running")
    finally:
        os.kill(pid, signal.SIGKILL)


def test_idle_exit(sandbox):
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--idle-exit", "1")
    try:
        assert ok_text(server.call(shell(sandbox, "echo once"))) == "once"
        assert server.proc.wait(5) == 0
    finally:
        server.close()


@pytest.mark.parametrize("args, error", [
    (["--max-in-flight", "0"], "--max-in-flight: must be from 1 to 4096, got 0"),
    (["--idle-exit", "soon"], "--idle-exit: must be an integer, got 'soon'"),
    (["--max-in-flight"], "serve: --max-in-flight needs a value"),
    (["--fast", "1"], "serve: unknown option --fast"),
    (["--sleep-idle", "0"], "--sleep-idle: must be from 1 to 604800, got 0"),
    (["--woken", "256"], "--woken: must be from 0 to 255, got 256"),
    (["--warm-first", "2"], "--warm-first: must be from 0 to 1, got 2"),
])
def test_bad_options_are_named(sandbox, args, error):
    import subprocess

    done = subprocess.run(
        [PYTHON, "-I", "-S", str(sandbox.helper), "serve", *args],
        check=False,
        env=sandbox.process_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout, done.stderr.decode()) == (2, b"", f"guilds-code serve: {error}\n")


def counters_open(pid: int) -> set[str]:
    """The /proc/sys files pid holds open (a warm server: those each shell call's end reads)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/proc/sys/"):
                held.add(target)
    return held


def test_a_server_warm_first_is_warm_at_its_hello_and_its_workers_share_what_it_opened(sandbox):
    counters = {"/proc/sys/kernel/ns_last_pid", "/proc/sys/kernel/pid_max"}
    warm = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--warm-first", "1")
    try:
        assert counters_open(warm.proc.pid) == counters  # at its hello (a cold one: once idle a moment after)
        assert ok_text(warm.call(shell(sandbox, "echo $PPID; ls -l /proc/$PPID/fd | grep -c /proc/sys/"))) == \
            f"{ok_text(warm.call(shell(sandbox, 'echo $PPID'))).strip()}\n2"  # one worker, holding the two
    finally:
        warm.close()


def test_each_request_refreshes_the_idle_clock(sandbox, server):
    stamp = sandbox.state / ".active"
    stamp.touch()
    old = time.time() - 3600
    os.utime(sandbox.state, (old, old))
    os.utime(stamp, (old, old))
    server.call(sandbox.request("shell_status", {}))
    assert time.time() - os.stat(sandbox.state).st_mtime < 60
    assert time.time() - os.stat(stamp).st_mtime < 60


@pytest.mark.slow
def test_memory_stays_flat(sandbox, server):
    def calls(n):
        for i in range(n):
            op = ("shell", {"command": "echo x"}) if i % 2 else ("file_read", {"path": "f"})
            server.call(sandbox.request(*op))

    (sandbox.home / "f").write_text("line\n" * 200)
    calls(100)
    after_100 = server.rss_kib()
    calls(2000)
    assert server.rss_kib() - after_100 < 512, (after_100, server.rss_kib())


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of pid's children, from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append((int(entry), fields[0]))
    return children


def test_no_worker_is_left_a_zombie(sandbox, server):
    for _ in range(30):
        server.call(shell(sandbox, "true"))
    time.sleep(0.3)
    children = children_of(server.proc.pid)
    assert [state for _, state in children if state in "ZX"] == []
    assert len(children) == 1  # the one worker that answered them all, waiting


def test_the_default_bound_runs_64_at_once_and_refuses_the_65th(sandbox, server):
    release = sandbox.home / "release"  # the 64 run until the refusal has come
    held = [server.request(shell(sandbox, f"until [ -e {release} ]; do sleep 0.1; done; echo {i}"))
            for i in range(frames.MAX_IN_FLIGHT_DEFAULT)]
    refused = server.request(shell(sandbox, "echo no"))
    (first,) = server.answers(1, timeout=60)
    release.touch()
    assert first["id"] == refused and first["envelope"]["error"].startswith(
        "too many requests in flight: at most 64 at once")
    answers = server.answers(frames.MAX_IN_FLIGHT_DEFAULT, timeout=60)
    texts = {a["id"]: ok_text(a["envelope"]) for a in answers}
    assert texts == {frame_id: str(i) for i, frame_id in enumerate(held)}
