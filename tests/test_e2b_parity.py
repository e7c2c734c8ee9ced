"""E2B's own behaviour where guilds used to differ, through the unmodified E2B Python SDK
against a real `guilds serve --e2b` (local backend: these are the front's answers, the same
on every backend)."""

from __future__ import annotations

import json
import struct
import time

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException, TimeoutException
from e2b.sandbox.filesystem.filesystem import FileType

from e2b_kit import E2BServer, e2b_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-parity"), "local") as served:
        yield served


@pytest.fixture
def sdk(server: E2BServer, monkeypatch):
    server.export(monkeypatch)
    return server


@pytest.fixture
def sbx(sdk):
    box = Sandbox.create(timeout=120)
    yield box
    box.kill()


def test_removing_a_missing_path_is_no_error(sbx):
    sbx.files.write("there.txt", "x")
    sbx.files.remove("there.txt")
    assert not sbx.files.exists("there.txt")
    sbx.files.remove("there.txt")  # gone already
    sbx.files.remove("no/such/folder/file.txt")  # nor is its folder there
    with pytest.raises(SandboxException, match="outside the home"):
        sbx.files.remove("/etc/hostname")


def test_a_killed_or_timed_out_sandbox_is_not_running(sdk):
    killed = Sandbox.create(timeout=120)
    assert killed.is_running() is True
    killed.kill()
    assert killed.is_running() is False
    ended = Sandbox.create(timeout=120)
    ended.set_timeout(1)
    time.sleep(2.5)
    assert ended.is_running() is False
    health = httpx.get(f"{sdk.url}/health", headers={"E2b-Sandbox-Id": ended.sandbox_id, "X-Access-Token": "x"})
    assert health.status_code == 502 and health.json()["code"] == 502
    assert health.json()["message"].startswith(f"The sandbox {ended.sandbox_id} was not found")


def test_connect_never_shortens_a_running_sandbox(sbx):
    before = Sandbox.get_info(sbx.sandbox_id).end_at
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    assert Sandbox.get_info(sbx.sandbox_id).end_at == before
    Sandbox.connect(sbx.sandbox_id, timeout=600)
    assert (Sandbox.get_info(sbx.sandbox_id).end_at - before).total_seconds() > 400


def test_a_links_info_names_its_target(sbx):
    sbx.files.write("linked/target.txt", "hello")
    sbx.commands.run("ln -s target.txt link.txt", cwd="linked")
    home = sbx.commands.run("pwd").stdout.strip()
    info = sbx.files.get_info("linked/link.txt")
    assert (info.name, info.path, info.type) == ("link.txt", f"{home}/linked/link.txt", FileType.FILE)
    assert info.symlink_target == f"{home}/linked/target.txt"
    assert sbx.files.get_info("linked/target.txt").symlink_target is None


def test_killing_a_sandbox_under_a_command_says_it_was_killed(sbx):
    command = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    with pytest.raises(TimeoutException, match="sandbox was killed or reached its"):
        command.wait()


def test_a_killed_sandbox_resets_its_streams_connection(sbx, sdk):
    """A reset, not an orderly close: E2B's SDKs take only a transport failure for a sandbox gone."""
    start = f"{sdk.url}/process.Process/Start"
    message = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "sleep 60"]}}).encode()
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
               "Content-Type": "application/connect+json"}
    with httpx.stream("POST", start, headers=headers, content=struct.pack(">BI", 0, len(message)) + message,
                      timeout=30) as answer:
        chunks = answer.iter_raw()
        assert b'"start"' in next(chunks)
        assert httpx.delete(f"{sdk.url}/sandboxes/{sbx.sandbox_id}", headers={"X-API-KEY": sdk.key}).status_code == 204
        with pytest.raises(httpx.ReadError):
            for _ in chunks:
                pass


@pytest.mark.parametrize(("method", "path", "feature"), [
    ("GET", "/templates", "this template request"),
    ("PATCH", "/v2/templates/{id}", "this template request"),
    ("GET", "/templates/{id}/builds/{id}/logs", "this template request"),
    ("POST", "/snapshots", "snapshots"),
    ("GET", "/sandboxes/{id}/snapshots", "snapshots"),
    ("GET", "/sandboxes/metrics", "metrics"),
    ("GET", "/sandboxes/{id}/network", "network updates (update_network)"),
    ("GET", "/sandboxes/{id}/fork", "fork"),
    ("GET", "/volumes", "volumes"),
    ("PUT", "/sandboxes", "this request"),
])
def test_what_is_not_served_is_answered_501_naming_it(sbx, sdk, method, path, feature):
    answer = httpx.request(method, sdk.url + path.format(id=sbx.sandbox_id), headers={"X-API-KEY": sdk.key})
    assert answer.status_code == 501
    assert answer.json()["code"] == 501 and answer.json()["message"].startswith(f"{feature} is not supported")


def test_the_sdk_says_what_is_not_supported(sbx):
    with pytest.raises(SandboxException, match=r"metrics are not served for sandbox .*share the server's cgroup"):
        sbx.get_metrics()
