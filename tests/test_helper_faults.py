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

from conftest import PYTHON, ok_text
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
