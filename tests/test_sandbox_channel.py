"""The sandbox seam's long-lived process (``open_process``) on every backend this
machine has, and the resident helper through it: real processes, real engines."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from pathlib import Path

import pytest

import backend_kit
from guilds.errors import HelperFailed
from guilds.sandbox import get_sandbox
from guilds.toolbox.resident_channel import ChannelDied, ResidentChannel
from guilds.toolbox.transport import serve_argv
from test_sandbox import SECRET, box, settings_for  # noqa: F401 - fixtures


@pytest.fixture
async def make(tmp_path):
    """As test_sandbox's, but each agent id its own: a shared engine runs other tests' agent1."""
    made = []

    async def _make(backend: str, data: Path = tmp_path / "data", **kw):
        settings = replace(settings_for(tmp_path, backend, **kw), id=f"ch{secrets.token_hex(4)}")
        made.append(sandbox := get_sandbox(settings, data))
        await sandbox.start()
        return sandbox

    yield _make
    for sandbox in made:
        await sandbox.stop()

ECHO = 'echo "$PWD|$MY_SECRET|$GUILDS_STATE_DIR"; while IFS= read -r line; do echo "got $line"; done; echo bye'


async def receive_until(process, needle: bytes, timeout: float = 20) -> bytes:
    """What the process printed until needle, or its end."""
    data = b""
    deadline = time.monotonic() + timeout
    while needle not in data and time.monotonic() < deadline:
        chunk = await asyncio.wait_for(asyncio.to_thread(process.receive), deadline - time.monotonic())
        if not chunk:
            break
        data += chunk
    return data


def request(box, frame: str, op: str = "shell", **args) -> dict:
    return {"op": op, "args": args, "run_id": "r1", "agent_id": box.settings.id, "call_id": frame,
            "home": box.home, "cwd": box.home}


async def test_a_process_with_stdin_and_stdout_in_the_home_with_the_agent_env(box):
    process = await box.open_process(["bash", "-c", ECHO])
    try:
        first = await receive_until(process, b"\n")
        assert first == f"{box.home}|{SECRET}|{box.state_dir}\n".encode()
        process.send(b"one\n")
        assert await receive_until(process, b"got one\n") == b"got one\n"
        process.send(b"two\nthree\n")
        assert await receive_until(process, b"got three\n") == b"got two\ngot three\n"
    finally:
        await asyncio.to_thread(process.close)
    assert await asyncio.to_thread(process.receive) == b""


async def test_closing_stdin_ends_it(box):
    process = await box.open_process(["bash", "-c", ECHO])
    try:
        await receive_until(process, b"\n")
        process.send(b"last\n")
        assert await receive_until(process, b"got last\n") == b"got last\n"
    finally:
        await asyncio.to_thread(process.close)


async def test_the_resident_helper_through_the_channel(box):
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    try:
        assert channel.max_in_flight == 8
        slow = asyncio.ensure_future(channel.call(request(box, "c1", command="sleep 2; echo slow"), 30))
        began = time.monotonic()
        fast = await channel.call(request(box, "c2", command="echo fast; echo $MY_SECRET"), 30)
        assert fast["text"] == f"fast\n{SECRET}" and time.monotonic() - began < 1.8
        assert (await slow)["text"] == "slow"
        with pytest.raises(HelperFailed, match="no answer within 1 s"):
            await channel.call(request(box, "c3", command="sleep 20"), 1)
        assert (await channel.call(request(box, "c4", op="shell_status"), 30))["ok"] is True
    finally:
        await channel.close()
    with pytest.raises(ChannelDied, match="closed"):
        await channel.call(request(box, "c5", command="true"), 30)


@pytest.mark.backends(*[name for name in backend_kit.NAMES if name != "local"])
async def test_the_channel_ends_with_the_sandbox(make, backend):
    box = await make(backend)
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    try:
        running = asyncio.ensure_future(channel.call(request(box, "c1", command="sleep 30"), 60))
        await asyncio.sleep(0.5)
        await box.stop()
        with pytest.raises(ChannelDied, match="ended"):
            await asyncio.wait_for(running, 20)
        assert channel.dead
    finally:
        await channel.close()


async def helper_seen_inside(box, pid: int) -> tuple[bool, int]:
    """(asleep: its process runs the bash waiter, its anonymous memory in KiB), read inside the
    sandbox. Anonymous: a container's own bash and libraries are mapped by it alone, so their
    file pages count whole in its PSS and USS, which a host's bash shares with every other."""
    script = f"tr '\\0\\n' '  ' < /proc/{pid}/cmdline; echo; grep '^Anonymous:' /proc/{pid}/smaps_rollup"
    result = await box.exec(["bash", "-c", script], timeout=20)
    argv, anonymous = result.stdout.decode().splitlines()[:2]
    return "guilds-code-asleep" in argv, int(anonymous.split()[1])


async def until_asleep(box, pid: int, seconds: float = 30) -> int:
    """Its anonymous memory (KiB) once it sleeps."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sleeping, anonymous = await helper_seen_inside(box, pid)
        if sleeping:
            return anonymous
        await asyncio.sleep(0.3)
    raise AssertionError(f"the resident helper did not sleep within {seconds} s")


@pytest.mark.backends("bwrap", "docker")
async def test_an_idle_resident_helper_sleeps_small_and_the_next_call_wakes_it(make, backend):
    box = await make(backend)
    channel = await ResidentChannel.open(box, [*serve_argv(box, 8), "--sleep-idle", "1"])
    try:
        assert (await channel.call(request(box, "c1", command="echo one"), 30))["text"] == "one"
        awake = (await helper_seen_inside(box, channel.pid))[1]
        asleep = await until_asleep(box, channel.pid)
        assert asleep < 1024 and asleep * 4 < awake, (asleep, awake)
        assert (await channel.call(request(box, "c2", command="echo two; echo $MY_SECRET"), 30))["text"] == \
            f"two\n{SECRET}"
        assert not (await helper_seen_inside(box, channel.pid))[0]
        await until_asleep(box, channel.pid)
        long = asyncio.ensure_future(channel.call(request(box, "c3", command="sleep 3; echo long"), 30))
        await asyncio.sleep(2.5)
        assert not (await helper_seen_inside(box, channel.pid))[0]  # a long call keeps it awake
        assert (await long)["text"] == "long"
        started = await channel.call(request(box, "c4", command="sleep 4", background=True), 30)
        assert started["ok"] is True, started
        await asyncio.sleep(3)
        assert not (await helper_seen_inside(box, channel.pid))[0]  # so does a background command
        await until_asleep(box, channel.pid)
        status = await channel.call(request(box, "c5", op="shell_status", id="b1"), 30)
        assert status["text"].startswith("b1 exited 0"), status
    finally:
        await channel.close()
