"""guilds-code serve's workers: kept warm between requests, bounded, never reused
after a cancel; and the server's one watchdog, which SIGKILLs a command's group
when its worker dies. The built helper under python3 -I -S, real bash."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time

import pytest

from conftest import PYTHON, ok_text
from guilds_code import limits
from guilds_code.proc import live_groups, proc_stat
from resident_kit import ResidentServer
from test_helper_faults import _wait_for
from test_resident import children_of, sandbox, server, shell  # noqa: F401  (fixtures)


def worker_of(sandbox, server) -> int:
    """The pid of the worker that answers the next request."""
    return int(ok_text(server.call(shell(sandbox, "echo $PPID"))))


def test_requests_in_turn_share_one_warm_worker(sandbox, server):
    first = worker_of(sandbox, server)
    assert {worker_of(sandbox, server) for _ in range(10)} == {first}
    assert proc_stat(first).ppid == server.proc.pid


def test_a_worker_answers_at_most_its_bound_then_a_new_one_takes_over(sandbox, server):
    first = worker_of(sandbox, server)  # request 1 of that worker
    for _ in range(limits.SERVE_WORKER_REQUESTS_MAX - 2):
        server.call(shell(sandbox, ":"))
    assert worker_of(sandbox, server) == first  # its last
    assert _wait_for(lambda: first not in {pid for pid, _ in children_of(server.proc.pid)})
    assert worker_of(sandbox, server) != first


def test_at_most_the_bound_of_workers_wait(sandbox, server):
    count = limits.SERVE_IDLE_WORKERS_MAX + 3
    frame_ids = [server.request(shell(sandbox, "sleep 1; echo $PPID")) for _ in range(count)]
    answers = server.answers(count, timeout=30)
    assert sorted(a["id"] for a in answers) == sorted(frame_ids)
    assert len({ok_text(a["envelope"]) for a in answers}) == count  # each ran in a worker of its own
    assert _wait_for(lambda: len(children_of(server.proc.pid)) == limits.SERVE_IDLE_WORKERS_MAX)


def test_a_cancelled_worker_is_not_reused(sandbox, server):
    first = worker_of(sandbox, server)
    frame_id = server.request(shell(sandbox, "sleep 30"))
    time.sleep(0.3)
    server.cancel(frame_id)
    (answer,) = server.answers(1, timeout=10)
    assert answer["envelope"]["error"].startswith("cancelled")
    assert _wait_for(lambda: first not in {pid for pid, _ in children_of(server.proc.pid)})
    assert worker_of(sandbox, server) != first


def test_a_waiting_worker_that_dies_is_replaced(sandbox, server):
    first = worker_of(sandbox, server)
    os.kill(first, signal.SIGKILL)
    assert _wait_for(lambda: first not in {pid for pid, _ in children_of(server.proc.pid)})
    assert worker_of(sandbox, server) not in (first, 0)


def test_a_stopped_waiting_worker_does_not_hold_up_the_next_request(sandbox, server):
    first = worker_of(sandbox, server)
    os.kill(first, signal.SIGSTOP)  # the agent's own commands run as the same user
    try:
        began = time.monotonic()
        long_command = ": '" + "x" * (256 * 1024) + "'; echo $PPID"  # more than a pipe holds
        worker = int(ok_text(server.call(shell(sandbox, long_command), timeout=10)))
        assert worker != first and time.monotonic() - began < limits.SERVE_HAND_SECONDS + 2
        assert _wait_for(lambda: first not in {pid for pid, _ in children_of(server.proc.pid)})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first, signal.SIGKILL)


def test_an_ended_background_command_is_not_left_a_zombie_under_its_worker(sandbox, server):
    worker = worker_of(sandbox, server)
    ok_text(server.call(shell(sandbox, "true", background=True)))
    time.sleep(0.5)
    assert worker_of(sandbox, server) == worker  # the worker reaps it once it has answered that request
    assert _wait_for(lambda: [state for _, state in children_of(worker) if state in "ZX"] == [])


def _group_of_a_running_command(sandbox, server) -> tuple[int, str]:
    marker = sandbox.home / "pgid"
    frame_id = server.request(shell(sandbox, f"sleep 300 & echo $$ > {marker}; sleep 300; :", timeout_seconds=600))
    assert _wait_for(lambda: marker.exists() and marker.read_text().strip())
    pgid = int(marker.read_text())
    assert pgid in live_groups()
    return pgid, frame_id


def _per_call_watchdogs(pgid: int) -> list[int]:
    """The pids of one-shot watchdogs (a bash named guilds-watch) watching pgid."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if fh.read().split(b"\0")[-3:-1] == [b"guilds-watch", str(pgid).encode()]:
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("killed", ["worker", "worker and server"])
def test_the_command_dies_with_its_worker_killed_by_sigkill(sandbox, server, killed):
    pgid, _ = _group_of_a_running_command(sandbox, server)
    try:
        assert _per_call_watchdogs(pgid) == []  # the server's one watchdog has it
        worker = proc_stat(pgid).ppid
        assert proc_stat(worker).ppid == server.proc.pid
        if killed != "worker":
            server.proc.kill()
        os.kill(worker, signal.SIGKILL)
        assert _wait_for(lambda: pgid not in live_groups()), "the command outlived its worker"
    finally:
        if pgid in live_groups():
            os.killpg(pgid, signal.SIGKILL)


def test_a_worker_done_in_time_leaves_its_commands_leftovers_alone(sandbox, server, tmp_path):
    marker = sandbox.home / "pid"
    text = ok_text(server.call(shell(sandbox, f"sleep 30 >/dev/null 2>&1 & echo $! > {marker}; echo done")))
    assert text == "done"
    pid = int(marker.read_text())
    os.kill(worker_of(sandbox, server), signal.SIGKILL)  # its worker dies later: nothing is watched
    time.sleep(0.5)
    try:
        os.kill(pid, 0)
    finally:
        os.kill(pid, signal.SIGKILL)


def _watchdog_of(server) -> int:
    """The server's watchdog: a process of the server's own command line that is none of its children."""
    with open(f"/proc/{server.proc.pid}/cmdline", "rb") as fh:
        argv = fh.read()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                same = fh.read() == argv
        except OSError:
            continue
        stat = proc_stat(int(entry)) if same else None
        if stat is not None and int(entry) != server.proc.pid and stat.ppid != server.proc.pid:
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def _woken(pid: int) -> int:
    """How many times pid has gone to sleep and been woken (its voluntary context switches)."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt_switches:"))


def test_calls_in_a_row_do_not_wake_the_watchdog_at_each_line(sandbox, server):
    """Each call writes the watchdog two lines; while they come it reads them once a
    WATCHDOG_READ_SECONDS tick instead, so calls well within the tick wake it fewer times
    than there are calls. Calls near or past the tick (a loaded machine) leave it little
    to gather (a tick that finds no line sends it back to waiting on the pipe): such a
    round is measured again, up to three rounds."""
    watchdog = _watchdog_of(server)
    calls, rounds = 100, []
    for _ in range(3):
        before, began = _woken(watchdog), time.monotonic()
        for _ in range(calls):
            server.call(shell(sandbox, "true"))
        took, woken = time.monotonic() - began, _woken(watchdog) - before
        if took / calls < limits.WATCHDOG_READ_SECONDS / 2:
            assert woken < calls, (woken, took)  # two lines a call
            return
        rounds.append(f"{took / calls * 1000:.0f} ms a call, woken {woken} times")
    pytest.skip(f"calls slower than half the watchdog's tick in every round ({'; '.join(rounds)})")


def test_a_worker_dead_before_the_watchdog_read_its_line_has_its_command_killed(sandbox, server):
    watchdog = _watchdog_of(server)
    os.kill(watchdog, signal.SIGSTOP)  # the lines wait in its pipe, as they do between two reads
    try:
        pgid, _ = _group_of_a_running_command(sandbox, server)  # the server's first worker
        worker = proc_stat(pgid).ppid
        os.kill(worker, signal.SIGKILL)
        assert _wait_for(lambda: worker not in {pid for pid, _ in children_of(server.proc.pid)})  # reaped
    finally:
        os.kill(watchdog, signal.SIGCONT)
    try:
        assert _wait_for(lambda: pgid not in live_groups()), "the command outlived its worker"
    finally:
        if pgid in live_groups():
            os.killpg(pgid, signal.SIGKILL)


def test_no_descriptor_the_server_inherited_reaches_a_command_in_any_of_its_calls(sandbox):
    read, write = os.pipe()
    try:
        served = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), pass_fds=(write,))
    finally:
        os.close(read)
        os.close(write)
    try:
        listings = [ok_text(served.call(shell(sandbox, "echo $PPID; ls /proc/$$/fd"))).split() for _ in range(3)]
    finally:
        served.close()
    assert len({worker for worker, *_ in listings}) == 1  # one warm worker ran the three
    assert [fds for _, *fds in listings] == [["0", "1", "2", "87"]] * 3


def _watchdogs_of(server) -> list[int]:
    """The server's watchdogs: processes of its command line that are none of its children."""
    with open(f"/proc/{server.proc.pid}/cmdline", "rb") as fh:
        argv = fh.read()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                same = fh.read() == argv
            stat = proc_stat(int(entry)) if same and int(entry) != server.proc.pid else None
            if stat is not None and stat.ppid != server.proc.pid and stat.state != "Z":
                found.append(int(entry))
    return found


def test_an_idle_server_keeps_no_worker_nor_watchdog_and_the_next_call_has_both_again(sandbox):
    server = ResidentServer(PYTHON, str(sandbox.helper), sandbox.process_env(), "--workers-idle", "1")
    try:
        first = worker_of(sandbox, server)
        assert len(_watchdogs_of(server)) == 1 and children_of(server.proc.pid)
        assert _wait_for(lambda: not children_of(server.proc.pid) and not _watchdogs_of(server), timeout=10)
        assert worker_of(sandbox, server) != first
        assert len(_watchdogs_of(server)) == 1  # started again before the fork
        pgid, _ = _group_of_a_running_command(sandbox, server)
        try:
            assert _per_call_watchdogs(pgid) == []  # the server's watchdog has it, not one of its own
            os.kill(proc_stat(pgid).ppid, signal.SIGKILL)
            assert _wait_for(lambda: pgid not in live_groups()), "the command outlived its worker"
        finally:
            if pgid in live_groups():
                os.killpg(pgid, signal.SIGKILL)
    finally:
        server.close()


def test_a_worker_writes_its_answer_to_the_channel_itself(sandbox, server):
    """No hop through the server on the way back: with the server stopped once the
    request is handed over, its answer still comes."""
    started = sandbox.home / "started"
    frame_id = server.request(shell(sandbox, f"touch {started}; sleep 0.3; echo direct"))
    assert _wait_for(started.exists)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        (answer,) = server.answers(1, timeout=10)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert (answer["id"], ok_text(answer["envelope"])) == (frame_id, "direct")
    assert ok_text(server.call(shell(sandbox, "echo next"))) == "next"  # and the server knows it answered


def _frames_lock_of(server) -> int:
    """A descriptor of the server's frames lock (its memfd), opened by this process."""
    folder = f"/proc/{server.proc.pid}/fd"
    (name,) = [fd for fd in os.listdir(folder) if os.readlink(f"{folder}/{fd}").startswith("/memfd:guilds-frames")]
    return os.open(f"{folder}/{name}", os.O_RDWR)


def test_a_cancel_that_meets_a_finished_answer_leaves_one_answer(sandbox, server):
    """The worker has its answer and waits for the frames lock, and the cancel comes:
    whichever takes the lock first, the request is answered once."""
    started = sandbox.home / "started"
    lock = _frames_lock_of(server)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        frame_id = server.request(shell(sandbox, f"touch {started}; echo done"))
        assert _wait_for(started.exists)
        time.sleep(0.3)  # its answer made, the worker waits for the lock
        server.cancel(frame_id)  # the server waits for it too
        time.sleep(0.2)
    finally:
        fcntl.lockf(lock, fcntl.LOCK_UN)
        os.close(lock)
    (answer,) = server.answers(1, timeout=10)
    assert answer["id"] == frame_id
    assert answer["envelope"].get("text") == "done" or answer["envelope"]["error"].startswith("cancelled")
    time.sleep(0.5)  # a second answer to it would come by now
    assert ok_text(server.call(shell(sandbox, "echo next"))) == "next"
