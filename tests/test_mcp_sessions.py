"""A session of the older handshake served by any server on the record: two real servers of
one agent (uvicorn, the real local sandbox) on one run record, SQLite and PostgreSQL, and the
MCP SDK's own client in its handshake mode, its requests sent to one server and the other
in turn as a Service with no affinity sends them."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import mcp_kit as kit
from guilds.fronts.mcp_server import streamable_http_app
from guilds.record.store import Store
from guilds.web.endpoint_lock import EndpointLock, Lock, host_names
from test_mcp_http import serving
from toolbox_kit import local_toolbox
from web_kit import record_url

TOKEN, OTHER_TOKEN = "t" * 43, "u" * 43
HANDSHAKE = {"accept": "application/json, text/event-stream", "content-type": "application/json",
             "mcp-protocol-version": "2025-06-18", "authorization": f"Bearer {TOKEN}"}


class NoAffinity(httpx2.AsyncBaseTransport):
    """Each request to the next server in turn: a Service with no session affinity."""

    def __init__(self, ports: list[int]):
        self.ports = itertools.cycle(ports)
        self.served: Counter[tuple[int, str]] = Counter()
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self.ports)
        request.url = request.url.copy_with(port=port)
        self.served[port, request.method] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def two_servers(tmp_path, backend: str, tokens: tuple[str, str] = (TOKEN, TOKEN)) -> AsyncIterator[list[str]]:
    """Two servers of one agent on one record, each behind its own token's lock; their /mcp URLs."""
    url = record_url(backend, tmp_path)
    agent = {"id": f"ss{uuid.uuid4().hex[:10]}"}  # its own on a PostgreSQL database other tests share
    async with Store(url) as first_store, Store(url) as second_store, \
            local_toolbox(tmp_path, first_store, agent=agent) as first, \
            local_toolbox(tmp_path, second_store, agent=agent) as second, \
            serving(_locked(first, tokens[0])) as one, serving(_locked(second, tokens[1])) as other:
        yield [one, other]


def _locked(toolbox, token: str) -> EndpointLock:
    return EndpointLock(streamable_http_app(toolbox), Lock(token, host_names("127.0.0.1")))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_one_session_through_two_servers_in_turn_is_one_run(tmp_path, backend):
    (tmp_path / "home" / "sub").mkdir(parents=True)
    async with two_servers(tmp_path, backend) as urls:
        service = NoAffinity([_port(u) for u in urls])
        async with httpx2.AsyncClient(transport=service, headers={"authorization": f"Bearer {TOKEN}"},
                                      timeout=httpx2.Timeout(30, read=300)) as http, \
                Client(streamable_http_client(urls[0], http_client=http), mode="legacy",
                       read_timeout_seconds=60) as c:
            first = await c.call_tool("shell", {"command": "cd sub"})
            rest = [await c.call_tool("shell", {"command": "pwd"}) for _ in range(5)]
            await kit.check_progress(c)  # its notifications on the call's own response, wherever it runs
        run = kit.meta_of(first)["run"]
        assert run.startswith("mcp-") and {kit.meta_of(r)["run"] for r in rest} == {run}
        assert all(kit.text_of(r).startswith(f"{tmp_path / 'home' / 'sub'}\n") for r in rest)
        posts = {port: n for (port, method), n in service.served.items() if method == "POST"}
        assert len(posts) == 2 and min(posts.values()) >= 4, service.served  # both servers served its calls


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}


def _call(command: str) -> dict:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "shell", "arguments": {"command": command}}}


def _answer(response: httpx2.Response) -> dict:
    """The JSON-RPC answer of a POST, sent as JSON or as the one event of a stream."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
        return json.loads([d for d in data if '"id"' in d][-1])
    return response.json()


async def _opened(raw: httpx2.AsyncClient, url: str) -> str:
    """A session opened on url (the handshake and its notification); its id."""
    opened = await raw.post(url, headers=HANDSHAKE, json=INITIALIZE)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    done = await raw.post(url, headers={**HANDSHAKE, "mcp-session-id": session},
                          json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert done.status_code == 202, done.text
    return session


async def test_another_server_serves_a_session_until_it_is_deleted_there(tmp_path):
    async with two_servers(tmp_path, "sqlite") as (one, other), httpx2.AsyncClient(timeout=60) as raw:
        session = await _opened(raw, one)
        with_session = {**HANDSHAKE, "mcp-session-id": session}
        here = _answer(await raw.post(one, headers=with_session, json=_call("echo here")))
        there = _answer(await raw.post(other, headers=with_session, json=_call("echo there")))
        [text] = [block["text"] for block in there["result"]["content"]]
        assert text.startswith("there\n"), there
        assert here["result"]["_meta"]["guilds/meta"]["run"] == there["result"]["_meta"]["guilds/meta"]["run"]
        stream = await raw.get(other, headers={**with_session, "accept": "text/event-stream"})
        assert stream.status_code == 405 and stream.headers["allow"] == "POST, DELETE"
        assert (await raw.delete(other, headers=with_session)).status_code == 200
        gone = await raw.post(other, headers=with_session, json=_call("echo again"))
        assert gone.status_code == 404  # as the SDK answers a session it does not know: start a new one
        unknown = await raw.post(one, headers={**HANDSHAKE, "mcp-session-id": uuid.uuid4().hex}, json=_call("true"))
        assert unknown.status_code == 404


async def test_a_session_deleted_elsewhere_ends_where_it_was_opened(tmp_path, monkeypatch):
    """Its opener reads the record again when its use is due (here at every request: touch 0)."""
    from datetime import timedelta

    from guilds.fronts import mcp_sessions

    monkeypatch.setattr(mcp_sessions, "TERMS", dataclasses.replace(mcp_sessions.TERMS, touch=timedelta(0)))
    async with two_servers(tmp_path, "sqlite") as (one, other), httpx2.AsyncClient(timeout=60) as raw:
        session = await _opened(raw, one)
        with_session = {**HANDSHAKE, "mcp-session-id": session}
        assert (await raw.post(one, headers=with_session, json=_call("true"))).status_code == 200
        assert (await raw.delete(other, headers=with_session)).status_code == 200
        ended = await raw.post(one, headers=with_session, json=_call("echo after its end"))
        assert ended.status_code == 404, ended.text  # the opener no longer serves it either
        assert (await raw.delete(one, headers=with_session)).status_code == 404


async def test_a_session_of_another_token_is_not_served(tmp_path):
    async with two_servers(tmp_path, "sqlite", (TOKEN, OTHER_TOKEN)) as (one, other), \
            httpx2.AsyncClient(timeout=60) as raw:
        session = await _opened(raw, one)
        elsewhere = await raw.post(other, headers={**HANDSHAKE, "mcp-session-id": session,
                                                   "authorization": f"Bearer {OTHER_TOKEN}"}, json=_call("id -u"))
        assert elsewhere.status_code == 404  # the other server's token: as if no such session
