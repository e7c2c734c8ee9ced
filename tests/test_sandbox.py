"""The sandbox conformance suite: every backend this machine has, real processes.

Tests for what only an isolating backend can do (read-only system, pid and
network namespaces, found again, stop, recreate) run on those backends.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest

import kube_kit
from guilds.config.settings import AgentSettings, Repo
from guilds.errors import ConfigError, SandboxError
from guilds.sandbox import get_sandbox
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox
from guilds.toolbox.transport import call_helper
from kube_kit import no_pool_left  # noqa: F401 - a fixture of this module

SECRET = "s3cret-value-7d1f2e"
TOKEN = "ghp_token-4c8a9b0e"
NO_BWRAP = unavailable()
ISOLATED = pytest.mark.backends("bwrap")
"""The isolating backends' tests here: bwrap's (docker's: tests/test_docker_backend.py)."""

def settings_for(tmp_path: Path, backend: str, **kw) -> AgentSettings:
    settings = AgentSettings(
        id="agent1", home=tmp_path / "home", sandbox=backend, secrets={"MY_SECRET": SECRET},
        repos=(Repo("web", "repos/web", TOKEN),), **kw,
    )
    return kube_kit.backend_settings(settings)


@pytest.fixture
async def make(tmp_path):
    """make(backend, **settings) -> a started sandbox; every one is stopped at the end."""
    made = []

    async def _make(backend: str, data: Path = tmp_path / "data", **kw):
        box = get_sandbox(settings_for(tmp_path, backend, **kw), data)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        if box.name == "kubernetes":  # a fresh home for the next test, as the others' tmp_path
            await asyncio.to_thread(kube_kit.remove_agent, box.pod)


@pytest.fixture
async def box(backend, make):
    """A started sandbox of each backend (tests/backend_kit.py)."""
    return await make(backend)


@pytest.fixture
async def jail(backend, make):
    """box, on the ISOLATED backends."""
    return await make(backend)


async def sh(box, script: str, timeout: float = 20, **env: str) -> str:
    result = await box.exec(["bash", "-c", script], env=env, timeout=timeout)
    assert result.exit_code == 0 and not result.timed_out, result
    return result.stdout.decode()


def host_pids_running(*argv: str) -> list[int]:
    """Host pids whose command line is exactly argv."""
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                found.append(int(entry))
        except OSError:
            pass
    return found


async def eventually(check, timeout: float = 5) -> bool:
    """Poll check() until it is true or timeout seconds passed; return its last value."""
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return bool(check())


# --- every backend --------------------------------------------------------
async def test_exec_runs_in_the_home_with_the_agent_env(box):
    out = await sh(box, 'echo "$PWD|$HOME|$PORT|$PORTS|$MY_SECRET|$GUILDS_STATE_DIR|$LANG|$EXTRA"; cat',
                   EXTRA="x1")
    assert out.splitlines() == [
        f"{box.home}|{box.home}|20000|20000-20099|{SECRET}|{box.state_dir}|C.UTF-8|x1"
    ]


async def test_exit_codes_and_signals(box):
    assert (await box.exec(["bash", "-c", "exit 3"], timeout=10)).exit_code == 3
    assert (await box.exec(["bash", "-c", "kill -9 $$"], timeout=10)).exit_code == -signal.SIGKILL


async def test_timeout_kills_and_returns_in_time(box):
    began = time.monotonic()
    result = await box.exec(["bash", "-c", "sleep 93 & sleep 94; echo never"], timeout=1)
    assert result.timed_out and result.exit_code == -signal.SIGTERM
    assert result.stdout == b""
    assert time.monotonic() - began < 3.5
    left = lambda: host_pids_running("sleep", "93") + host_pids_running("sleep", "94")  # noqa: E731
    assert await eventually(lambda: not left(), timeout=5)


async def test_write_file_is_atomic_0600_and_makes_folders(box):
    path = f"{box.state_dir}/requests/r1-c1.json"
    await box.write_file(path, b'{"a": 1}')
    await box.write_file(path, b'{"a": 2}')
    out = await sh(box, f'stat -c %a "{path}"; cat "{path}"; ls -a "$(dirname "{path}")"')
    assert out.split("\n") == ["600", '{"a": 2}.', "..", "r1-c1.json", ""]


async def test_write_file_refuses_outside_and_links(box, tmp_path):
    with pytest.raises(SandboxError, match="outside"):
        await box.write_file("/etc/guilds-test", b"x")
    with pytest.raises(SandboxError, match="outside"):
        await box.write_file(box.home + "-evil/x", b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    await sh(box, f'ln -s "{outside}" "$GUILDS_STATE_DIR/link"')
    with pytest.raises(SandboxError):
        await box.write_file(f"{box.state_dir}/link/x", b"x")
    assert list(outside.iterdir()) == []


async def test_repos_json_maps_folders_to_tokens(box):
    repos = "$GUILDS_STATE_DIR/agent1/repos.json"
    out = await sh(box, f'stat -c %a "{repos}"; cat "{repos}"')
    mode, _, body = out.partition("\n")
    assert mode == "600"
    assert json.loads(body) == {f"{box.home}/repos/web": TOKEN}


async def test_the_helper_answers_a_real_request(box):
    request = {"op": "shell", "args": {"command": "echo hi"}, "run_id": "r1", "agent_id": "agent1",
               "call_id": "c1", "home": box.home, "cwd": box.home}
    envelope = await call_helper(box, request, wait=30)
    if importlib.util.find_spec("guilds_code.ops.shell") is None:
        assert envelope["ok"] is False
    else:
        assert envelope["ok"] is True and "hi" in envelope["text"], envelope


async def test_secrets_travel_in_the_env_never_in_argv(box):
    marker = "1.37"
    running = asyncio.create_task(box.exec(["bash", "-c", f"sleep {marker}; echo $MY_SECRET"], timeout=20))
    assert await eventually(lambda: host_pids_running("sleep", marker))
    lines = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines.append(Path(f"/proc/{entry}/cmdline").read_bytes())
        except OSError:
            pass
    assert not [line for line in lines if SECRET.encode() in line]
    assert (await running).stdout == f"{SECRET}\n".encode()


async def test_cancelling_an_exec_stops_its_process_group(box, tmp_path):
    script = 'trap "echo bye > $HOME/bye; exit 0" TERM; sleep 92 & sleep 92 & wait'
    task = asyncio.create_task(box.exec(["bash", "-c", script], timeout=30))
    assert await eventually(lambda: len(host_pids_running("sleep", "92")) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await eventually(lambda: not host_pids_running("sleep", "92"), timeout=5)
    if box.name == "kubernetes":  # the home is the pod's claim, not a host folder
        assert await sh(box, "cat ~/bye") == "bye\n"  # SIGTERM first
    else:
        assert await eventually((tmp_path / "home" / "bye").exists, timeout=5)  # SIGTERM first


# --- choosing a backend ---------------------------------------------------
@pytest.mark.parametrize("name, error", [
    ("bwrapp", "agent.sandbox: unknown sandbox 'bwrapp'"),
])
def test_get_sandbox_refuses_names_it_cannot_offer(tmp_path, name, error):
    with pytest.raises(ConfigError, match=error):
        get_sandbox(settings_for(tmp_path, name), tmp_path)


def test_auto_is_bwrap_where_it_works(tmp_path):
    expected = "local" if NO_BWRAP else "bwrap"
    assert get_sandbox(settings_for(tmp_path, "auto"), tmp_path).name == expected


def test_auto_falls_back_to_local_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found
    unavailable.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="guilds.sandbox"):
            box = get_sandbox(settings_for(tmp_path, "auto"), tmp_path)
        with pytest.raises(SandboxError, match=r"agent\.sandbox = 'bwrap': .*not found"):
            get_sandbox(settings_for(tmp_path, "bwrap"), tmp_path)
    finally:
        unavailable.cache_clear()
    assert box.name == "local"
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]
    assert "using local" in caplog.text


# --- isolating backends ---------------------------------------------------
@ISOLATED
async def test_only_the_home_is_writable(jail, tmp_path):
    out = await sh(jail, f"""
        touch "$HOME/mine" && echo home-ok
        touch /usr/guilds-x 2>/dev/null || echo usr-ro
        touch /var/tmp/guilds-x 2>/dev/null || echo var-ro
        touch /usr/local/bin/guilds-x 2>/dev/null || echo local-bin-ro
        echo > /usr/local/bin/guilds-code 2>/dev/null || echo helper-ro
        ls -A "{tmp_path / 'data'}" | wc -l
        ls -A /run
    """)
    assert out.split() == ["home-ok", "usr-ro", "var-ro", "local-bin-ro", "helper-ro", "0", "guilds", "guilds-clock"]
    assert (tmp_path / "home" / "mine").exists()


@ISOLATED
async def test_own_pid_namespace(jail):
    out = await sh(jail, "ls /proc | grep -c '^[0-9]'; tr '\\0\\n' '  ' < /proc/1/cmdline")
    count, init = out.splitlines()
    assert int(count) < 10
    assert init.startswith(f"{jail.python} -I -S -c ")  # the sandbox's own init


@ISOLATED
async def test_network_is_off_by_default(jail):
    out = await sh(jail, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert out.split() == ["lo"]


@ISOLATED
async def test_network_on_when_asked(make, backend):
    box = await make(backend, network=True)
    out = await sh(box, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert set(out.split()) > {"lo"}


@ISOLATED
async def test_found_again_by_a_second_orchestrator(make, tmp_path, backend):
    first = await make(backend)
    await sh(first, "setsid sleep 95.5 >/dev/null 2>&1 &")
    assert await eventually(lambda: host_pids_running("sleep", "95.5"))
    second = get_sandbox(settings_for(tmp_path, backend), tmp_path / "data")
    await second.start()
    out = await sh(second, "ps -eo args")
    assert "sleep 95.5" in out


@ISOLATED
async def test_stop_ends_setsid_daemons(jail):
    await sh(jail, "setsid sleep 96.5 >/dev/null 2>&1 < /dev/null &")
    assert await eventually(lambda: host_pids_running("sleep", "96.5"))
    await jail.stop()
    assert not host_pids_running("sleep", "96.5")
    assert "sleep 96.5" not in await sh(jail, "ps -eo args")  # the next call starts a fresh one


@ISOLATED
async def test_recreated_after_the_init_is_killed(jail, tmp_path):
    await sh(jail, "setsid sleep 97.5 >/dev/null 2>&1 < /dev/null &")
    assert await eventually(lambda: host_pids_running("sleep", "97.5"))
    await jail.write_file(f"{jail.state_dir}/requests/old.json", b"{}")
    record = json.loads((tmp_path / "data" / "sandboxes" / "agent1.json").read_text())
    os.kill(record["pid"], signal.SIGKILL)
    assert await eventually(lambda: not Path(f"/proc/{record['pid']}").exists())
    out = await sh(jail, "ps -eo args; ls $GUILDS_STATE_DIR/requests | wc -l; ls $GUILDS_STATE_DIR/agent1")
    assert "sleep 97.5" not in out
    assert out.split()[-2:] == ["0", "repos.json"]
    assert not host_pids_running("sleep", "97.5")


@pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}")
@pytest.mark.bwrap
@pytest.mark.slow
async def test_idle_stop(tmp_path):
    box = BwrapSandbox(settings_for(tmp_path, "bwrap"), tmp_path / "data", idle_seconds=2)
    await box.start()
    try:
        assert await sh(box, "sleep 3; echo still here") == "still here\n"  # a call is not idle
        await sh(box, "setsid sleep 98.5 >/dev/null 2>&1 < /dev/null &")
        record = json.loads((tmp_path / "data" / "sandboxes" / "agent1.json").read_text())
        assert await eventually(lambda: host_pids_running("sleep", "98.5"))
        assert await eventually(lambda: not host_pids_running("sleep", "98.5"), timeout=10)
        assert not Path(f"/proc/{record['pid']}").exists()
    finally:
        await box.stop()


def test_the_container_backends_label_their_sandboxes_guilds_agent():
    """The label containers and pods already running carry: `guilds sandbox list` and a
    later orchestrator find them by it, so it never changes."""
    from guilds.sandbox.docker import docker_spec
    from guilds.sandbox.kubernetes import kube_spec

    assert docker_spec.LABEL_AGENT == kube_spec.LABEL_AGENT == "guilds.agent"

