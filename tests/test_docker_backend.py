"""The docker backend: its pure builders by equality, and its failure modes against a real engine.

The engine is the one DOCKER_HOST names (scripts/docker-test-env.sh starts one
and builds the image); without one answering, the engine tests are skipped and
say why. The tools themselves run against docker in the conformance suite
(tests/test_sandbox.py).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import resource
import secrets
import signal
import tarfile
import time
from dataclasses import replace

import docker
import pytest

from conftest import sized_tmpfs
from guilds.config.settings import AgentSettings, DockerSettings, Repo, parse_settings
from guilds.errors import ConfigError, SandboxError
from guilds.sandbox import _container as box_lib
from guilds.sandbox import image
from guilds.sandbox.docker import docker_spec as spec
from guilds.sandbox.docker.docker_engine import unavailable
from guilds.sandbox.docker.docker_sandbox import DockerSandbox
from guilds.sandbox.egress_side.relay import RELAY
from guilds.toolbox.transport import call_helper

IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
TOKEN = "ghp_token-4c8a9b0e"


WHY = unavailable(IMAGE)
CLIENT = docker.from_env(timeout=30) if WHY is None else None
needs_engine = pytest.mark.skipif(WHY is not None, reason=f"docker: {WHY}")


# --- pure builders ----------------------------------------------------------
def test_container_spec():
    cfg = DockerSettings(image="img:1", memory="1g", pids_limit=64, network="host")
    kwargs = {"agent_id": "a1", "home": "/h/a1", "idle_seconds": 90, "base_env": {"HOME": "/h/a1"},
                  "user": (65532, 65532)}
    got = spec.container_spec(cfg, network=False, **kwargs)
    assert got == {
        "image": "img:1",
        "command": ["python3", "-I", "-S", "-c", box_lib.INIT, "/run/guilds-clock/active", "90", "30"],
        "name": "guilds-a1",
        "labels": {"guilds.agent": "a1"},
        "environment": {"HOME": "/h/a1"},
        "working_dir": "/h/a1",
        "volumes": {"/h/a1": {"bind": "/h/a1", "mode": "rw"},
                    "guilds-a1-state": {"bind": "/run/guilds", "mode": "rw"}},
        "init": True,
        "mem_limit": "1g",
        "memswap_limit": "1g",
        "pids_limit": 64,
        "network_mode": "none",
        "user": "65532:65532",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
    }
    assert spec.container_spec(cfg, network=True, **kwargs)["network_mode"] == "host"
    listed = spec.container_spec(cfg, network=False, egress_dir="/data/egress/a1/run", **kwargs)
    assert listed == {**got, "volumes": {**got["volumes"], "/data/egress/a1/run": {
        "bind": "/run/guilds-egress", "mode": "ro"}}, "command": [
        "python3", "-I", "-S", "-c", RELAY + box_lib.INIT, "/run/guilds-clock/active", "90", "30",
        "/run/guilds-egress/proxy.sock", "3128"]}


def test_exec_spec_wraps_the_call():
    got = spec.exec_spec("cid", ["python3", "-c", "x"], env={"A": "1"}, home="/h", timeout=150)
    assert got == {
        "container": "cid",
        "cmd": ["/bin/sh", "-c", 'exec timeout -k 2 150 "$@"',
                "sh", "python3", "-c", "x"],
        "environment": {"A": "1"}, "workdir": "/h", "stdin": False, "stdout": True,
        "stderr": True, "tty": False,
    }


def test_split_frames():
    frame = lambda stream, data: bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data  # noqa: E731
    buf = frame(1, b"out") + frame(2, b"err") + frame(1, b"") + frame(1, b"partial")[:10]
    assert spec.split_frames(buf) == ([(1, b"out"), (2, b"err"), (1, b"")], frame(1, b"partial")[:10])
    assert spec.split_frames(b"\x01\x00") == ([], b"\x01\x00")


@pytest.mark.parametrize("raw, elapsed, expected", [
    (0, 0.1, (0, False)),
    (3, 0.1, (3, False)),
    (124, 0.5, (124, False)),            # the command's own 124, before its timeout
    (124, 1.2, (-signal.SIGTERM, True)),  # timeout stopped it with SIGTERM
    (137, 3.1, (-signal.SIGKILL, True)),  # ... and had to SIGKILL it
    (137, 0.1, (-signal.SIGKILL, False)),
    (255, 0.1, (255, False)),
    (None, 0.1, (None, False)),
])
def test_exec_status(raw, elapsed, expected):
    assert box_lib.exec_status(raw, elapsed=elapsed, timeout=1) == expected


def test_tar_bytes_and_seconds():
    data = box_lib.tar_bytes([("/run/guilds/a/x.json", b"{}", 0o600)], mtime=7)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        [info] = tar.getmembers()
        assert (info.name, info.mode, info.mtime, info.uid, tar.extractfile(info).read()) == \
            ("run/guilds/a/x.json", 0o600, 7, 0, b"{}")
    assert [box_lib.seconds(x) for x in (1, 2.5, 1e6, 0.0004)] == ["1", "2.5", "1000000", "0"]


def test_kill_argv_finds_the_call_by_its_token():
    argv = box_lib.kill_argv("abc")
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["GUILDS_EXEC_ID=abc", "20"]


def test_ended_and_error_texts():
    cfg = DockerSettings(memory="1g")
    assert spec.idle_stopped({"ExitCode": 0, "OOMKilled": False})
    assert not spec.idle_stopped({"ExitCode": 137, "OOMKilled": False})
    assert not spec.idle_stopped({"ExitCode": 0, "OOMKilled": True})
    assert spec.ended_text("guilds-a", {"ExitCode": 137}, cfg).startswith(
        "the sandbox container guilds-a was killed (SIGKILL); its running commands ended.")
    assert "out of memory (docker.memory = '1g')" in spec.ended_text("c", {"OOMKilled": True}, cfg)
    assert "stopped with status 143" in spec.ended_text("c", {"ExitCode": 143}, cfg)
    assert spec.api_error_text("write_file /x", 500, "write /x: no space left on device") == \
        "docker: write_file /x: the sandbox's disk is full (write /x: no space left on device)"
    assert spec.api_error_text("exec", 409, "is paused") == "docker: exec: is paused (HTTP 409)"


def test_docker_and_kubernetes_settings(tmp_path):
    got = parse_settings({"agent": {"sandbox": "docker"},
                          "docker": {"image": "x:1", "pids_limit": 100, "idle_minutes": 5},
                          "kubernetes": {"runtime_class": "gvisor"}}, tmp_path, env={})
    assert got.docker == DockerSettings(image="x:1", pids_limit=100, idle_minutes=5)
    assert got.kubernetes.runtime_class == "gvisor" and got.kubernetes.namespace == "guilds"
    for doc, error in [({"docker": {"imag": "x"}}, "docker.imag: unknown key"),
                       ({"docker": {"pids_limit": 3}}, "docker.pids_limit"),
                       ({"kubernetes": {"idle_minutes": 0}}, "kubernetes.idle_minutes"),
                       ({"kubernetes": {"cpu": 1}}, "kubernetes.cpu")]:
        with pytest.raises(ConfigError, match=error):
            parse_settings(doc, tmp_path, env={})


# --- the engine's failure modes ----------------------------------------------
async def test_engine_not_reachable(tmp_path):
    box = DockerSandbox(AgentSettings(id="a1", home=tmp_path / "home", sandbox="docker"),
                        base_url=f"unix://{tmp_path}/no.sock")
    with pytest.raises(SandboxError, match=r"the engine is not reachable at unix://.*no\.sock"):
        await box.start()


@pytest.fixture
async def make(tmp_path):
    """make(**docker settings) -> a started docker sandbox of a fresh agent; removed at the end."""
    made = []

    async def _make(idle_seconds=None, agent=None, secret_env=None, **docker):
        agent = agent or f"t{secrets.token_hex(4)}"
        settings = AgentSettings(id=agent, home=tmp_path / agent, sandbox="docker",
                                 repos=(Repo("web", "repos/web", TOKEN),), secrets=secret_env or {},
                                 docker=replace(DockerSettings(image=IMAGE), **docker))
        box = DockerSandbox(settings, idle_seconds=idle_seconds)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()


async def sh(box, script: str, timeout: float = 20):
    return await box.exec(["bash", "-c", script], timeout=timeout)


def shell(box, command: str, call: str, **args) -> dict:
    return {"op": "shell", "args": {"command": command, **args}, "run_id": "r1",
            "agent_id": box.agent_id, "call_id": call, "home": box.home, "cwd": box.home}


@needs_engine
async def test_image_missing(tmp_path, make):
    with pytest.raises(SandboxError,
                       match="image 'guilds-none:0' not found: build it with `guilds sandbox image`"):
        await make(image="guilds-none:0")


@needs_engine
async def test_container_killed_between_calls(make):
    box = await make()
    started = await call_helper(box, shell(box, "sleep 300", "c1", background=True), wait=30)
    assert started["ok"], started
    CLIENT.containers.get(box.container).kill()
    with pytest.raises(SandboxError,
                       match=f"{box.container} was killed .SIGKILL.; its running commands ended"):
        await sh(box, "true")
    status = await call_helper(box, {**shell(box, "", "c2"), "op": "shell_status", "args": {}}, wait=30)
    assert status["ok"] and " ended " in status["text"] + " ", status
    assert (await sh(box, "cat $GUILDS_STATE_DIR/*/repos.json")).stdout.strip().startswith(b"{")


@needs_engine
async def test_found_again_by_a_second_orchestrator_and_stop(make, tmp_path):
    first = await make()
    await sh(first, "setsid sleep 95.5 >/dev/null 2>&1 < /dev/null &")
    second = DockerSandbox(first.settings)
    await second.start()
    assert b"sleep 95.5" in (await sh(second, "ps -eo args")).stdout
    await second.stop()
    assert b"sleep 95.5" not in (await sh(first, "ps -eo args")).stdout  # a new container


@needs_engine
async def test_isolation_pid_namespace_no_network_limits(make):
    box = await make(pids_limit=64)
    out = (await sh(box, "tr '\\0\\n' '  ' </proc/1/cmdline; echo; "
                         "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
                         "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || "
                         "cat /sys/fs/cgroup/pids.max")).stdout
    init, network, pids = out.decode().splitlines()
    assert init.startswith("/sbin/docker-init -- python3 -I -S -c")
    assert (network, pids) == ("lo", "64")


@needs_engine
async def test_a_changed_spec_replaces_the_container(make):
    box = await make()
    before = CLIENT.containers.get(box.container).id
    changed = DockerSandbox(replace(box.settings, docker=replace(box.config, pids_limit=99)))
    await changed.start()
    assert CLIENT.containers.get(box.container).id != before


@needs_engine
async def test_timeout_reaches_what_escaped_the_group(make):
    box = await make()
    began = time.monotonic()
    result = await box.exec(["bash", "-c", "setsid sleep 99.5 & sleep 100"], timeout=1)
    assert result.timed_out and result.exit_code == -signal.SIGTERM
    assert time.monotonic() - began < 5
    assert b"sleep 99.5" not in (await sh(box, "ps -eo args")).stdout


@needs_engine
async def test_idle_stop_and_silent_restart(make):
    box = await make(idle_seconds=1)
    first = CLIENT.containers.get(box.container).id
    for _ in range(60):
        await asyncio.sleep(0.2)
        if CLIENT.containers.get(first).status == "exited":
            break
    assert CLIENT.containers.get(first).attrs["State"]["ExitCode"] == 0
    assert (await sh(box, "echo back")).stdout == b"back\n"
    assert CLIENT.containers.get(box.container).id != first


@needs_engine
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs as the home needs root")
async def test_a_full_disk_is_said_and_loses_nothing(make, tmp_path):
    agent = f"t{secrets.token_hex(4)}"
    home = tmp_path / agent
    home.mkdir()
    with sized_tmpfs(home, "1m", mode=None):
        box = await make(agent=agent)
        (home / "kept.txt").write_text("kept")
        result = await sh(box, "head -c 2M /dev/zero > fill")
        assert result.exit_code == 1 and b"No space left on device" in result.stderr
        with pytest.raises(SandboxError, match=r"disk is full|no space left"):
            await box.write_file(f"{box.home}/more.json", b"x" * 300_000)
        envelope = await call_helper(box, shell(box, "echo hi", "c1"), wait=30)
        assert envelope["ok"] or "space" in envelope["error"].lower(), envelope
        assert (home / "kept.txt").read_text() == "kept"
        await sh(box, "rm fill")
        assert (await call_helper(box, shell(box, "echo hi", "c2"), wait=30))["text"] == "hi"


@needs_engine
async def test_many_calls_at_once_in_one_container(make):
    box = await make()
    results = await asyncio.gather(*(sh(box, f"echo {i}") for i in range(12)))
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(12)]
    assert json.loads((await sh(box, f"cat {box_lib.repos_file(box.agent_id)}")).stdout) == {
        f"{box.home}/repos/web": TOKEN}


# --- the image ----------------------------------------------------------------
def test_dockerfile():
    assert image.dockerfile("debian:bookworm-slim", ["guilds-code", "guilds-harness"]) == (
        "FROM debian:bookworm-slim\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends python3 bash git ripgrep "
        "procps ca-certificates && rm -rf /var/lib/apt/lists/*\n"
        "COPY guilds-code guilds-harness /usr/local/bin/\n"
        "RUN grep -q '^guilds:' /etc/passwd || (echo 'guilds:x:65532:65532:guilds agent:/nonexistent:"
        "/bin/sh' >> /etc/passwd && echo 'guilds:x:65532:' >> /etc/group)\n"
        "USER 65532:65532\n"
        'CMD ["sleep", "infinity"]\n')
    assert "apt-get" not in image.dockerfile("base:1", ["guilds-code"], install=False)


@needs_engine
def test_build_sandbox_image_on_a_local_base():
    base = os.environ.get("GUILDS_BASE_IMAGE", "guilds-base:local")
    if not CLIENT.images.list(name=base):
        pytest.skip(f"no base image {base} (scripts/docker-test-env.sh makes it)")
    tag = f"guilds-sandbox:test-{secrets.token_hex(3)}"
    try:
        image_id = image.build_sandbox_image(tag=tag, base=base, install=False)
        helpers = CLIENT.containers.run(image_id, ["ls", "-l", "/usr/local/bin"], network_mode="none",
                                        remove=True).decode()
        assert "-rwxr-xr-x" in helpers and "guilds-code" in helpers
        who = CLIENT.containers.run(image_id, ["sh", "-c", "id -un; id -u"], network_mode="none",
                                    remove=True).decode()
        assert who.split() == ["guilds", "65532"]
        with pytest.raises(SandboxError, match=r"building guilds-sandbox:none failed|no such image"):
            image.build_sandbox_image(tag="guilds-sandbox:none", base="guilds-none:0", install=False)
    finally:
        CLIENT.images.remove(tag, force=True)


@needs_engine
async def test_a_container_removed_behind_our_back_is_made_again(make):
    box = await make()
    CLIENT.containers.get(box.container).remove(force=True)
    await box.write_file(f"{box.state_dir}/requests/r1-c1.json", b"{}")
    assert (await sh(box, "ls $GUILDS_STATE_DIR/requests")).stdout == b"r1-c1.json\n"


def test_a_call_the_runtime_refused_to_start_is_known_as_such():
    assert spec.not_started(126, b"OCI runtime exec failed: exec failed: cannot exec in a stopped container")
    assert not spec.not_started(126, b"bash: ./x: Permission denied\n")  # the command's own 126
    assert not spec.not_started(0, b"OCI runtime exec failed")
@needs_engine
async def test_the_full_output_log_is_read_inside_the_container(make, tmp_path):
    """The app's reader (as serve hands it) opens a shell call's log where it lives: in the
    container, through guilds-code's log_read, shaped and redacted there."""
    from guilds.record.store import Store
    from guilds.toolbox import Toolbox
    from guilds.toolbox.log_reading import log_reading
    from guilds.web.logs import HelperLogReader, LogUnavailable

    secret = "sk-live-docker-5e1f0a"
    box = await make(secret_env={"API_KEY": secret})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        toolbox = Toolbox(box.settings, box, store)
        result = await toolbox.call(
            "r1", "shell", {"command": "seq 1 30000; echo \"$API_KEY\"; printf '\\e[31mred\\e[0m\\n'"}
        )
        path = result.meta["log_path"]
        logs = HelperLogReader(log_reading(toolbox))
        log = await logs.read(box.agent_id, path)
        assert log.head.startswith("1\n2\n3\n") and log.tail.endswith("30000\n[REDACTED]\nred\n")
        assert secret not in log.head + log.tail and log.size > 0
        gone = path.replace(".log", "x.log")
        with pytest.raises(LogUnavailable, match="no longer kept"):
            await logs.read(box.agent_id, gone)
        await toolbox.close()


@needs_engine
async def test_two_orchestrators_stopping_one_container_at_once_both_stop(make):
    """A removal already in progress (409) is the other stop's: waited for, not an error. The
    engine may answer more than one of the racing forced removals as done, so at least one stop
    (not exactly one) says it removed the container."""
    for _ in range(3):
        first = await make()
        others = [DockerSandbox(first.settings) for _ in range(3)]
        await others[0].start()
        said = await asyncio.gather(first.stop(), *(box.stop() for box in others))
        assert sum(f"container {first.container}" in removed for removed in said) >= 1, said
        with pytest.raises(docker.errors.NotFound):
            CLIENT.api.inspect_container(first.container)
        with pytest.raises(docker.errors.NotFound):
            CLIENT.api.inspect_volume(spec.state_volume(first.agent_id))


FD_SETSIZE = 1024
"""The most descriptors select() takes: one numbered past it is refused (poll takes any)."""


@pytest.fixture
def fds_past_fd_setsize():
    """Descriptors 0..FD_SETSIZE+ taken (on /dev/null), so every socket opened meanwhile is numbered
    past FD_SETSIZE, as in a server holding hundreds of agents."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FD_SETSIZE + 256
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the descriptor limit ({hard}) is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = []
    try:
        while not held or held[-1] <= FD_SETSIZE:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield held[-1]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _sockets_past(fd: int) -> list[int]:
    """This process's sockets numbered past fd."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if int(name) > fd and os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.append(int(name))
        except OSError:  # the listing's own descriptor, closed since
            continue
    return found


@needs_engine
async def test_a_call_is_read_on_a_socket_numbered_past_fd_setsize(fds_past_fd_setsize, make):
    """The exec's stream is waited on with poll: select() refused a socket past FD_SETSIZE."""
    box = await make()  # its client made now: its sockets are numbered past the descriptors held
    assert _sockets_past(fds_past_fd_setsize), "no socket of the engine's client past FD_SETSIZE"
    done = await sh(box, "echo out; echo err >&2; sleep 0.3; echo late")
    assert (done.exit_code, done.stdout, done.stderr) == (0, b"out\nlate\n", b"err\n")


# --- the resident channel, read by the event loop that opened it --------------
def _reader_threads() -> set:
    import threading
    return {thread for thread in threading.enumerate() if thread.name == "guilds-resident"}


async def _channel(box):
    from guilds.toolbox.resident_channel import ResidentChannel
    from guilds.toolbox.transport import serve_argv
    return await ResidentChannel.open(box, serve_argv(box, 8))


def _text(answer: dict) -> str:
    assert answer["ok"], answer
    return answer["text"].strip()


@needs_engine
async def test_the_channel_is_read_by_the_opening_loop_with_no_reader_thread(make):
    box = await make()
    before = _reader_threads()
    channel = await _channel(box)
    try:
        assert _text(await channel.call(shell(box, "echo one", "c1"), 30)) == "one"
        assert not _reader_threads() - before  # none started
        # a call from another loop while the opening one runs: read here, handed over
        other = await asyncio.to_thread(asyncio.run, channel.call(shell(box, "echo two", "c2"), 30))
        assert _text(other) == "two" and not _reader_threads() - before
        # a frame larger than the socket takes at once is finished from a thread
        big = await channel.call(shell(box, "echo big #" + "x" * 200_000, "c3"), 30)
        assert _text(big) == "big"
    finally:
        await channel.close()


@needs_engine
def test_a_call_from_another_loop_once_the_opening_one_is_gone(tmp_path):
    settings = AgentSettings(id=f"t{secrets.token_hex(4)}", home=tmp_path / "home", sandbox="docker",
                             repos=(), docker=DockerSettings(image=IMAGE))
    box = DockerSandbox(settings)

    async def opened():
        await box.start()
        channel = await _channel(box)
        assert _text(await channel.call(shell(box, "echo one", "c1"), 30)) == "one"
        return channel

    try:
        channel = asyncio.run(opened())  # its loop then closes
        before = _reader_threads()
        assert _text(asyncio.run(asyncio.wait_for(channel.call(shell(box, "echo two", "c2"), 30), 30))) == "two"
        assert len(_reader_threads() - before) == 1  # a reader thread took over
        asyncio.run(channel.close())
    finally:
        asyncio.run(box.stop())


@needs_engine
async def test_an_answer_comes_while_the_server_is_stopped(make):
    """The worker writes its frame into the exec's stream itself; the loop reads it."""
    box = await make()
    channel = await _channel(box)
    try:
        call = asyncio.ensure_future(channel.call(shell(box, "touch started; sleep 1; echo direct", "c1"), 30))
        await sh(box, "until [ -e started ]; do sleep 0.05; done", timeout=20)
        await sh(box, f"kill -STOP {channel.pid}")
        try:
            assert _text(await asyncio.wait_for(call, 20)) == "direct"
        finally:
            await sh(box, f"kill -CONT {channel.pid}")
        assert _text(await channel.call(shell(box, "echo next", "c2"), 30)) == "next"
    finally:
        await channel.close()


@needs_engine
async def test_a_cancelled_call_is_answered_once_and_the_channel_goes_on(make):
    box = await make()
    channel = await _channel(box)
    ids = []
    read = channel._on_line
    channel._on_line = lambda line: (ids.append(json.loads(line).get("id")), read(line))
    try:
        call = asyncio.ensure_future(channel.call(shell(box, "touch started; sleep 60", "c1"), 60))
        await sh(box, "until [ -e started ]; do sleep 0.05; done", timeout=20)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert _text(await channel.call(shell(box, "echo alive", "c2"), 30)) == "alive"
        await asyncio.sleep(0.5)  # a second answer to the cancelled call would have come by now
        assert ids == ["q1", "q2"] and not channel.dead  # the cancelled call answered once
    finally:
        await channel.close()
