"""The sandbox seam's long-lived process (``open_process``) on every backend this
machine has, and the resident helper through it: real processes, real engines."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from pathlib import Path

import pytest

from guilds.errors import HelperFailed
from guilds.sandbox import get_sandbox
from guilds.toolbox.resident_channel import ChannelDied, ResidentChannel
from guilds.toolbox.transport import serve_argv
from test_sandbox import BACKENDS, SECRET, box, settings_for  # noqa: F401 - fixtures


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


async def test_the_channel_ends_with_the_sandbox(make, request_backend):
    box = await make(request_backend)
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


@pytest.fixture(params=[p for p in BACKENDS if p.values[0] != "local"])
def request_backend(request):
    return request.param
