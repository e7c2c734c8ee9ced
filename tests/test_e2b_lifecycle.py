"""A sandbox's lifecycle through the real ``e2b`` SDK: paused, not killed, at its timeout
when its create asks so (``lifecycle={"on_timeout": "pause"}``), and resumed by a connect;
the kernel boot id it reads, on bwrap its own, new after a filesystem-only pause."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxException, SandboxState

from e2b_kit import BACKENDS, E2BServer, e2b_server

pytestmark = [pytest.mark.slow, pytest.mark.backends(*BACKENDS)]


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp(f"e2b-life-{backend}"), backend) as served:
        yield served


@pytest.fixture
def env(server: E2BServer, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return server


def _paused_within(box: Sandbox, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while box.get_info().state != SandboxState.PAUSED:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


SHORT = 10
"""A sandbox's timeout in the tests that wait it out: long enough for a loaded machine to
answer the create and the first requests before it."""

def test_at_its_timeout_it_pauses_keeping_its_files_and_a_connect_resumes_it(env):
    box = Sandbox.create(timeout=SHORT, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        box.files.write("kept.txt", "through the pause")
        assert box.commands.run("echo before").stdout == "before\n"
        assert _paused_within(box, SHORT + 20)
        assert not box.is_running()
        assert box.get_info().state == SandboxState.PAUSED  # not killed: still listed, still its own
        again = Sandbox.connect(box.sandbox_id, timeout=60)
        assert box.get_info().state == SandboxState.RUNNING and again.is_running()
        assert again.files.read("kept.txt") == "through the pause"
        assert again.commands.run("echo after").stdout == "after\n"
    finally:
        box.kill()


def test_set_timeout_zero_pauses_it_now(env):
    box = Sandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "keep_memory": None}})
    try:
        box.set_timeout(0)
        assert _paused_within(box, 10)
        assert box.connect().commands.run("echo back").stdout == "back\n"
    finally:
        box.kill()


def _seconds_left(box: Sandbox) -> float:
    return (box.get_info().end_at - datetime.now(UTC)).total_seconds()


def test_with_auto_resume_a_request_wakes_it_with_a_fresh_timeout_of_its_creates(env):
    """The next command, file read or request to one of its ports resumes it (E2B's
    auto-resume), for its create's timeout from then; it pauses again at that end."""
    box = Sandbox.create(timeout=SHORT, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        box.files.write("kept.txt", "through the pause")
        assert _paused_within(box, SHORT + 20)
        assert not box.is_running()  # its health wakes nothing
        assert box.get_info().state == SandboxState.PAUSED
        assert box.commands.run("cat kept.txt").stdout == "through the pause"
        assert box.get_info().state == SandboxState.RUNNING
        assert 0 < _seconds_left(box) <= SHORT
        assert _paused_within(box, SHORT + 20)
        assert box.files.read("kept.txt") == "through the pause"
        assert box.get_info().state == SandboxState.RUNNING
        assert _paused_within(box, SHORT + 20)
        port = httpx.get(env.url, headers={"Host": box.get_host(8000)}, timeout=30)
        assert port.status_code == 502  # woken, and nothing listens there: not the paused 409
        assert box.get_info().state == SandboxState.RUNNING and box.is_running()
    finally:
        box.kill()


def test_without_auto_resume_a_request_leaves_it_paused(env):
    box = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        assert _paused_within(box, 20)
        with pytest.raises(Exception):  # noqa: B017 (the SDK's own error for a paused sandbox)
            box.commands.run("true", request_timeout=10)
        port = httpx.get(env.url, headers={"Host": box.get_host(8000)}, timeout=30)
        assert port.status_code == 409 and port.json()["canAutoResume"] is False
        assert box.get_info().state == SandboxState.PAUSED
    finally:
        box.kill()


def test_a_sandbox_made_from_a_snapshot_keeps_its_creates_lifecycle(env):
    source = Sandbox.create(timeout=120)
    try:
        source.files.write("from.txt", "the snapshot's")
        snapshot = source.create_snapshot()
    finally:
        source.kill()
    made = Sandbox.create(snapshot.snapshot_id, timeout=4, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert _paused_within(made, 20)  # paused at its timeout, not killed
        assert made.files.read("from.txt") == "the snapshot's"  # and woken by the read
        assert made.get_info().state == SandboxState.RUNNING
    finally:
        made.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)


def test_without_pause_the_timeout_still_kills(env):
    box = Sandbox.create(timeout=60, lifecycle={"on_timeout": "kill"})
    box.set_timeout(0)
    deadline = time.monotonic() + 10
    while box.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]:
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize(("field", "value", "named"), [
    ("autoPause", "yes", "autoPause: true or false"),
    ("autoPauseMemory", 1, "autoPauseMemory: true or false"),
    ("autoResume", True, "autoResume: an object"),
    ("autoResume", {"enabled": "no"}, "autoResume.enabled: true or false"),
    ("autoResume", {"enabled": True, "other": 1}, "autoResume: an object"),
])
def test_a_bad_lifecycle_field_is_refused_naming_it(env, field, value, named):
    answer = httpx.post(f"{env.url}/sandboxes", json={"templateID": "base", field: value},
                        headers={"X-API-KEY": env.key})
    assert answer.status_code == 400
    assert answer.json()["message"].startswith(named)


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_the_file_api_reads_the_boot_id_the_commands_see(env):
    box = Sandbox.create(timeout=120)
    try:
        seen = box.commands.run(f"cat {BOOT_ID}").stdout
        assert box.files.read(BOOT_ID) == seen and len(seen.strip()) == 36
        with pytest.raises(SandboxException, match="outside the home"):
            box.files.write(BOOT_ID, "00000000-0000-0000-0000-000000000000\n")
        with pytest.raises(SandboxException, match="outside the home"):
            box.files.read("/proc/sys/kernel/random/uuid")
    finally:
        box.kill()


@pytest.mark.backends("bwrap")
def test_a_filesystem_only_pause_is_a_cold_boot_with_a_boot_id_of_its_own(env):
    box = Sandbox.create(timeout=120)
    try:
        first = box.files.read(BOOT_ID).strip()
        assert first != Path(BOOT_ID).read_text().strip()  # the sandbox's own, not the machine's
        assert box.commands.run(f"echo x 2>/dev/null > {BOOT_ID} || echo read-only").stdout == "read-only\n"
        box.files.write("kept.txt", "home")
        box.commands.run("echo tmp > /tmp/gone.txt")
        assert box.pause()  # memory kept (as far as it goes): the same boot
        again = box.connect()
        assert again.files.read(BOOT_ID).strip() == first
        assert again.commands.run("cat /tmp/gone.txt").stdout == "tmp\n"
        assert again.pause(keep_memory=False)  # filesystem-only: the sandbox is started anew
        again = again.connect()
        second = again.files.read(BOOT_ID).strip()
        assert second != first and len(second) == 36
        assert again.files.read("kept.txt") == "home"
        assert again.commands.run("test -e /tmp/gone.txt || echo gone").stdout == "gone\n"  # a new /tmp
    finally:
        box.kill()
