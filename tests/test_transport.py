"""The transport: the real helper over the local sandbox, and fake helpers
(real little python files) for the ways a helper can fail."""

from __future__ import annotations

import base64
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from guilds.config.settings import AgentSettings
from guilds.errors import BadInput, HelperFailed
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox.tools import wait_for
from guilds.toolbox.transport import call_helper
from guilds_code import limits
from guilds_code.protocol import encode_request


class Recording(LocalSandbox):
    """The local sandbox, noting each argv it runs and each file it writes."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.argvs: list[list[str]] = []
        self.files: list[str] = []

    async def exec(self, argv, *, env=None, timeout):
        self.argvs.append(list(argv))
        return await super().exec(argv, env=env, timeout=timeout)

    async def write_file(self, path, data):
        self.files.append(path)
        await super().write_file(path, data)


class FakeHelper(Recording):
    """The local sandbox whose guilds-code is the script given."""

    script: Path

    def helper_path(self, name: str) -> str:
        return str(self.script)


def request(home: str, **extra) -> dict:
    return {"op": "nope", "args": {}, "run_id": "run1", "agent_id": "agent1", "call_id": "c1",
            "home": home, "cwd": home, **extra}


@pytest.fixture
async def local(tmp_path) -> Recording:
    box = Recording(AgentSettings(id="agent1", home=tmp_path / "home"), tmp_path / "data")
    await box.start()
    return box


@pytest.fixture
def fake(tmp_path):
    def _fake(source: str) -> FakeHelper:
        script = tmp_path / "fake-helper.py"
        script.write_text(textwrap.dedent(source))
        (tmp_path / "home").mkdir()
        box = FakeHelper(AgentSettings(id="agent1", home=tmp_path / "home"), tmp_path / "data")
        box.script = script
        return box

    return _fake


def padded(home: str, json_length: int) -> dict:
    """A request whose JSON is json_length bytes long."""
    bare = len(base64.b64decode(encode_request(request(home, args={"pad": ""}))))
    return request(home, args={"pad": "x" * (json_length - bare)})


@pytest.mark.parametrize("op, args, seconds", [
    ("shell", {"command": "make"}, 150),
    ("shell", {"command": "make", "timeout_seconds": 10}, 40),
    ("shell", {"command": "make", "timeout_seconds": 600}, 630),
    ("shell", {"command": "make", "timeout_seconds": 6000}, 150),
    ("shell", {"command": "make", "timeout_seconds": True}, 150),
    ("file_read", {"path": "a"}, 120),
    ("code_search", {"pattern": "a"}, 120),
    ("shell_status", {}, 120),
    ("shell_status", {"id": "b1", "stop": True}, 120),
    ("shell_status", {"id": "b1", "wait": 1}, 121),
    ("shell_status", {"id": "b1", "wait": 600}, 720),
    ("shell_status", {"id": "b1", "wait": 601}, 120),
    ("shell_status", {"id": "b1", "until": "x"}, 180),
    ("shell_status", {"id": "b1", "until": "x", "wait": 5}, 125),
])
def test_wait_for(op, args, seconds):
    assert wait_for(op, args) == seconds


async def test_a_request_up_to_64_kib_goes_on_the_command_line(local):
    req = padded(local.home, limits.REQUEST_ARGV_MAX // 4 * 3)
    assert len(encode_request(req)) == limits.REQUEST_ARGV_MAX
    envelope = await call_helper(local, req, wait=30)
    assert envelope["ok"] is False and envelope["error"].startswith("op: unknown op")
    assert local.files == []
    assert local.argvs == [[local.python, "-I", "-S", local.helper_path("guilds-code"), encode_request(req)]]


async def test_a_longer_request_goes_through_a_file_the_helper_deletes(local):
    req = padded(local.home, limits.REQUEST_ARGV_MAX // 4 * 3 + 1)
    assert len(encode_request(req)) == limits.REQUEST_ARGV_MAX + 4
    envelope = await call_helper(local, req, wait=30)
    assert envelope["ok"] is False and envelope["error"].startswith("op: unknown op")
    path = f"{local.state_dir}/requests/run1-c1.json"
    assert local.files == [path]
    assert local.argvs[0][-1] == path
    assert not os.path.exists(path)


async def test_a_long_request_with_an_unsafe_run_id_is_refused(local):
    req = padded(local.home, limits.REQUEST_ARGV_MAX)
    req["run_id"] = "../x"
    with pytest.raises(BadInput):
        await call_helper(local, req, wait=30)
    assert local.argvs == []


async def test_no_envelope_quotes_the_last_five_stderr_lines(fake):
    box = fake("""
        import sys
        for i in range(1, 9):
            print(f"line {i}", file=sys.stderr)
        sys.exit(2)
    """)
    with pytest.raises(HelperFailed) as failed:
        await call_helper(box, request(box.home), wait=30)
    assert str(failed.value) == "code helper failed\nline 4\nline 5\nline 6\nline 7\nline 8"


@pytest.mark.parametrize("stdout", ["hello", "eyJvayI6IHRydWV9", "eyJvayI6ZmFsc2UsImVycm9yIjoieCJ9\nQQ=="])
async def test_a_malformed_envelope_fails(fake, stdout):
    box = fake(f"print({stdout!r})")
    with pytest.raises(HelperFailed) as failed:
        await call_helper(box, request(box.home), wait=30)
    assert str(failed.value) == "code helper failed"


async def test_a_silent_crash_names_its_exit(fake):
    box = fake("import os; os.kill(os.getpid(), 9)")
    with pytest.raises(HelperFailed) as failed:
        await call_helper(box, request(box.home), wait=30)
    assert str(failed.value) == "code helper failed\n(exit -9, nothing on stderr)"


async def test_an_overrun_is_killed_and_reported_quickly(fake, tmp_path):
    pid_file = tmp_path / "pid"
    box = fake(f"""
        import os, sys, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        print("working on it", file=sys.stderr, flush=True)
        time.sleep(60)
    """)
    began = time.monotonic()
    with pytest.raises(HelperFailed) as failed:
        await call_helper(box, request(box.home), wait=1)
    assert time.monotonic() - began < 3.5
    assert str(failed.value) == "code helper failed: no answer within 1 s\nworking on it"
    assert not Path(f"/proc/{pid_file.read_text()}").exists()


async def test_a_grandchild_holding_the_pipes_does_not_pin_the_call(fake, tmp_path):
    pid_file = tmp_path / "pid"
    envelope = encode_request({"ok": True, "text": "done", "meta": {}})
    box = fake(f"""
        import os, subprocess
        child = subprocess.Popen(["sleep", "88"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print({envelope!r})
    """)
    began = time.monotonic()
    try:
        assert await call_helper(box, request(box.home), wait=30) == {"ok": True, "text": "done", "meta": {}}
        assert time.monotonic() - began < 3
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

