"""The E2B front's process service asleep (``guilds_code/envd.py``, ``asleep``): idle, it execs
a bash waiter in its own process; the next request's first byte execs the service again.
The built helper driven directly, then through the unmodified E2B Python SDK against a
real `guilds serve --e2b --e2b-sleep-idle 1` (local and bwrap: their processes are this machine's)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from e2b import FilesystemEventType, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from e2b_kit import (
    e2b_server,
    folder_key,
    home_of,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
    pids_in,
)
from guilds.config.settings import E2B_USER
from test_e2b_front import Envd
from test_egress_sleep import argv_of, private_kib, wait_until

SLEEP = ("--sleep-idle", "1")


def asleep(pid: int) -> bool:
    """Its process runs the bash waiter (same pid), not the service."""
    try:
        return "guilds-code-asleep" in argv_of(pid)
    except OSError:
        return False


@pytest.fixture
def sleepy(helper_path, tmp_path):
    (tmp_path / "note.txt").write_text("note")
    service = Envd(helper_path, tmp_path, *SLEEP)
    yield service
    service.close()


def test_an_idle_service_sleeps_small_and_answers_the_next_request(sleepy):
    assert sleepy("read", path="note.txt", offset=0, size=10)["ok"]["b64"] == base64.b64encode(b"note").decode()
    awake_kib = private_kib(sleepy.proc.pid)
    wait_until(lambda: asleep(sleepy.proc.pid))
    asleep_kib = private_kib(sleepy.proc.pid)
    assert asleep_kib * 4 < awake_kib and asleep_kib < 1024, (asleep_kib, awake_kib)
    assert sleepy("stat", path="note.txt")["ok"]["entry"]["size"] == "4"
    assert argv_of(sleepy.proc.pid)[-2:] == ["--woken", str(ord("{"))]
    wait_until(lambda: asleep(sleepy.proc.pid))  # and again
    assert sleepy("list")["ok"] == {"processes": []}
    assert argv_of(sleepy.proc.pid).count("--woken") == 1


def test_a_request_half_read_keeps_it_awake_until_its_end(sleepy):
    sleepy.proc.stdin.write(b'{"id": 1, "op": "st')
    sleepy.proc.stdin.flush()
    time.sleep(2.5)
    assert not asleep(sleepy.proc.pid)
    sleepy.ids = 1
    sleepy.proc.stdin.write(b'at", "path": "note.txt"}\n')
    sleepy.proc.stdin.flush()
    assert sleepy.proc.stdout.readline().startswith(b'{"id":1,"ok":')


def test_a_running_command_keeps_it_awake_and_its_output_comes_whole(sleepy):
    pid = sleepy("start", cmd="sh", args=["-c", "sleep 2.5; echo done"])["ok"]["pid"]
    time.sleep(2)
    assert not asleep(sleepy.proc.pid)
    events = [sleepy.proc.stdout.readline() for _ in range(2)]
    assert b'"b64":"ZG9uZQo="' in events[0] and f'"ev":"end","pid":{pid},"exit_code":0'.encode() in events[1]
    wait_until(lambda: asleep(sleepy.proc.pid))


def test_sleep_idle_0_never_sleeps_and_a_week_is_taken(helper_path, tmp_path):
    never = Envd(helper_path, tmp_path, "--sleep-idle", "0")
    week = Envd(helper_path, tmp_path, "--sleep-idle", "604800")
    try:
        time.sleep(2.5)
        assert not asleep(never.proc.pid) and never("list")["ok"] == {"processes": []}
        assert week("list")["ok"] == {"processes": []}
    finally:
        never.close()
        week.close()


def test_a_long_request_written_in_pieces_is_answered_whole(sleepy):
    data = bytes(range(256)) * 4096  # 1 MiB: a line of about 1.4 MB
    sleepy.proc.stdin.write(b'{"id": 1, "op": "write", "path": "big.bin", "append": false, "b64": "')
    encoded = base64.b64encode(data)
    for at in range(0, len(encoded), 50_000):
        sleepy.proc.stdin.write(encoded[at:at + 50_000])
        sleepy.proc.stdin.flush()
    sleepy.proc.stdin.write(b'"}\n')
    sleepy.proc.stdin.flush()
    assert json.loads(sleepy.proc.stdout.readline())["ok"]["entry"]["size"] == str(len(data))
    sleepy.ids = 1
    wait_until(lambda: asleep(sleepy.proc.pid))
    assert sleepy("stat", path="big.bin")["ok"]["entry"]["size"] == str(len(data))


@pytest.mark.parametrize(("options", "error"), [
    (("--sleep-idle",), "--sleep-idle needs a value"),
    (("--sleep-idle", "soon"), "--sleep-idle: must be an integer, got 'soon'"),
    (("--sleep-idle", "604801"), "--sleep-idle: must be from 0 to 604800"),
    (("--woken", "256"), "--woken: must be from 0 to 255"),
    (("--nap", "1"), "unknown option --nap"),
])
def test_bad_options_are_one_line_and_exit_2(helper_path, tmp_path, options, error):
    done = subprocess.run([sys.executable, "-I", "-S", str(helper_path), "envd", str(tmp_path), *options],
                          check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"guilds-code envd: {error}") and done.stderr.count("\n") == 1


# --- through the E2B SDK ---------------------------------------------------------------

@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp(f"e2b-sleep-{backend}"), backend,
                    options=("--e2b-sleep-idle", "1")) as served:
        yield served


def _is_envd(argv: list[str], home: str) -> bool:
    """The service's command line (or its waiter's, which holds it): the helper's ``envd HOME``,
    not bwrap's nsenter (and setpriv) into the sandbox."""
    return not argv[0].endswith(("nsenter", "setpriv")) and any(
        "guilds-code" in a.rsplit("/", 1)[-1] and argv[i + 1:i + 3] == ["envd", home] for i, a in enumerate(argv))


def _envd_in(home: str) -> list[int]:
    """The process services running in that home (a host folder; inside, its path or /home/user
    is on their command line)."""
    return [pid for pid in pids_in(folder_key(home))
            if any(_is_envd(argv_of(pid), inside) for inside in (home, E2B_USER.home))]


def envd_pid(box: Sandbox, data: Path) -> int:
    """The sandbox's process service on this machine (awake or asleep: it runs in its home)."""
    [pid] = _envd_in(str(home_of(box, data)))
    return pid


@pytest.mark.slow
@pytest.mark.backends("local", "bwrap")
def test_an_idle_sandboxes_service_sleeps_and_every_call_after_is_right(server, sbx):
    pid = envd_pid(sbx, server.data)
    sbx.files.write("kept.txt", "kept")
    awake_kib = private_kib(pid)
    wait_until(lambda: asleep(pid))
    asleep_kib = private_kib(pid)
    assert asleep_kib * 4 < awake_kib and asleep_kib < 1024, (asleep_kib, awake_kib)
    assert sbx.commands.run("echo woken").stdout == "woken\n"
    assert envd_pid(sbx, server.data) == pid and not asleep(pid)
    wait_until(lambda: asleep(pid))
    assert sbx.files.read("kept.txt") == "kept"
    wait_until(lambda: asleep(pid))
    seen: list[str] = []
    result = sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", on_stdout=seen.append)
    assert result.stdout == "1\n2\n3\n" and "".join(seen) == "1\n2\n3\n"
    wait_until(lambda: asleep(pid))
    sbx.files.write("new.txt", "new")
    assert sbx.commands.run("cat new.txt kept.txt").stdout == "newkept"


@pytest.mark.slow
@pytest.mark.backends("local", "bwrap")
def test_a_background_command_or_an_open_stream_keeps_it_awake(server, sbx):
    pid = envd_pid(sbx, server.data)
    handle = sbx.commands.run("sleep 3; echo late", background=True)
    time.sleep(2.5)
    assert not asleep(pid)
    assert handle.wait().stdout == "late\n"
    wait_until(lambda: asleep(pid))
    streamed: list[str] = []
    stream = threading.Thread(target=lambda: streamed.append(
        sbx.commands.run("echo first; sleep 3; echo second").stdout))
    stream.start()
    time.sleep(2.5)
    assert not asleep(pid)
    stream.join(30)
    assert streamed == ["first\nsecond\n"]
    wait_until(lambda: asleep(pid))


@pytest.mark.slow
@pytest.mark.backends("local", "bwrap")
def test_a_terminal_after_a_sleep_works_and_an_open_one_or_a_watcher_keeps_it_awake(server, sbx):
    pid = envd_pid(sbx, server.data)
    wait_until(lambda: asleep(pid))
    terminal = sbx.pty.create(PtySize(cols=80, rows=24))
    time.sleep(2.5)
    assert not asleep(pid)  # an open terminal
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    output: list[bytes] = []
    assert terminal.wait(on_pty=output.append).exit_code == 0
    assert "24 80" in b"".join(output).decode(errors="replace")
    wait_until(lambda: asleep(pid))
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched")
    time.sleep(2.5)
    assert not asleep(pid)  # a watcher holds its events
    sbx.files.write("watched/a.txt", "one")
    assert ("a.txt", FilesystemEventType.CREATE) in [(e.name, e.type) for e in handle.get_new_events()]
    handle.stop()
    wait_until(lambda: asleep(pid))


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_a_pooled_agents_service_stays_awake_until_a_create_takes_it(tmp_path, backend, monkeypatch):
    """The pool holds its agents' services started ahead awake (a request each half sleep time):
    the sandbox that takes one gets a service that answers at once, which then sleeps as any."""
    import sqlite3

    (tmp_path / "home").mkdir()
    with e2b_server(tmp_path, backend, "[pool]\nspare = 1\nmax = 1\n", options=("--e2b-sleep-idle", "1")) as served:
        served.export(monkeypatch)

        def pooled_home() -> str | None:
            with sqlite3.connect(served.data / "guilds.db") as conn:
                rows = conn.execute("SELECT home FROM agents WHERE status = 'pooled'").fetchall()
            return rows[0][0] if rows else None

        wait_until(lambda: pooled_home() is not None and _envd_in(pooled_home()) != [], seconds=120)
        home = pooled_home()
        [pid] = _envd_in(home)
        for _ in range(8):  # four of its sleep times, looked at every half second
            time.sleep(0.5)
            assert not asleep(pid)
        box = Sandbox.create(timeout=120)
        try:
            assert str(home_of(box, served.data)) == home and envd_pid(box, served.data) == pid
            assert box.commands.run("echo taken").stdout == "taken\n"
            wait_until(lambda: asleep(pid))  # taken, it sleeps when idle as any sandbox's service
        finally:
            box.kill()
