"""Two agents' servers on one run record, each behind its own token: a refused call
claims nothing and moves nothing. The official SDK's client over streamable HTTP,
on SQLite and on PostgreSQL where $GUILDS_TEST_POSTGRES_URL names one."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import mcp_kit as kit
from guilds.fronts.mcp_server import RUN_KEY, streamable_http_app
from guilds.record.store import Store
from guilds.toolbox import Toolbox
from guilds.web.endpoint_lock import EndpointLock, Lock, host_names
from test_mcp_http import serving
from toolbox_kit import local_toolbox

PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")
TOKEN_X, TOKEN_Y = "x" * 43, "y" * 43
RECORDS = ["sqlite", pytest.param("postgresql", marks=[
    pytest.mark.postgres, pytest.mark.skipif(not PG_URL, reason="GUILDS_TEST_POSTGRES_URL is not set")])]


def record_url(tmp_path: Path, backend: str) -> str:
    return f"sqlite:///{tmp_path}/shared.db" if backend == "sqlite" else str(PG_URL)


@contextlib.asynccontextmanager
async def agent_server(tmp_path: Path, url: str, agent: str, token: str) -> AsyncIterator[tuple[Toolbox, str]]:
    """One agent's toolbox on its own connection to the shared record, served behind token."""
    folder = tmp_path / agent
    folder.mkdir()
    async with Store(url) as store, local_toolbox(folder, store, agent={"id": agent}) as toolbox:
        app = EndpointLock(streamable_http_app(toolbox), Lock(token, host_names("127.0.0.1")))
        async with serving(app) as endpoint:
            yield toolbox, endpoint


@contextlib.asynccontextmanager
async def client(endpoint: str, token: str) -> AsyncIterator[Client]:
    async with (create_mcp_http_client(headers={"authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(endpoint, http_client=http), read_timeout_seconds=60) as c):
        yield c


def unique(agent: str) -> str:
    return f"{agent}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("backend", RECORDS)
async def test_a_call_refused_for_another_agents_run_does_not_claim_it(tmp_path, backend):
    url, x, y = record_url(tmp_path, backend), unique("agentx"), unique("agenty")
    async with agent_server(tmp_path, url, x, TOKEN_X) as (x_box, x_url), \
            agent_server(tmp_path, url, y, TOKEN_Y) as (_, y_url):
        run = f"mcp-{uuid.uuid4().hex}"
        await x_box.call(run, "shell", {"command": "true"})  # X's run, made outside MCP (guilds call --run)
        async with client(y_url, TOKEN_Y) as c:
            by_argument = await c.call_tool("shell", {"command": "echo y", "run": run})
            by_meta = await c.call_tool("shell", {"command": "echo y"}, meta={RUN_KEY: run})
        async with client(x_url, TOKEN_X) as c:
            own = await c.call_tool("shell", {"command": "echo x-again", "run": run})
            own_meta = await c.call_tool("shell", {"command": "echo x-meta"}, meta={RUN_KEY: run})
    refusal = f"run {run!r} belongs to agent {x!r}, not {y!r}"
    assert by_argument.is_error and kit.text_of(by_argument) == refusal
    assert by_meta.is_error and kit.text_of(by_meta) == refusal
    assert not own.is_error and kit.text_of(own).startswith("x-again"), kit.text_of(own)
    assert not own_meta.is_error and kit.meta_of(own_meta)["run"] == run, kit.text_of(own_meta)


@pytest.mark.parametrize("backend", RECORDS)
async def test_meta_naming_another_tokens_run_keeps_the_callers_current_run(tmp_path, backend):
    url = record_url(tmp_path, backend)
    agent = unique("agent")
    async with agent_server(tmp_path, url, agent, TOKEN_X) as (toolbox, x_url):
        y_app = EndpointLock(streamable_http_app(toolbox), Lock(TOKEN_Y, host_names("127.0.0.1")))
        async with serving(y_app) as y_url:
            async with client(x_url, TOKEN_X) as c:
                theirs = kit.meta_of(await c.call_tool("shell", {"command": "true"}))["run"]
            async with client(y_url, TOKEN_Y) as c:
                mine = kit.meta_of(await c.call_tool("shell", {"command": "cd /tmp"}))["run"]
                refused = await c.call_tool("shell", {"command": "pwd"}, meta={RUN_KEY: theirs})
                after = await c.call_tool("shell", {"command": "pwd"})
    assert theirs != mine
    assert refused.is_error and kit.text_of(refused) == (
        f"run {theirs!r} was started with another token; omit run to start a new one")
    assert not after.is_error and kit.meta_of(after)["run"] == mine, kit.text_of(after)
    assert kit.text_of(after).startswith(kit.run_line(mine) + "/tmp\n")
