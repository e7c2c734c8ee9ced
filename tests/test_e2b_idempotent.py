"""Idempotent creates (guilds.fronts.e2b.create_keys): a create that carries an
``Idempotency-Key`` makes one sandbox however often it is sent by the same API key, through
the real e2b SDK (its ``api_headers``) and raw requests against a real `guilds serve --e2b`:
a repeat answers the same sandbox (id, envd access token); creates sent together make one;
another body under the key is refused 422 in E2B's error body; another API key's same
value, a sandbox killed or a failed create leave the key free; in process, with real local
sandboxes, a key is forgotten past the bounds of time and count."""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox

import guilds
from e2b_kit import E2BServer, _settings, e2b_server
from guilds.fronts.e2b import create_keys
from guilds.fronts.e2b.sandboxes import Sandboxes
from guilds.limits import E2B_CREATE_KEY_BYTES

pytestmark = pytest.mark.slow
TOGETHER = 4
"""Creates sent at once with one key."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-idempotent"), "local") as served:
        yield served


def new_key() -> str:
    return f"create-{secrets.token_hex(8)}"


def created(server: E2BServer, key: str, body: dict, api_key: str | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/sandboxes", json=body, timeout=120,
                      headers={"X-API-KEY": api_key or server.key, "Idempotency-Key": key})


def listed(server: E2BServer, api_key: str | None = None) -> set[str]:
    answer = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-KEY": api_key or server.key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return {sandbox["sandboxID"] for sandbox in answer.json()}


def kill(server: E2BServer, sandbox_id: str, api_key: str | None = None) -> None:
    httpx.delete(f"{server.url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": api_key or server.key}, timeout=60)


def test_the_sdk_s_repeated_create_answers_the_same_sandbox(server, monkeypatch):
    server.export(monkeypatch)
    key = new_key()
    before = listed(server)
    first = Sandbox.create(timeout=120, metadata={"job": "a"}, api_headers={"Idempotency-Key": key})
    try:
        again = Sandbox.create(timeout=120, metadata={"job": "a"}, api_headers={"Idempotency-Key": key})
        assert again.sandbox_id == first.sandbox_id
        assert again._envd_access_token == first._envd_access_token
        assert listed(server) - before == {first.sandbox_id}
        assert again.commands.run("echo one").stdout == "one\n"
        other = Sandbox.create(timeout=120, metadata={"job": "a"}, api_headers={"Idempotency-Key": new_key()})
        assert other.sandbox_id != first.sandbox_id
        other.kill()
    finally:
        first.kill()


def test_creates_sent_together_with_one_key_make_one_sandbox(server, monkeypatch):
    server.export(monkeypatch)
    key = new_key()
    before = listed(server)

    def create(_: int) -> Sandbox:
        return Sandbox.create(timeout=120, api_headers={"Idempotency-Key": key})

    with ThreadPoolExecutor(TOGETHER) as pool:
        boxes = list(pool.map(create, range(TOGETHER)))
    try:
        assert {box.sandbox_id for box in boxes} == {boxes[0].sandbox_id}
        assert {box._envd_access_token for box in boxes} == {boxes[0]._envd_access_token}
        assert listed(server) - before == {boxes[0].sandbox_id}
        assert created(server, key, {"timeout": 120}).status_code == 422  # the SDK's body says more
    finally:
        boxes[0].kill()


def test_the_key_with_another_body_is_refused_422_and_the_first_sandbox_stays(server):
    key = new_key()
    first = created(server, key, {"timeout": 120, "metadata": {"job": "a"}})
    assert first.status_code == 201, first.text
    try:
        same = created(server, key, {"metadata": {"job": "a"}, "timeout": 120})  # the same object, keys reordered
        assert same.status_code == 201 and same.json()["sandboxID"] == first.json()["sandboxID"]
        assert same.json()["envdAccessToken"] == first.json()["envdAccessToken"]
        assert same.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
        other = created(server, key, {"timeout": 120, "metadata": {"job": "b"}})
        assert other.status_code == 422
        assert other.json() == {"code": 422, "message": "Idempotency-Key: already used for a create with another "
                                                        "body; use a new key for another request"}
        assert first.json()["sandboxID"] in listed(server)
    finally:
        kill(server, first.json()["sandboxID"])


def test_another_api_key_s_same_value_is_another_key(server):
    key = new_key()
    mine = created(server, key, {"timeout": 120})
    theirs = created(server, key, {"timeout": 120}, api_key=server.other_key)
    try:
        assert mine.status_code == theirs.status_code == 201
        assert mine.json()["sandboxID"] != theirs.json()["sandboxID"]
        assert mine.json()["sandboxID"] not in listed(server, server.other_key)
    finally:
        kill(server, mine.json()["sandboxID"])
        kill(server, theirs.json()["sandboxID"], server.other_key)


def test_a_killed_sandbox_or_a_failed_create_leaves_its_key_free(server):
    key = new_key()
    failed = created(server, key, {"templateID": "no-such-template"})
    assert failed.status_code == 404, failed.text
    first = created(server, key, {"timeout": 120})  # the failed create made nothing: the key is free
    assert first.status_code == 201, first.text
    kill(server, first.json()["sandboxID"])
    again = created(server, key, {"timeout": 120})
    assert again.status_code == 201, again.text
    assert again.json()["sandboxID"] != first.json()["sandboxID"] and "idempotent-replayed" not in again.headers
    kill(server, again.json()["sandboxID"])


@pytest.mark.parametrize("key", [b"", b"x" * (E2B_CREATE_KEY_BYTES + 1), b"tab\there", "caf\u00e9".encode()])
def test_a_bad_key_is_refused_400_and_makes_nothing(server, key):
    before = listed(server)
    answer = httpx.post(f"{server.url}/sandboxes", json={"timeout": 120}, timeout=60,
                        headers=[(b"X-API-KEY", server.key.encode()), (b"Idempotency-Key", key)])
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"code": 400, "message": f"Idempotency-Key: 1 to {E2B_CREATE_KEY_BYTES} printable "
                                                     "ASCII characters"}
    assert listed(server) == before


async def test_a_key_is_forgotten_past_its_time_and_the_oldest_past_the_count(tmp_path, monkeypatch):
    monkeypatch.setattr(create_keys, "E2B_CREATE_KEYS", 2)
    data = tmp_path / "data"
    async with guilds.open(_settings(tmp_path, "local", ""), data_dir=data, pool=False,
                           env={**os.environ, "GUILDS_DATA": str(data)}) as agent:
        sandboxes = Sandboxes(await agent.agents(), "client")
        keys = create_keys.CreateKeys(sandboxes)

        async def create(key: str) -> str:
            box, _ = await keys.once("default", key, {}, lambda: sandboxes.create("default", "base", 60, {}, {}))
            return box.id

        try:
            first, second = await create("a"), await create("b")
            assert await create("a") == first
            third = await create("c")  # three keys: the oldest, a, is forgotten
            assert await create("b") == second and await create("c") == third
            assert await create("a") not in (first, second, third)
            monkeypatch.setattr(create_keys, "E2B_CREATE_KEY_SECONDS", 0.0)  # every key past its time
            assert await create("c") != third
            assert len(sandboxes.every()) == 5
        finally:
            await sandboxes.close()
