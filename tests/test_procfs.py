"""The orchestrator's reads of /proc (guilds.procfs) on real processes: running or not, by
pid and start time, a zombie and a process killed counted as not running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from guilds.procfs import running, start_time


def test_a_running_process_runs_and_a_killed_one_or_another_start_does_not():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = start_time(proc.pid)
        assert start is not None and running(proc.pid, start)
        assert not running(proc.pid, start + 1)  # another process of that pid
        os.kill(proc.pid, signal.SIGKILL)
        assert not running(proc.pid, start)  # at once: killed, a zombie, or gone
    finally:
        proc.kill()
        proc.wait()
    assert not running(proc.pid, start)


def test_a_zombie_does_not_run():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    start = start_time(proc.pid)
    assert start is not None and running(proc.pid, start)
    proc.stdin.close()  # it ends
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
    assert not running(proc.pid, start)
    proc.wait()
