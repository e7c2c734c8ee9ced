"""The toolbox on the resident transport: the real helper in the local sandbox, real bash.

Both transports share the state; a dead channel is reopened; a call in flight
when it died is run again only when that is safe; cancellation; the request limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time

import pytest

from guilds.record.store import Store
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox import Toolbox
from guilds.toolbox.resident_channel import ChannelDied, ResidentChannel
from guilds.toolbox.transport import Transport
from guilds_code import limits
from test_resident import children_of
from toolbox_kit import FakeSandbox, local_toolbox, make_settings, ok

TRAILER = "\nremaining_tool_calls: "


def body(text: str) -> str:
    return text.split(TRAILER)[0]


async def wait_for_file(path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        await asyncio.sleep(0.05)
    return path.read_text().strip()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


async def test_auto_uses_the_channel_and_calls_alternate_between_transports(tmp_path):
    async with (
        Store(f"sqlite:///{tmp_path}/guilds.db") as store,
        local_toolbox(tmp_path, store, agent={"transport": "resident"}) as resident,
        local_toolbox(tmp_path, store, agent={"transport": "exec"}) as by_exec,
        local_toolbox(tmp_path, store) as auto,
    ):
        (tmp_path / "home/sub").mkdir(parents=True)
        await resident.call("r1", "shell", {"command": "cd sub"})
        assert body((await by_exec.call("r1", "shell", {"command": "pwd"})).text) == f"{tmp_path}/home/sub"
        started = await by_exec.call("r1", "shell", {"command": "sleep 30", "background": True})
        pid = int(started.text.split("(pid ")[1].split(")")[0])
        try:
            status = await resident.call("r1", "shell_status", {"id": "b1"})
            assert status.text.startswith("b1 running")
            await resident.close()  # a background command outlives the server
            assert not gone(pid)
            stopped = await auto.call("r1", "shell_status", {"id": "b1", "stop": True})
            assert stopped.text.startswith("stopped b1")  # by exec: the channel opens meanwhile
            channel = await auto.transport.opened()
            assert channel is not None and auto.transport.channel is channel
            after = await auto.call("r1", "shell_status", {"id": "b1"})
            assert after.text.startswith("b1 stopped")
        finally:
            os.kill(pid, signal.SIGKILL)
        assert by_exec.transport.channel is None


async def test_a_killed_server_is_reopened_by_the_next_call(tmp_path):
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        assert body((await tb.call("r", "shell", {"command": "echo one"})).text) == "one"
        first = tb.transport.channel.pid
        os.kill(first, signal.SIGKILL)
        await asyncio.sleep(0.2)
        assert body((await tb.call("r", "shell", {"command": "echo two"})).text) == "two"
        assert tb.transport.channel.pid != first


async def test_a_shell_in_flight_when_the_server_dies_gets_a_clear_error_once(tmp_path):
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        await tb.call("r", "shell", {"command": "true"})
        marker = tmp_path / "home/pid"
        call = asyncio.ensure_future(tb.call("r", "shell", {"command": f"echo $$ > {marker}; sleep 30"}))
        await wait_for_file(marker)
        os.kill(tb.transport.channel.pid, signal.SIGKILL)
        result = await asyncio.wait_for(call, 10)
        assert result.is_error
        assert body(result.text).startswith("code helper failed: the resident helper ended while the call "
                                            "ran (the resident helper ended")
        assert body(result.text).endswith("; the call may have run in part")
        record = await tb.store.call("r", 2)
        assert (record.text, record.is_error, record.status) == (result.text, True, "done")
        assert body((await tb.call("r", "shell", {"command": "echo next"})).text) == "next"


@pytest.mark.parametrize("tool, args, expected", [
    ("file_read", {"path": "f.txt"}, "f.txt lines 1–2 of 2\n1  a\n2  b"),
    ("code_search", {"pattern": "b"}, "f.txt: 1 match\n1 match in 1 file"),
    ("shell_status", {}, "no background commands"),
])
async def test_a_safe_call_in_flight_when_the_server_dies_runs_once_more(tmp_path, tool, args, expected):
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        await tb.call("r", "shell", {"command": "true"})
        (tmp_path / "home/f.txt").write_text("a\nb\n")
        server = tb.transport.channel.pid
        helper = signal_helper(server, signal.SIGSTOP)  # the request waits in its stdin...
        call = asyncio.ensure_future(tb.call("r", tool, args))
        await asyncio.sleep(0.3)
        signal_helper(server, signal.SIGKILL, helper)  # ...and dies there
        result = await asyncio.wait_for(call, 20)
        assert (result.is_error, body(result.text)) == (False, expected)
        assert tb.transport.channel.pid != server


def signal_helper(server: int, sig: int, pids: list[int] | None = None) -> list[int]:
    """sig to the resident server and its workers (the one waiting may read the next request
    itself: stopping the server alone leaves it reading); the pids signalled."""
    pids = pids if pids is not None else [server, *(pid for pid, _ in children_of(server))]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


async def test_cancelling_a_call_stops_its_command_on_the_channel(tmp_path):
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        marker = tmp_path / "home/pid"
        call = asyncio.ensure_future(tb.call("r", "shell", {"command": f"sleep 60 & echo $! > {marker}; wait"}))
        pid = int(await wait_for_file(marker))
        began = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert time.monotonic() - began < 3
        deadline = time.monotonic() + 5
        while not gone(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert gone(pid)
        record = await tb.store.call("r", 1)
        assert record.status == "cancelled"
        assert body((await tb.call("r", "shell", {"command": "echo alive"})).text) == "alive"


async def _open_channel(tmp_path, max_in_flight: int = 8) -> tuple[ResidentChannel, dict]:
    """A channel to a resident helper in a local sandbox, and the fields of a shell request there."""
    settings = make_settings(tmp_path)
    box = LocalSandbox(settings, tmp_path / "data")
    await box.start()
    from guilds.toolbox.transport import serve_argv

    request = {"op": "shell", "run_id": "r", "agent_id": settings.id, "home": box.home}
    return await ResidentChannel.open(box, serve_argv(box, max_in_flight)), request


async def test_the_request_limit_stays_on_the_channel(tmp_path):
    channel, shell_request = await _open_channel(tmp_path, 4)
    try:
        base = {**shell_request, "call_id": "c1"}
        filler = "x" * (limits.REQUEST_FILE_MAX - len(str(base)) - 40)
        with pytest.raises(Exception, match=f"request: larger than {limits.REQUEST_FILE_MAX} bytes; not sent"):
            await channel.call({**base, "args": {"command": filler + "y" * 100}}, 30)
        assert (await channel.call({**base, "args": {"command": "echo small"}}, 30))["text"] == "small"
    finally:
        await channel.close()


async def test_a_server_of_another_version_is_refused(tmp_path):
    settings = make_settings(tmp_path)
    box = LocalSandbox(settings, tmp_path / "data")
    await box.start()
    speaks_2 = [sys.executable, "-c", ("import sys,time; print('{\"v\": 2, \"hello\": \"guilds-code\"}', "
                                      "flush=True); sys.stdin.read()")]
    with pytest.raises(ChannelDied, match="speaks protocol 2; this orchestrator speaks 1"):
        await ResidentChannel.open(box, speaks_2)


async def test_resident_without_a_channel_is_an_error_and_auto_falls_back(tmp_path):
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        fake = FakeSandbox(lambda request: ok("by exec"))
        strict = Toolbox(make_settings(tmp_path, agent={"transport": "resident"}), fake, store)
        result = await strict.call("r", "shell", {"command": "true"})
        assert (result.is_error, body(result.text)) == (
            True, "sandbox error: cannot open the resident helper: the fake sandbox runs no long-lived process")
        auto = Toolbox(make_settings(tmp_path), fake, store)
        assert body((await auto.call("r", "shell", {"command": "true"})).text) == "by exec"


async def test_auto_falls_back_to_exec_when_the_server_cannot_start(tmp_path):
    settings = make_settings(tmp_path)

    class NoServer(LocalSandbox):
        opens = 0

        async def open_process(self, argv):
            NoServer.opens += 1
            return await super().open_process([sys.executable, "-c", "raise SystemExit('no serve here')"])

    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        tb = Toolbox(settings, NoServer(settings, tmp_path / "data"), store)
        assert body((await tb.call("r", "shell", {"command": "echo by exec"})).text) == "by exec"
        assert await tb.transport.opened() is None
        assert body((await tb.call("r", "shell", {"command": "echo again"})).text) == "again"
        assert await tb.transport.opened() is None
        assert NoServer.opens == 1  # no second try within CHANNEL_REOPEN_AFTER_SECONDS
        strict = Toolbox(make_settings(tmp_path, agent={"transport": "resident"}),
                         NoServer(settings, tmp_path / "data"), store)
        result = await strict.call("r", "shell", {"command": "true"})
        assert result.is_error and "no serve here" in result.text


async def test_a_toolbox_dropped_without_close_ends_its_server(tmp_path):
    import gc

    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        settings = make_settings(tmp_path, agent={"transport": "resident"})
        toolbox = Toolbox(settings, LocalSandbox(settings, tmp_path / "data"), store)
        await toolbox.call("r", "shell", {"command": "true"})
        pid = toolbox.transport.channel.pid
        del toolbox
        gc.collect()
        deadline = time.monotonic() + 10
        while not gone(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert gone(pid)


async def test_a_hung_server_is_given_up_and_the_next_call_gets_a_new_one(tmp_path):
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        await tb.call("r", "shell", {"command": "true"})
        channel = tb.transport.channel
        helper = signal_helper(channel.pid, signal.SIGSTOP)
        try:
            with pytest.raises(Exception, match="no answer within 1 s"):
                await channel.call({"op": "shell_status", "args": {}, "run_id": "r", "agent_id": tb.settings.id,
                                    "call_id": "c9", "home": tb.sandbox.home}, 1)
            assert channel.dead and "did not answer within 1 s, nor a cancel" in channel.dead
        finally:
            signal_helper(channel.pid, signal.SIGCONT, helper)  # those the close has not ended
        assert body((await tb.call("r", "shell", {"command": "echo fresh"})).text) == "fresh"
        assert tb.transport.channel is not channel


async def test_a_helper_without_the_resident_mode_is_refused_clearly(tmp_path):
    settings = make_settings(tmp_path)
    box = LocalSandbox(settings, tmp_path / "data")
    await box.start()
    one_shot = [box.python, "-I", "-S", box.helper_path("guilds-code"), "servex"]  # as an older helper reads "serve"
    with pytest.raises(ChannelDied, match=r"the helper in the sandbox has no resident mode \(it answered as a "
                                          r"one-shot helper: request: not valid base64\)"):
        await ResidentChannel.open(box, one_shot)


async def test_many_large_answers_and_frames_at_once_all_arrive(tmp_path):
    channel, shell_request = await _open_channel(tmp_path, 64)
    try:
        def request(i):  # a 15 KiB frame asking for a 64 KiB answer
            command = f"yes {i % 10}23456789 | head -c 60000 #" + "x" * 15_000
            return {**shell_request, "call_id": f"c{i}", "max_bytes": 65536, "args": {"command": command}}

        answers = await asyncio.wait_for(asyncio.gather(*(channel.call(request(i), 60) for i in range(40))), 120)
        for i, answer in enumerate(answers):
            assert answer["ok"] and len(answer["text"]) > 55_000 and answer["text"][0] == str(i % 10)
    finally:
        await channel.close()


def _reader_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "guilds-resident"}


async def test_a_local_channel_is_read_by_the_event_loop_that_opened_it(tmp_path):
    before = _reader_threads()
    async with local_toolbox(tmp_path, agent={"transport": "resident"}) as tb:
        assert body((await tb.call("r", "shell", {"command": "echo one"})).text) == "one"
        assert tb.transport.channel is not None and not _reader_threads() - before  # none started


def test_a_call_from_another_event_loop_is_answered_once_the_opening_one_is_gone(tmp_path):
    settings = make_settings(tmp_path)
    box = LocalSandbox(settings, tmp_path / "data")
    transport = Transport(box, "resident")

    async def shell(command: str, call_id: str) -> str:
        await box.start()
        request = {"op": "shell", "run_id": "r", "agent_id": settings.id, "call_id": call_id,
                   "home": box.home, "args": {"command": command}}
        return (await transport.call(request, wait=30))["text"]

    try:
        assert asyncio.run(shell("echo one", "c1")) == "one"  # opens the channel; its loop then closes
        before = _reader_threads()
        assert asyncio.run(asyncio.wait_for(shell("echo two", "c2"), 30)) == "two"
        assert len(_reader_threads() - before) == 1  # a reader thread took over
    finally:
        asyncio.run(transport.close())


async def test_a_call_past_its_wait_on_a_live_server_stops_its_command_and_keeps_the_channel(tmp_path):
    channel, request = await _open_channel(tmp_path)
    try:
        began = time.monotonic()
        with pytest.raises(Exception, match="no answer within 1 s"):
            await channel.call({**request, "call_id": "c1", "args": {"command": "sleep 30"}}, 1)
        assert time.monotonic() - began < 4  # the cancel's answer came: not the cancel's whole wait
        assert not channel.dead
        answer = await channel.call({**request, "call_id": "c2", "args": {"command": "echo after"}}, 30)
        assert answer["text"] == "after"
    finally:
        await channel.close()

