"""The unmodified E2B Python SDK against a real `guilds serve --e2b`, on local, bwrap and docker.

The SDK reaches the server only through the variables `guilds serve --e2b` prints
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY); every command really runs in the
agent's sandbox, and every request is a call of the sandbox's run.
"""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException, TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException

from e2b_kit import BACKENDS, E2BServer, e2b_server, pids_alive
from guilds.record import Store, database_url

pytestmark = [pytest.mark.slow, pytest.mark.backends(*BACKENDS)]


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp(f"e2b-{backend}"), backend) as served:
        served.backend = backend  # type: ignore[attr-defined]
        yield served


@pytest.fixture
def sbx(server: E2BServer, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    box = Sandbox.create(envs={"GREETING": "hello from create"}, metadata={"suite": "e2b"}, timeout=120)
    yield box
    box.kill()


def _gone(server: E2BServer, sbx: Sandbox, marker: str, within: float = 8.0) -> bool:
    """No process with marker is left: none seen inside the sandbox (a grep that does not
    match itself), nor on this machine (where the backend's processes are this machine's)."""
    pattern = f"{marker[:-1]}[{marker[-1]}]"
    look = f"grep -l -s -e '{pattern}' /proc/[0-9]*/cmdline || true"
    deadline = time.monotonic() + within
    while True:
        inside = sbx.commands.run(look).stdout.strip()
        outside = [] if server.backend == "docker" else pids_alive(marker)  # type: ignore[attr-defined]
        if not inside and not outside:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def test_run_streams_stdout_and_stderr_with_the_exit_code(sbx):
    seen: list[str] = []
    result = sbx.commands.run("echo out; echo err >&2; echo $GREETING", on_stdout=seen.append)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\nhello from create\n", "err\n")
    assert "".join(seen) == result.stdout
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo before; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "before\n"
    home = sbx.commands.run("pwd; id -u").stdout.split()
    assert home[1] == sbx.commands.run("id -u", envs={"X": "1"}).stdout.strip()


def test_background_survives_its_client_and_is_reattached_by_pid(sbx, server, monkeypatch):
    handle = sbx.commands.run("sleep 1.5; echo finished", background=True)
    pid = handle.pid
    handle.disconnect()  # the client goes away
    again = Sandbox.connect(sbx.sandbox_id)
    assert pid in [p.pid for p in again.commands.list()]
    result = again.commands.connect(pid).wait()
    assert (result.exit_code, result.stdout) == (0, "finished\n")


def test_a_command_that_ended_unwatched_still_gives_its_exit_code(sbx):
    handle = sbx.commands.run("exit 7", background=True)
    handle.disconnect()
    deadline = time.monotonic() + 10
    while handle.pid in [p.pid for p in sbx.commands.list()] and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(CommandExitException) as ended:
        sbx.commands.connect(handle.pid).wait()
    assert ended.value.exit_code == 7


def test_list_and_kill_leave_nothing_running(sbx, server):
    marker = f"e2bkill{secrets.token_hex(4)}"
    handle = sbx.commands.run(f"bash -c 'sleep 300; echo {marker}'", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert not _gone(server, sbx, marker, within=0)  # the check sees it while it runs
    assert sbx.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert killed.value.exit_code == -1
    assert _gone(server, sbx, marker)
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid) is False  # not_found: already gone


def test_stdin_is_sent_and_closed(sbx):
    handle = sbx.commands.run("cat; echo '<eof>'", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "line one\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "line one\n<eof>\n"


def test_a_timeout_stops_the_command_inside_the_sandbox(sbx, server):
    marker = f"e2btimeout{secrets.token_hex(4)}"
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run(f"bash -c 'sleep 300; echo {marker}'", timeout=2)
    assert time.monotonic() - t0 < 20
    assert _gone(server, sbx, marker)
    background = sbx.commands.run(f"bash -c 'sleep 300; echo {marker}b'", background=True, timeout=2)
    with pytest.raises(TimeoutException):
        background.wait()  # a background command's deadline is its stream's: it is stopped too
    assert _gone(server, sbx, marker)


def test_the_sandbox_timeout_kills_it_and_its_commands(server, monkeypatch):
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    marker = f"e2bend{secrets.token_hex(4)}"
    box = Sandbox.create(timeout=120, metadata={"marker": marker})
    box.commands.run(f"bash -c 'sleep 300; echo {marker}'", background=True, timeout=0)
    assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"marker": marker})).next_items()] \
        == [box.sandbox_id]
    assert box.get_info().metadata == {"marker": marker}
    box.set_timeout(2)  # its end now near (set once its command runs: a loaded machine's create is slow)
    deadline = time.monotonic() + 20
    while box.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()] and time.monotonic() < deadline:
        time.sleep(0.3)
    with pytest.raises(NotFoundException):
        Sandbox.connect(box.sandbox_id)
    looker = Sandbox.create()  # the agent's sandbox is shared: another E2B sandbox sees its processes
    try:
        assert _gone(server, looker, marker)
    finally:
        looker.kill()


def test_stopping_the_server_ends_the_commands_and_records_them(tmp_path, monkeypatch):
    marker = f"e2bstop{secrets.token_hex(4)}"
    with e2b_server(tmp_path, "local") as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        box = Sandbox.create()
        box.commands.run(f"bash -c 'sleep 300; echo {marker}'", background=True, timeout=0)
    assert pids_alive(marker) == []

    async def last_call() -> tuple[str, dict]:
        async with Store(database_url(served.data, {})) as store:
            calls = await store.calls(f"e2b-{box.sandbox_id}")
        return calls[-1].status, calls[-1].meta

    status, meta = asyncio.run(last_call())
    assert status == "done" and meta["exit_code"] == -1 and meta["signal"] in (9, 15)


def test_set_timeout_keeps_the_sandbox(sbx):
    sbx.set_timeout(600)
    assert 590 < sbx.get_info().end_at.timestamp() - time.time() <= 600
    with pytest.raises(SandboxException, match="timeout"):
        sbx.set_timeout(10**9)


def test_files_write_read_list_stat_remove(sbx):
    info = sbx.files.write("notes/a.txt", "alpha\n")
    assert info.name == "a.txt" and info.path.endswith("/notes/a.txt")
    assert sbx.files.read("notes/a.txt") == "alpha\n"
    assert sbx.commands.run("cat notes/a.txt").stdout == "alpha\n"
    assert [e.name for e in sbx.files.list("notes")] == ["a.txt"]
    assert sbx.files.get_info("notes/a.txt").size == 6
    assert sbx.files.make_dir("notes/sub") is True
    assert sbx.files.make_dir("notes/sub") is False
    sbx.files.rename("notes/a.txt", "notes/sub/b.txt")
    assert sbx.files.exists("notes/sub/b.txt") and not sbx.files.exists("notes/a.txt")
    big = secrets.token_bytes(3 * 1024 * 1024 + 5)  # more than one chunk, gzip both ways
    sbx.files.write("notes/big.bin", big, gzip=True)
    assert bytes(sbx.files.read("notes/big.bin", format="bytes", gzip=True)) == big
    sbx.files.remove("notes")
    assert not sbx.files.exists("notes")
    with pytest.raises(NotFoundException):
        sbx.files.read("notes/sub/b.txt")


def test_paths_outside_the_home_are_refused(sbx):
    for path in ("/etc/passwd", "../outside.txt", "/proc/self/environ"):
        with pytest.raises(SandboxException) as refused:
            sbx.files.read(path)
        assert "outside the home" in str(refused.value)
    sbx.commands.run("ln -s /etc escape")
    with pytest.raises(SandboxException, match="outside the home"):
        sbx.files.write("escape/planted", "x")
    with pytest.raises(SandboxException, match="outside the home"):
        sbx.files.list("/")


def test_keys_see_only_their_own_sandboxes(sbx, server):
    assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=server.other_key).next_items()]
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=server.other_key)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")


def test_bad_requests_get_connect_errors_not_tracebacks(sbx, server):
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
    start = f"{server.url}/process.Process/Start"
    cases = [
        ({**base, "Content-Type": "application/connect+json"}, b"\x00\x00\x00\x00\x09{", 400, "invalid_argument"),
        ({**base, "Content-Type": "application/proto"}, b"\x0a\x03", 415, "unimplemented"),
        ({**base, "X-Access-Token": "x" * 5000, "Content-Type": "application/connect+json"}, b"", 401,
         "unauthenticated"),
        ({**base, "X-Access-Token": "\u00ff\u00fe".encode("latin-1"), "Content-Type": "application/json"}, b"{}", 401,
         "unauthenticated"),
        ({**base, "E2b-Sandbox-Id": "nope", "Content-Type": "application/json"}, b"{}", 404, "not_found"),
        ({"Content-Type": "application/json"}, b"{}", 400, "invalid_argument"),
    ]
    for headers, body, status, code in cases:
        answer = httpx.post(start, headers=headers, content=body)
        assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text
        assert "Traceback" not in answer.text
    listed = httpx.post(f"{server.url}/process.Process/List", content=b"[1,",
                        headers={**base, "Content-Type": "application/json"})
    assert (listed.status_code, listed.json()["code"]) == (400, "invalid_argument")
    other = Sandbox.create(api_key=server.other_key)
    try:  # one sandbox's token opens no other sandbox, whoever made it
        crossed = httpx.post(f"{server.url}/process.Process/List", content=b"{}", headers={
            **base, "X-Access-Token": other._envd_access_token, "Content-Type": "application/json"})
        assert (crossed.status_code, crossed.json()["code"]) == (401, "unauthenticated")
    finally:
        other.kill()
    gone = httpx.get(f"{server.url}/sandboxes/nope", headers={"X-API-KEY": server.key})
    assert (gone.status_code, gone.json()) == (404, {"code": 404, "message": "sandbox 'nope' not found"})


def test_the_control_plane_answers_as_e2b_does(server):
    key = {"X-API-KEY": server.key}
    made = httpx.post(f"{server.url}/sandboxes", json={"templateID": "base", "timeout": 30}, headers=key)
    assert made.status_code == 201 and {"sandboxID", "envdAccessToken", "envdVersion"} <= made.json().keys()
    sandbox = f"{server.url}/sandboxes/{made.json()['sandboxID']}"
    assert [s["sandboxID"] for s in httpx.get(f"{server.url}/sandboxes", headers=key).json()].count(
        made.json()["sandboxID"]) == 1
    assert httpx.post(f"{sandbox}/pause", headers=key).status_code == 204
    assert (httpx.post(f"{sandbox}/pause", headers=key).json()["code"]) == 409
    assert httpx.post(f"{sandbox}/resume", json={"timeout": 30}, headers=key).status_code == 201
    for body, status in [({"timeout": "x"}, 400), ({"envVars": {"A": 1}}, 400), ({"templateID": 3}, 400)]:
        refused = httpx.post(f"{server.url}/v2/sandboxes", json=body, headers=key)
        assert (refused.status_code, refused.json()["code"]) == (status, status)
    assert httpx.post(f"{server.url}/v2/sandboxes", content=b"{", headers=key).json()["code"] == 400
    assert httpx.get(f"{server.url}/v2/sandboxes").json() == {
        "code": 401, "message": "Invalid API key: X-API-KEY must be a key this server printed"}
    assert httpx.delete(sandbox, headers=key).status_code == 204
    assert httpx.get(sandbox, headers=key).status_code == 404


def test_pause_keeps_files_and_resume_serves_again(sbx):
    sbx.files.write("kept.txt", "still here")
    sbx.beta_pause()
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.files.read("kept.txt") == "still here"
    assert again.commands.run("echo resumed").stdout == "resumed\n"


def test_every_request_is_a_call_of_the_sandbox_run(sbx, server):
    sbx.commands.run("echo recorded")
    with pytest.raises(CommandExitException):
        sbx.commands.run("exit 4")
    sbx.files.write("r.txt", "x")
    time.sleep(0.5)  # the command's record is written when its end arrives

    async def rows() -> list[tuple[str, str]]:
        async with Store(database_url(server.data, {})) as store:
            calls = await store.calls(f"e2b-{sbx.sandbox_id}")
        return [(c.tool, c.row) for c in calls]

    found = asyncio.run(rows())
    assert ("shell", "Run echo recorded") in found
    assert ("shell", "Run exit 4 · exit 4") in found
    assert ("e2b files.write", "e2b files.write") in found
    token = (server.data / "serve.token").read_text().strip()
    page = httpx.get(f"{server.url}/runs/e2b-{sbx.sandbox_id}", headers={"Authorization": f"Bearer {token}"})
    assert page.status_code == 200
    assert "Run echo recorded" in page.text and "Run exit 4" in page.text


def test_the_agents_uid_has_a_name_in_the_sandbox(sbx):
    sbx.files.write("owned.txt", "mine")
    info = sbx.files.get_info("owned.txt")
    names = sbx.commands.run("whoami; id -un; id -gn").stdout.split()
    assert not info.owner.isdigit() and not info.group.isdigit()
    assert names == [info.owner, info.owner, info.group]
