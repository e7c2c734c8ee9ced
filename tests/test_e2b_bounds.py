"""What a client sends, or leaves unread, is bounded: bodies, metadata and nesting, a
command's unread output (measured as the server's memory), the sandboxes a key holds;
a binary-protobuf body gets Connect's 415; connects that come together resume once."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from e2b_kit import (
    E2BServer,
    e2b_server,
    home_of,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
    pids_alive,
)
from guilds.limits import E2B_MAX_BODY_BYTES, E2B_MAX_METADATA_BYTES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-bounds"), "local") as served:
        yield served


def _in_sandbox(server: E2BServer, box: Sandbox, kind: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token, "Content-Type": kind}


def test_a_binary_protobuf_body_gets_415_as_connect_answers_it(server, sbx):
    answer = httpx.post(f"{server.url}/process.Process/List", content=b"\x0a\x00",
                        headers=_in_sandbox(server, sbx, "application/proto"))
    assert answer.status_code == 415 and answer.headers["accept-post"] == "application/json"
    assert answer.json()["code"] == "unimplemented" and "application/json" in answer.json()["message"]


def _create(server: E2BServer, body: bytes) -> httpx.Response:
    return httpx.post(f"{server.url}/sandboxes", content=body, timeout=60,
                      headers={"X-API-KEY": server.key, "Content-Type": "application/json"})


def _padded(value: dict, size: int) -> bytes:
    data = json.dumps(value).encode()
    return data + b" " * (size - len(data))


def test_a_create_body_is_bounded_to_the_byte(server):
    at_limit = _create(server, _padded({"timeout": 30}, E2B_MAX_BODY_BYTES))
    assert at_limit.status_code == 201, at_limit.text
    httpx.delete(f"{server.url}/sandboxes/{at_limit.json()['sandboxID']}", headers={"X-API-KEY": server.key})
    over = _create(server, _padded({"timeout": 30}, E2B_MAX_BODY_BYTES + 1))
    assert (over.status_code, over.json()) == (413, {
        "code": 413, "message": f"the request body is over {E2B_MAX_BODY_BYTES} bytes"})


def test_metadata_is_bounded_to_the_byte(server):
    key = "k" * 16
    made = _create(server, json.dumps({"timeout": 30, "metadata": {key: "v" * (E2B_MAX_METADATA_BYTES - 16)}})
                   .encode())
    assert made.status_code == 201, made.text
    httpx.delete(f"{server.url}/sandboxes/{made.json()['sandboxID']}", headers={"X-API-KEY": server.key})
    over = _create(server, json.dumps({"metadata": {key: "v" * (E2B_MAX_METADATA_BYTES - 15)}}).encode())
    assert over.status_code == 400 and over.json()["code"] == 400
    assert f"at most {E2B_MAX_METADATA_BYTES} bytes" in over.json()["message"]


def test_a_600_mb_create_body_leaves_the_servers_memory_as_it_was(server):
    before = server.rss_mb()

    def body():
        chunk = b'{"metadata": {"a": "' + b"x" * (1024 * 1024 - 20)
        yield chunk
        for _ in range(600):
            yield b"x" * (1024 * 1024)

    try:
        answer = httpx.post(f"{server.url}/sandboxes", content=body(), timeout=120,
                            headers={"X-API-KEY": server.key, "Content-Type": "application/json"})
    except httpx.TransportError:  # the server closed the connection after the answer
        pass
    else:
        assert answer.status_code == 413
    grown = server.rss_mb() - before
    assert grown < 100, f"the server grew {grown:.0f} MB"
    assert httpx.get(f"{server.url}/sandboxes", headers={"X-API-KEY": server.key}).status_code == 200


def test_a_body_nested_100000_deep_is_a_400_not_a_traceback(server, sbx):
    deep = b'{"metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    refused = _create(server, deep)
    assert refused.status_code == 400 and refused.json()["code"] == 400, refused.text
    listed = httpx.post(f"{server.url}/process.Process/List", content=deep,
                        headers=_in_sandbox(server, sbx, "application/json"))
    assert (listed.status_code, listed.json()["code"]) == (400, "invalid_argument")
    assert "Traceback" not in refused.text + listed.text
    assert sbx.commands.run("echo still").stdout == "still\n"


def test_a_make_dir_too_deep_leaves_the_sandbox_serving(sbx):
    with pytest.raises(Exception, match="folders to make"):
        sbx.files.make_dir("/".join(["d"] * 1500))
    assert sbx.commands.run("echo served").stdout == "served\n"
    assert sbx.files.make_dir("shallow/one") is True


def _services(marker: str, settled: int) -> int:
    """The process services running, once they number settled (a stopped one may take a moment to go)."""
    deadline = time.monotonic() + 10
    while len(pids_alive(marker)) != settled and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(pids_alive(marker))


def test_connects_that_come_together_resume_one_process_service(server, sbx):
    service = f"envd\0{home_of(sbx, server.data)}"
    assert _services(service, 1) == 1
    sbx.beta_pause()
    assert _services(service, 0) == 0
    with ThreadPoolExecutor(8) as pool:
        resumed = list(pool.map(lambda _: Sandbox.connect(sbx.sandbox_id), range(8)))
    time.sleep(0.5)  # a service started twice would be running by now
    assert len(pids_alive(service)) == 1
    assert resumed[0].commands.run("echo one").stdout == "one\n"


def test_live_sandboxes_are_capped_per_key_and_per_server(tmp_path, monkeypatch):
    with e2b_server(tmp_path, "local", "[agents]\nmax_per_owner = 2\nmax = 3") as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        env = {"api_key": served.key, "api_url": served.url}
        with ThreadPoolExecutor(4) as pool:  # four at once: two made, two refused
            made = list(pool.map(lambda _: _try_create(env), range(4)))
        boxes = [m for m in made if isinstance(m, Sandbox)]
        refused = [m for m in made if not isinstance(m, Sandbox)]
        assert len(boxes) == 2 and len(refused) == 2
        assert all(isinstance(r, RateLimitException) and str(r).endswith(
            "sandbox limit reached: owner 'e2b:default' holds 2 agents, the most one owner may "
            "(agents.max_per_owner); remove one first") for r in refused)
        other = {"api_key": served.other_key, "api_url": served.url}
        third = Sandbox.create(**other)
        with pytest.raises(RateLimitException, match=r"this server holds 3 agents, its most \(agents\.max\)"):
            Sandbox.create(**other)
        raw = httpx.post(f"{served.url}/sandboxes", json={}, headers={"X-API-KEY": served.other_key})
        assert raw.status_code == 429 and raw.json()["code"] == 429
        boxes[0].beta_pause()  # a paused sandbox still counts
        with pytest.raises(RateLimitException):
            Sandbox.create(**other)
        boxes[0].kill()
        again = Sandbox.create(**env)
        assert {again.sandbox_id, boxes[1].sandbox_id, third.sandbox_id} == {
            s.sandbox_id for s in Sandbox.list(**env).next_items() + Sandbox.list(**other).next_items()}


def _try_create(env: dict) -> Sandbox | Exception:
    try:
        return Sandbox.create(**env)
    except RateLimitException as exc:
        return exc


def test_output_nobody_reads_holds_the_command_back_not_the_servers_memory(server, sbx):
    done = home_of(sbx, server.data) / "unread.done"
    before = server.rss_mb()
    handle = sbx.commands.run("head -c 200M /dev/zero; touch unread.done", background=True, timeout=0)
    time.sleep(12)  # the client reads nothing meanwhile
    grown = server.rss_mb() - before
    assert grown < 100, f"the server grew {grown:.0f} MB over an unread stream"
    assert not done.exists()  # the command is held back: it could not write it all
    handle.disconnect()  # the stream goes: what it held is let go, and the command runs on
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.exists()
    assert server.rss_mb() - before < 100


def test_a_stream_that_reads_gets_all_of_a_large_output(sbx):
    result = sbx.commands.run("head -c 30M /dev/zero | tr '\\0' a; echo; echo tail", timeout=120)
    assert len(result.stdout) == 30 * 1024 * 1024 + len("\ntail\n") and result.stdout.endswith("a\ntail\n")


def test_a_multipart_upload_reaches_the_sandbox_as_it_arrives_and_spools_nothing(tmp_path, monkeypatch):
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool))  # the server's temporary folder: it must stay empty
    with e2b_server(tmp_path, "local") as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        box = Sandbox.create()
        target = home_of(box, served.data) / "up.bin"
        seen: list[int] = []

        def body():
            yield b'--b0\r\nContent-Disposition: form-data; name="file"; filename="up.bin"\r\n\r\n'
            yield b"a" * (2 * 1024 * 1024)
            deadline = time.monotonic() + 30
            while not (target.exists() and target.stat().st_size >= 1024 * 1024) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen.append(target.stat().st_size if target.exists() else 0)
            seen.append(len(list(spool.iterdir())))
            yield b"b" * (2 * 1024 * 1024) + b"\r\n--b0--\r\n"

        answer = httpx.post(f"{served.url}/files", params={"path": "up.bin"}, content=body(), timeout=60,
                            headers={"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token,
                                     "Content-Type": "multipart/form-data; boundary=b0"})
        assert answer.status_code == 200, answer.text
        assert seen[0] >= 1024 * 1024, "the sandbox saw nothing before the body ended"
        assert seen[1] == 0 and list(spool.iterdir()) == []
        assert target.read_bytes() == b"a" * (2 * 1024 * 1024) + b"b" * (2 * 1024 * 1024)
        box.files.write_files([{"path": "m1.txt", "data": "one"}, {"path": "m2.txt", "data": "two"}])
        assert (box.files.read("m1.txt"), box.files.read("m2.txt")) == ("one", "two")
        broken = httpx.post(f"{served.url}/files", params={"path": "x.bin"}, content=b"--b0\r\nnot a part",
                            headers={"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token,
                                     "Content-Type": "multipart/form-data; boundary=b0"})
        assert broken.status_code == 400 and "Traceback" not in broken.text


def test_a_command_writing_into_the_services_stdout_grows_no_memory(server, sbx):
    assert "envd" in sbx.commands.run("tr '\\0' ' ' < /proc/$PPID/cmdline").stdout  # the service is its parent
    done = home_of(sbx, server.data) / "junk.done"
    before = server.rss_mb()
    sbx.commands.run("head -c 200M /dev/zero > /proc/$PPID/fd/1; touch junk.done", background=True, timeout=0)
    deadline = time.monotonic() + 180  # a machine loaded by a whole parallel suite reads it slowly
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert done.exists(), "the server could not keep up with a line without an end"
    grown = server.rss_mb() - before
    assert grown < 100, f"the server grew {grown:.0f} MB"
    assert sbx.commands.run("echo after", timeout=30).stdout == "after\n"


def test_a_server_writing_more_than_a_pipe_holds_to_stderr_keeps_answering(tmp_path, monkeypatch):
    """The kit reads the server's stderr on once its variables are printed: a server that
    logs past a pipe's buffer (each line a command writes into its process service's stdout
    is a warning line) never blocks on the write."""
    with e2b_server(tmp_path, "local") as served:
        served.export(monkeypatch)
        box = Sandbox.create(timeout=120)
        noise = "for i in $(seq 2000); do echo not-the-services-own-line-$i; done > /proc/$PPID/fd/1"
        box.commands.run(noise, timeout=60)
        assert box.commands.run("echo still", timeout=60).stdout == "still\n"
        box.kill()
    assert any("not-the-services-own-line-2000" in line for line in served.log)


def test_a_write_that_fails_midway_is_answered_at_once_with_its_reason(tmp_path, monkeypatch):
    """A file written in pieces, several on their way at once (E2B_FILE_CHUNKS_IN_FLIGHT), that
    the sandbox stops taking midway (the file made read-only from inside): the answer names the
    failure, the pieces after it are dropped, and the sandbox's files serve on."""
    from guilds.limits import E2B_FILE_CHUNKS_IN_FLIGHT
    from guilds_code.limits import ENVD_CHUNK_BYTES

    with e2b_server(tmp_path, "bwrap") as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        box = Sandbox.create()
        target = home_of(box, served.data) / "half.bin"

        def body():
            yield b"a" * (2 * ENVD_CHUNK_BYTES)
            deadline = time.monotonic() + 30
            while not (target.exists() and target.stat().st_size >= ENVD_CHUNK_BYTES) and time.monotonic() < deadline:
                time.sleep(0.05)
            box.commands.run("chmod 444 half.bin")
            for _ in range(4 * E2B_FILE_CHUNKS_IN_FLIGHT):
                yield b"b" * ENVD_CHUNK_BYTES

        started = time.monotonic()
        answer = httpx.post(f"{served.url}/files", params={"path": "half.bin"}, content=body(), timeout=120,
                            headers={"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": box._envd_access_token,
                                     "Content-Type": "application/octet-stream"})
        assert answer.status_code >= 400 and "Permission denied" in answer.json()["message"], answer.text
        assert time.monotonic() - started < 60
        assert target.stat().st_size < 2 * ENVD_CHUNK_BYTES + 4 * E2B_FILE_CHUNKS_IN_FLIGHT * ENVD_CHUNK_BYTES
        big = bytes(range(256)) * (3 * ENVD_CHUNK_BYTES // 256) + b"end"  # pieces in flight, in their order
        box.files.write("whole.bin", big)
        assert box.files.read("whole.bin", format="bytes") == big
        box.kill()
