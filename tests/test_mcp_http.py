"""`/mcp` over streamable HTTP: the official SDK's client against a real server on a loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import uvicorn
from mcp import Client
from mcp.server.mcpserver import MCPServer

import mcp_kit as kit
from guilds.fronts.mcp_server import RUN_KEY, build_server, http_endpoint, streamable_http_app
from guilds.toolbox import Toolbox
from toolbox_kit import local_toolbox


@contextlib.asynccontextmanager
async def serving(app) -> AsyncIterator[str]:
    """uvicorn serving app on 127.0.0.1, a free port, in this event loop; yields /mcp's URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    assert await kit.wait_for(lambda: server.started or task.done(), 20) and server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def toolbox(tmp_path) -> AsyncIterator[Toolbox]:
    async with local_toolbox(tmp_path) as box:
        yield box


@pytest.fixture
async def url(toolbox) -> AsyncIterator[str]:
    async with serving(streamable_http_app(toolbox)) as endpoint:
        yield endpoint


def client(url: str, mode: str = "auto") -> Client:
    return Client(url, mode=mode, read_timeout_seconds=60)


async def test_tools_each_call_and_bad_calls(url, tmp_path, toolbox):
    run = {RUN_KEY: "mcp-http-each"}
    async with client(url) as c:
        await kit.check_tool_list(c)
        assert await kit.check_each_tool(c, tmp_path / "home", meta=run) == "mcp-http-each"
        await kit.check_bad_calls(c, meta=run)
    calls = await toolbox.store.calls("mcp-http-each")
    assert [c.tool for c in calls[:2]] == ["shell", "file_read"] and calls[0].status == "done"


async def test_the_toolbox_gets_the_arguments_as_sent(url, toolbox):
    """No coercion on the way ("5" stays a string), and an unknown tool is a call of the run too."""
    run = {RUN_KEY: "mcp-http-raw"}
    async with client(url) as c:
        five = await c.call_tool("shell", {"command": "true", "timeout_seconds": "5"}, meta=run)
        unknown = await c.call_tool("rm_rf", {}, meta=run)
    assert five.is_error and kit.text_of(five).startswith('timeout_seconds: must be an integer, got "5"\n')
    assert unknown.is_error and kit.text_of(unknown).startswith("unknown tool 'rm_rf' (known: code_task, shell")
    assert [c.tool for c in await toolbox.store.calls("mcp-http-raw")] == ["shell", "rm_rf"]


def test_the_server_is_the_sdks_mcpserver(toolbox):
    assert isinstance(build_server(toolbox), MCPServer)


async def test_a_session_is_one_run(url, tmp_path, toolbox):
    """A handshake-era client (Claude Code, Cursor, ...) has a session: its calls share one run."""
    (tmp_path / "home" / "sub").mkdir(parents=True)
    async with client(url, "legacy") as c:
        first = await c.call_tool("shell", {"command": "cd sub"})
        second = await c.call_tool("shell", {"command": "pwd"})
    async with client(url, "legacy") as c:
        other = await c.call_tool("shell", {"command": "pwd"})
    assert kit.text_of(second).startswith(str(tmp_path / "home" / "sub"))
    run_id = kit.meta_of(first)["run"]
    assert kit.meta_of(second)["run"] == run_id and run_id.startswith("mcp-")
    assert kit.meta_of(other)["run"] not in (run_id, None)
    runs = [r.id for r in await toolbox.store.list_runs("agent1")]
    assert run_id in runs


async def test_without_a_session_calls_keep_the_agents_current_run(url, tmp_path):
    """The SDK's default client (no session over HTTP): a cd and the read pointer carry over
    from one client to the next; a named run becomes the current one; a bad name is refused."""
    (tmp_path / "home" / "sub").mkdir(parents=True)
    (tmp_path / "home" / "sub" / "n.txt").write_text("one\ntwo\n")
    async with client(url) as c:
        a = await c.call_tool("shell", {"command": "cd sub"})
        first_read = await c.call_tool("file_read", {"path": "n.txt"})
    async with client(url) as c:
        b = await c.call_tool("shell", {"command": "pwd"})
        again = await c.call_tool("file_read", {"path": "n.txt"})
        named = await c.call_tool("shell", {"command": "true"}, meta={RUN_KEY: "mcp-named-1"})
        after = await c.call_tool("shell", {"command": "true"})
        bad = await c.call_tool("shell", {"command": "true"}, meta={RUN_KEY: "../x"})
        still = await c.call_tool("shell", {"command": "true"})
    run = kit.meta_of(a)["run"]
    assert run.startswith("mcp-") and kit.meta_of(b)["run"] == run
    assert kit.text_of(b) == kit.run_line(run) + f"{tmp_path / 'home' / 'sub'}\nremaining_tool_calls: 197"
    assert "one" in kit.text_of(first_read) and kit.meta_of(again)["repeat_of"] == kit.meta_of(first_read)["seq"]
    assert kit.meta_of(named)["run"] == kit.meta_of(after)["run"] == "mcp-named-1"
    assert bad.is_error and "run id" in kit.text_of(bad) and kit.meta_of(still)["run"] == "mcp-named-1"


async def test_a_sessionless_run_ends_after_its_idle_time(toolbox):
    async with serving(streamable_http_app(toolbox, sessionless_idle_seconds=2.0)) as endpoint, client(endpoint) as c:
        a = await c.call_tool("shell", {"command": "true"})
        b = await c.call_tool("shell", {"command": "true"})
        await asyncio.sleep(3.0)
        later = await c.call_tool("shell", {"command": "true"})
    assert kit.meta_of(a)["run"] == kit.meta_of(b)["run"] != kit.meta_of(later)["run"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_sessionless_run_goes_on_through_another_server_on_the_record(tmp_path, backend):
    """Two servers of one agent on one run record (a deployment's replicas behind one Service):
    a client naming no run gets the same run through either, its working directory kept, and
    a new one from both once it was idle its time."""
    from guilds.record.store import Store
    from web_kit import record_url

    url = record_url(backend, tmp_path)
    agent = {"id": f"sl{uuid.uuid4().hex[:10]}"}  # its own on a PostgreSQL database other tests share
    async with Store(url) as first_store, Store(url) as second_store, \
            local_toolbox(tmp_path, first_store, agent=agent) as first, \
            local_toolbox(tmp_path, second_store, agent=agent) as second, \
            serving(streamable_http_app(first, sessionless_idle_seconds=3.0)) as one, \
            serving(streamable_http_app(second, sessionless_idle_seconds=3.0)) as other:
        (tmp_path / "home" / "sub").mkdir(parents=True, exist_ok=True)
        async with client(one) as c:
            a = await c.call_tool("shell", {"command": "cd sub"})
        async with client(other) as c:
            b = await c.call_tool("shell", {"command": "pwd"})
        await asyncio.sleep(4.0)
        async with client(other) as c:
            later = await c.call_tool("shell", {"command": "pwd"})
        async with client(one) as c:
            again = await c.call_tool("shell", {"command": "true"})
    run = kit.meta_of(a)["run"]
    assert run.startswith("mcp-") and kit.meta_of(b)["run"] == run
    assert kit.text_of(b).startswith(kit.run_line(run) + f"{tmp_path / 'home' / 'sub'}\n")
    assert kit.meta_of(later)["run"] not in (run, None) and kit.meta_of(again)["run"] == kit.meta_of(later)["run"]


async def test_progress_on_a_long_command(url):
    async with client(url) as c:
        await kit.check_progress(c)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancel_kills_the_command_and_is_recorded(url, toolbox, mode):
    """auto: the 2026 era cancels by closing the response stream; legacy: notifications/cancelled."""
    run = {RUN_KEY: f"mcp-cancel-{mode}"}
    async with client(url, mode) as c:
        arg = await kit.cancel_sleep(c, meta=run)
        assert not await kit.left_running(arg)
    (call,) = await kit.settled_calls(toolbox.store, run[RUN_KEY])
    assert call.status == "cancelled" and call.is_error


async def test_the_endpoint_mounts_in_another_app(toolbox):
    """What `guilds serve` does: the route in its routes, the lifespan in its lifespan."""
    from starlette.applications import Starlette

    endpoint = http_endpoint(toolbox)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with endpoint.lifespan():
            yield

    async with serving(Starlette(routes=[endpoint.route], lifespan=lifespan)) as url, client(url) as c:
        result = await c.call_tool("shell", {"command": "echo mounted"})
    assert kit.page_text(result).startswith("mounted")


# --- the run handle (SEP-2567): the run id a result gives, named back as the `run` argument
async def test_a_first_call_gets_its_run_and_names_it_back(url, tmp_path, toolbox):
    """The SDK's client in its modern mode: the run the server chose is the first line of
    the text the model reads (no structuredContent, which a client would show in place of
    the text); another client naming it continues it (the cd carries over)."""
    (tmp_path / "home" / "sub").mkdir(parents=True)
    async with client(url, "2026-07-28") as c:
        first = await c.call_tool("shell", {"command": "cd sub"})
    run = kit.meta_of(first)["run"]
    assert run.startswith("mcp-") and first.structured_content is None
    assert kit.text_of(first) == (f'run: {run} (pass it back as "run" to continue this run)\n'
                                  "(no output)\n[working directory now: ~/sub]\nremaining_tool_calls: 199")
    async with client(url, "legacy") as c:  # a session of its own, but the handle wins
        named = await c.call_tool("shell", {"command": "pwd", "run": run})
    assert kit.meta_of(named)["run"] == run and named.structured_content is None
    assert kit.text_of(named) == f"{tmp_path / 'home' / 'sub'}\nremaining_tool_calls: 198"
    (call,) = [c for c in await toolbox.store.calls(run) if c.seq == 2]
    assert call.args == {"command": "pwd"}  # the handle is the call's run, not an argument of the tool


async def test_the_run_line_is_only_where_the_server_chose_the_run(url):
    """A session's run, a run named in _meta or as the argument: the text is the page's."""
    async with client(url, "legacy") as c:
        session = await c.call_tool("shell", {"command": "echo s"})
    async with client(url, "2026-07-28") as c:
        named = await c.call_tool("shell", {"command": "echo m"}, meta={RUN_KEY: "mcp-line-named"})
        chosen = await c.call_tool("shell", {"command": "echo c"})
        handed = await c.call_tool("shell", {"command": "echo h", "run": "mcp-line-named"})
    assert kit.text_of(session) == "s\nremaining_tool_calls: 199"
    assert kit.text_of(named) == "m\nremaining_tool_calls: 199"
    assert kit.meta_of(chosen)["run"] == "mcp-line-named"  # the named run became the current one
    assert kit.text_of(chosen) == kit.run_line("mcp-line-named") + "c\nremaining_tool_calls: 198"
    assert kit.text_of(handed) == "h\nremaining_tool_calls: 197"


async def test_the_run_line_is_outside_the_cap_and_on_errors(tmp_path):
    """A result shaped to the 64 KiB cap starts with the run line, its text whole after it;
    an error result of a chosen run names the run too."""
    lines = "".join(f"{n:04d} " + "x" * 380 + "\n" for n in range(600))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "big.txt").write_text(lines)
    async with local_toolbox(tmp_path, agent={"result_max_bytes": 65536}) as box, \
            serving(streamable_http_app(box)) as endpoint, client(endpoint, "2026-07-28") as c:
        missing = await c.call_tool("file_read", {"path": "gone.txt"})
        run = kit.meta_of(missing)["run"]
        big = await c.call_tool("file_read", {"path": "big.txt", "limit": 500})
        named = await c.call_tool("file_read", {"path": "big.txt", "offset": 100, "limit": 500, "run": run})
    assert missing.is_error and kit.text_of(missing).startswith(kit.run_line(run))
    assert kit.meta_of(big)["run"] == run
    body = kit.text_of(big).removeprefix(kit.run_line(run))
    assert body != kit.text_of(big) and body.endswith("\nremaining_tool_calls: 198")
    assert "to stay under 65536 bytes" in body and 60_000 < len(body.encode()) <= 65536 + 30
    assert "run: " not in kit.text_of(named) and "to stay under 65536 bytes" in kit.text_of(named)


async def test_a_bad_run_handle_is_refused_by_name(url):
    async with client(url, "2026-07-28") as c:
        run = kit.meta_of(await c.call_tool("shell", {"command": "true"}))["run"]
        unknown = await c.call_tool("shell", {"command": "true", "run": "mcp-" + "0" * 32})
        typed = await c.call_tool("file_read", {"path": "x", "run": 7})
        unsafe = await c.call_tool("shell", {"command": "true", "run": "../x"})
        both = await c.call_tool("shell", {"command": "true", "run": run}, meta={RUN_KEY: "mcp-other"})
        same = await c.call_tool("shell", {"command": "true", "run": run}, meta={RUN_KEY: run})
    assert unknown.is_error and kit.text_of(unknown) == (
        f"run: no run 'mcp-{'0' * 32}' on this server; omit run to start a new one")
    assert typed.is_error and kit.text_of(typed) == "run: must be a run id from an earlier result (a string), got 7"
    assert unsafe.is_error and kit.text_of(unsafe).startswith("run id: must be letters, digits")
    assert both.is_error and "name one run" in kit.text_of(both)
    assert not same.is_error and kit.meta_of(same)["run"] == run


async def test_raw_requests_of_the_current_revision(url):
    """No SDK: a self-contained POST per call (no initialize, no Mcp-Session-Id)."""
    from mcp_raw import RawClient

    raw = RawClient(url, tasks=False)
    first = await raw.call("shell", {"command": "echo raw"})
    run = first["_meta"]["guilds/meta"]["run"]
    assert first["resultType"] == "complete" and "structuredContent" not in first
    assert first["content"] == [{"type": "text", "text": kit.run_line(run)
                                 + "raw\nremaining_tool_calls: 199"}]
    again = await raw.call("shell", {"command": "echo again", "run": run})
    assert again["_meta"]["guilds/meta"]["run"] == run and "structuredContent" not in again
    assert again["content"][0]["text"] == "again\nremaining_tool_calls: 198"
    listed = await raw.post("tools/list", {})
    assert all(t["inputSchema"]["properties"]["run"]["type"] == "string" for t in listed["result"]["tools"])
