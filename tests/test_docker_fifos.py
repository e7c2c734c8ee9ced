"""The docker sandbox's direct channel (``guilds.sandbox.docker.docker_fifos``): the resident
helper's stdin and stdout as FIFOs, a call with no engine in its path, and what the agent
can and cannot do with the channel's folder. A real engine (DOCKER_HOST, as in
tests/test_docker_backend.py); skipped without one, saying why."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from guilds.config.settings import parse_settings
from guilds.sandbox import get_sandbox
from guilds.sandbox.docker import docker_fifos
from guilds.sandbox.docker.docker_engine import unavailable
from guilds.sandbox.process_channel import DockerProcess
from guilds.toolbox.resident_channel import ChannelDied, ResidentChannel
from guilds.toolbox.transport import serve_argv

IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
WHY = unavailable(IMAGE)
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"docker: {WHY}")


@pytest.fixture
async def box(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    settings = parse_settings({"agent": {"id": f"df{secrets.token_hex(4)}", "home": str(home),
                                         "sandbox": "docker"}}, tmp_path, env={})
    sandbox = get_sandbox(settings, tmp_path / "data")
    await sandbox.start()
    yield sandbox
    await sandbox.stop()


def request(box, frame: str, command: str) -> dict:
    return {"op": "shell", "args": {"command": command}, "run_id": "r1", "agent_id": box.settings.id,
            "call_id": frame, "home": box.home, "cwd": box.home}


async def inside(box, script: str) -> str:
    result = await box.exec(["bash", "-c", script], timeout=20)
    return (result.stdout + result.stderr).decode()


def engine_pid() -> int | None:
    """The engine's pid, from the pid file beside its socket (scripts/docker-test-env.sh's)."""
    url = urlparse(os.environ.get("DOCKER_HOST", ""))
    pid_file = Path(url.path).parent / "dockerd.pid" if url.scheme == "unix" else None
    if pid_file is None or not pid_file.is_file():
        return None
    return int(pid_file.read_text().split()[0])


async def test_the_resident_helpers_stdin_and_stdout_are_the_channels_fifos(box):
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    try:
        links = await inside(box, f"readlink /proc/{channel.pid}/fd/0 /proc/{channel.pid}/fd/1")
        stdin, stdout = links.splitlines()[:2]
        # unlinked once the helper had opened both
        assert stdin.startswith(f"{docker_fifos.CHANNEL_INSIDE}/") and stdin.endswith(".in (deleted)")
        assert stdout.startswith(f"{docker_fifos.CHANNEL_INSIDE}/") and stdout.endswith(".out (deleted)")
        assert os.listdir(box._channels.path) == []
        answer = await channel.call(request(box, "c1", "echo through the fifo"), 30)
        assert answer["text"] == "through the fifo"
    finally:
        await channel.close()


async def test_a_call_is_answered_with_the_engine_stopped(box):
    pid = engine_pid()
    if pid is None:
        pytest.skip("the engine's pid file is not beside its socket (scripts/docker-test-env.sh's engine)")
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    try:
        os.kill(pid, signal.SIGSTOP)
        try:  # the attached stream would wait for the engine: the call would not be answered
            answer = await asyncio.wait_for(channel.call(request(box, "c1", "echo engine asleep"), 5), 10)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert answer["text"] == "engine asleep"
    finally:
        await channel.close()


async def test_the_agent_cannot_list_make_or_replace_in_the_channels_folder(box):
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    try:
        folder = docker_fifos.CHANNEL_INSIDE
        said = await inside(box, f"ls {folder} 2>&1; touch {folder}/x 2>&1; mkfifo {folder}/y 2>&1; "
                                 f"rm -f {folder}/* 2>&1; echo done")
        assert "Permission denied" in said and said.rstrip().endswith("done")
        assert os.listdir(box._channels.path) == []
        assert (await channel.call(request(box, "c1", "echo still"), 30))["text"] == "still"
    finally:
        await channel.close()


async def test_closing_the_channel_ends_the_helper(box):
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    pid = channel.pid
    await channel.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and f"/{pid}\n" in await inside(box, f"ls -d /proc/{pid} 2>/dev/null; true"):
        await asyncio.sleep(0.2)
    assert f"/{pid}\n" not in await inside(box, f"ls -d /proc/{pid} 2>/dev/null; true")


async def test_a_helper_that_never_opens_its_stdout_ends_the_channel_with_its_stderr(box, monkeypatch):
    wrong = 'exec <"$1" >/nonexistent/out; shift 2; exec "$@"'  # stdout's FIFO never opened
    monkeypatch.setattr(docker_fifos, "_WRAPPER", wrong)
    began = time.monotonic()
    with pytest.raises(ChannelDied, match="nonexistent"):
        await ResidentChannel.open(box, serve_argv(box, 8))
    assert time.monotonic() - began < 15  # the exec's end, not the hello's wait (30 s)
    assert os.listdir(box._channels.path) == []


async def test_an_engine_elsewhere_gets_the_attached_stream(box, monkeypatch):
    monkeypatch.setattr(type(box), "cgroup_pid", lambda self: None)
    process = await box.open_process(["cat"])
    try:
        assert isinstance(process, DockerProcess)
        process.send(b"echoed\n")
        got = b""
        deadline = time.monotonic() + 20
        while b"echoed\n" not in got and time.monotonic() < deadline:
            got += await asyncio.to_thread(process.receive)
        assert got == b"echoed\n"
    finally:
        await asyncio.to_thread(process.close)
    assert os.listdir(box._channels.path) == []


def test_a_fifo_swapped_for_a_link_is_refused(tmp_path):
    folder = docker_fifos.ChannelFolder(tmp_path, "a1", (os.getuid(), os.getgid()))
    folder.ensure()
    target = tmp_path / "target"
    target.write_text("kept")
    link = folder.path / "swapped.out"
    os.symlink(target, link)
    with pytest.raises(OSError):
        docker_fifos._open_fifo(str(link), os.O_RDONLY)
    plain = folder.path / "plain.out"
    plain.write_text("")
    with pytest.raises(docker_fifos.ChannelClosed, match="not the FIFO"):
        docker_fifos._open_fifo(str(plain), os.O_RDONLY)
    with contextlib.suppress(OSError):
        folder.clear()
    assert target.read_text() == "kept" and os.listdir(folder.path) == []


def test_the_container_binds_the_channels_folder_read_only():
    from guilds.config.settings import DockerSettings
    from guilds.sandbox.docker import docker_spec as spec

    got = spec.container_spec(DockerSettings(image="img:1"), agent_id="a1", home="/h/a1", network=False,
                              idle_seconds=90, base_env={}, user=(65532, 65532), channel_dir="/d/c/a1")
    assert got["volumes"]["/d/c/a1"] == {"bind": docker_fifos.CHANNEL_INSIDE, "mode": "ro"}
    without = spec.container_spec(DockerSettings(image="img:1"), agent_id="a1", home="/h/a1", network=False,
                                  idle_seconds=90, base_env={}, user=(65532, 65532))
    assert "/d/c/a1" not in without["volumes"]


async def test_removing_the_agent_removes_its_channels_folder(box):
    channel = await ResidentChannel.open(box, serve_argv(box, 8))
    await channel.close()
    assert box._channels.path.is_dir()
    await box.remove()
    assert not box._channels.path.exists()
