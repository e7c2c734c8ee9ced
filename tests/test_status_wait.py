"""shell_status wait and until: through the built helper (real bash, real logs) and Toolbox.call."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, error_text, ok_text
from guilds_code import limits
from toolbox_kit import local_toolbox


@pytest.fixture
def bg(sandbox):
    """The sandbox; afterwards every background group still running is killed."""
    yield sandbox
    folder = sandbox.state / sandbox.agent_id / "background"
    for path in folder.glob("b*.json") if folder.exists() else []:
        try:
            os.killpg(json.loads(path.read_text())["pid"], signal.SIGKILL)
        except OSError:
            pass


LATER = 2
"""Seconds a command sleeps before the line a wait looks for: `until` sees only lines written
after the call began, and on a loaded machine the start and the call's own start take a while."""


def start(sandbox, command, **extra):
    env = sandbox.call("shell", {"command": command, "background": True}, **extra)
    return env["meta"]["background_id"], env["meta"]["log_path"]


def status(sandbox, timeout=60, **args):
    return sandbox.call("shell_status", args, timeout=timeout)


def first_line(env):
    return ok_text(env).split("\n", 1)[0]


def cpu_of_children(fn):
    """fn's result and the CPU seconds its child processes used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# --- wait on one command ------------------------------------------------------------
def test_wait_returns_when_the_command_ends(bg):
    bid, _ = start(bg, f"sleep {LATER}; echo done")
    began = time.monotonic()
    env = status(bg, id=bid, wait=30)
    took = time.monotonic() - began
    assert first_line(env) == "ended"
    assert ok_text(env).split("\n")[1].startswith(f"{bid} exited 0 ")
    assert ok_text(env).endswith("done")
    assert 0.5 < took < LATER + 5 and 500 <= env["meta"]["waited_ms"] <= took * 1000
    assert env["meta"]["state"] == "exited 0" and "matched" not in env["meta"]


def test_wait_on_a_command_already_ended_returns_at_once(bg):
    bid, _ = start(bg, "true")
    for _ in range(100):
        if status(bg, id=bid)["meta"]["state"] == "exited 0":
            break
        time.sleep(0.05)
    env = status(bg, id=bid, wait=600)
    assert first_line(env) == "ended" and env["meta"]["waited_ms"] == 0


def test_wait_passes(bg):
    bid, _ = start(bg, "sleep 30")
    began = time.monotonic()
    env = status(bg, id=bid, wait=1)
    assert first_line(env) == "still running after 1s"
    assert env["meta"]["state"] == "running" and 1000 <= env["meta"]["waited_ms"] < 2500
    assert time.monotonic() - began < 3


def test_a_check_without_wait_is_as_before(bg):
    bid, _ = start(bg, "echo hi; sleep 30")
    time.sleep(0.3)
    env = status(bg, id=bid)
    assert ok_text(env).split("\n")[0].startswith(f"{bid} running ")
    assert set(env["meta"]) == {"background_id", "state", "log_path"}


# --- until --------------------------------------------------------------------------
def test_until_returns_at_the_first_new_matching_line(bg):
    bid, _ = start(bg, f"sleep {LATER}; for i in 1 2 3; do echo compiling $i; sleep 0.3; done; "
                       "echo '  Local: http://localhost:3000/'; echo 'ready in 412 ms'; sleep 30")
    began = time.monotonic()
    env = status(bg, id=bid, until=r"ready in \d+ ms|Local:", wait=30)
    assert first_line(env) == "matched: Local: http://localhost:3000/"
    assert env["meta"]["matched"] == "Local: http://localhost:3000/"
    assert env["meta"]["state"] == "running" and time.monotonic() - began < LATER + 5


def test_until_sees_only_new_lines(bg):
    bid, log = start(bg, "echo ready; sleep 30")
    for _ in range(100):
        if Path(log).read_text():
            break
        time.sleep(0.05)
    env = status(bg, id=bid, until="ready", wait=1)
    assert first_line(env) == "still running after 1s" and env["meta"]["matched"] is None


def test_until_matches_a_last_line_without_newline_at_the_end(bg):
    bid, _ = start(bg, f"sleep {LATER}; printf 'all done'")
    env = status(bg, id=bid, until="done$", wait=30)
    assert first_line(env) == "matched: all done"


def test_until_without_a_match_ends_with_the_command(bg):
    bid, _ = start(bg, "sleep 0.5; echo nothing here; exit 3")
    env = status(bg, id=bid, until="never", wait=30)
    assert first_line(env) == "ended" and env["meta"]["exit_code"] == 3 and env["meta"]["matched"] is None


def test_until_sees_lines_shaped_and_redacted(bg):
    bg.env["API_KEY"] = "k-4242-secret-value"
    bid, _ = start(bg, f"sleep {LATER}; printf '\\033[32mREADY\\033[0m with %s\\n' \"$API_KEY\"; sleep 30",
                   redact_env=["API_KEY"])
    env = bg.call("shell_status", {"id": bid, "until": "^READY with", "wait": 30}, redact_env=["API_KEY"])
    assert first_line(env) == "matched: READY with [REDACTED]"
    assert "k-4242" not in json.dumps(env)


def test_until_alone_waits_its_default(bg):
    bid, _ = start(bg, "sleep 0.4; echo go")
    env = status(bg, id=bid, until="go")
    assert first_line(env) == "matched: go"


# --- without id ---------------------------------------------------------------------
def test_wait_without_id_returns_when_any_command_ends(bg):
    start(bg, "sleep 30")
    quick, _ = start(bg, "sleep 0.7")
    began = time.monotonic()
    env = status(bg, wait=30)
    lines = ok_text(env).split("\n")
    assert lines[0] == f"ended: {quick}" and time.monotonic() - began < 3
    assert lines[1].startswith("b1 running ") and lines[2].startswith(f"{quick} exited 0 ")


def test_wait_without_id_and_nothing_running(bg):
    env = status(bg, wait=5)
    assert ok_text(env) == "no command is running\nno background commands"
    assert env["meta"] == {"waited_ms": 0}


def test_wait_without_id_passes(bg):
    start(bg, "sleep 30")
    env = status(bg, wait=1)
    assert first_line(env) == "still running after 1s"


# --- bad input, by name; edges ------------------------------------------------------------
@pytest.mark.parametrize(
    "args, error",
    [
        ({"id": "b1", "wait": 0}, "wait: must be from 1 to 600, got 0"),
        ({"id": "b1", "wait": 601}, "wait: must be from 1 to 600, got 601"),
        ({"id": "b1", "wait": True}, "wait: must be an integer, got true"),
        ({"id": "b1", "wait": 1.5}, "wait: must be an integer, got 1.5"),
        ({"until": "ready"}, "until: needs an id"),
        (
            {"id": "b1", "until": "(unclosed"},
            "until: not a valid regular expression (missing ), unterminated subpattern at position 0)",
        ),
        ({"id": "b1", "until": ""}, "until: must be 1 to 1000 characters"),
        ({"id": "b1", "until": "x" * (limits.UNTIL_MAX_CHARS + 1)}, "until: must be 1 to 1000 characters"),
        ({"id": "b1", "stop": True, "wait": 5}, "wait: not with stop"),
        ({"id": "b1", "stop": True, "until": "x"}, "until: not with stop"),
    ],
)
def test_bad_wait_and_until_are_refused_by_name(bg, args, error):
    assert error_text(status(bg, **args)) == error


def test_the_edges_are_accepted(bg):
    bid, _ = start(bg, "true")
    time.sleep(0.3)
    assert first_line(status(bg, id=bid, wait=1)) == "ended"
    assert first_line(status(bg, id=bid, wait=600)) == "ended"
    assert first_line(status(bg, id=bid, until="x" * limits.UNTIL_MAX_CHARS)) == "ended"


# --- no CPU while waiting; cancelled like any call --------------------------------------
@pytest.mark.parametrize("until", [None, "never matches"])
def test_waiting_costs_no_cpu(bg, until):
    bid, _ = start(bg, "sleep 30")
    args = {"id": bid, "wait": 3} if until is None else {"id": bid, "wait": 3, "until": until}
    env, cpu = cpu_of_children(lambda: status(bg, **args))
    assert first_line(env) == "still running after 3s"
    assert cpu < 0.25, cpu  # the helper's start included; the 3 s of waiting is a few ms


def test_a_helper_told_to_stop_ends_its_wait_at_once(bg):
    bid, _ = start(bg, "sleep 30")
    arg = base64.b64encode(json.dumps(bg.request("shell_status", {"id": bid, "wait": 60})).encode()).decode()
    helper = subprocess.Popen([PYTHON, "-I", "-S", str(bg.helper), arg], env=bg.process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.5)
    began = time.monotonic()
    helper.send_signal(signal.SIGTERM)
    helper.communicate(timeout=10)
    assert time.monotonic() - began < 1.0
    assert status(bg, id=bid)["meta"]["state"] == "running"  # the command itself goes on


# --- through Toolbox.call -------------------------------------------------------------------
async def test_toolbox_dev_server_waited_for_with_until(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        started = await tb.call("r", "shell", {"command": f"sleep {LATER}; echo 'listening on :8000'; sleep 30",
                                               "background": True})
        bid = started.meta["background_id"]
        try:
            result = await tb.call("r", "shell_status", {"id": bid, "until": "listening on", "wait": 20})
            assert result.text.startswith("matched: listening on :8000\n") and not result.is_error
            assert result.meta["matched"] == "listening on :8000" and result.meta["waited_ms"] < 10_000
            assert result.meta["row"] == f"Check {bid}"
        finally:
            await tb.call("r", "shell_status", {"id": bid, "stop": True})


async def test_toolbox_a_cancelled_wait_is_recorded_and_quick(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        started = await tb.call("r", "shell", {"command": "sleep 30", "background": True})
        bid = started.meta["background_id"]
        try:
            task = asyncio.create_task(tb.call("r", "shell_status", {"id": bid, "wait": 120}))
            await asyncio.sleep(1.0)
            began = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - began < 5
            record = await tb.store.call("r", 2)
            assert record.status == "cancelled"
        finally:
            await tb.call("r", "shell_status", {"id": bid, "stop": True})


async def test_toolbox_refuses_a_bad_until_without_running_anything(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        result = await tb.call("r", "shell_status", {"until": "x"})
        assert result.is_error and result.text.startswith("until: needs an id\n")


def test_until_sees_the_first_4096_characters_of_a_line(bg):
    n = limits.UNTIL_MATCH_MAX_CHARS
    bid, _ = start(bg, f"sleep {LATER}; printf 'a%.0s' $(seq {n}); echo LATE; "
                       f"printf 'b%.0s' $(seq {n - 4}); echo EDGE; sleep 30")
    env = status(bg, id=bid, until="LATE|EDGE", wait=10)
    assert first_line(env).startswith("matched: bbbb") and first_line(env).endswith(" chars]")
