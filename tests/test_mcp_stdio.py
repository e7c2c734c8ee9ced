"""`guilds mcp` over stdio: the official SDK's client against the server in a real subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import stat
import sys
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

import mcp_kit as kit
from guilds.record.store import Store
from guilds.sandbox.bwrap.bwrap_argv import unavailable


def server_params(tmp_path: Path, sandbox: str = "local", secrets: dict[str, str] | None = None
                  ) -> StdioServerParameters:
    """`python -m guilds.fronts.mcp_stdio SETTINGS DATA`: what `guilds mcp` runs, without the CLI's wiring."""
    settings = kit.write_settings(tmp_path, sandbox=sandbox, secrets=secrets)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUILDS_")}
    args = ["-m", "guilds.fronts.mcp_stdio", str(settings), str(tmp_path / "data")]
    return StdioServerParameters(command=sys.executable, args=args, env=env)


@contextlib.asynccontextmanager
async def stdio_client(tmp_path: Path, sandbox: str = "local", secrets: dict[str, str] | None = None,
                       **kw) -> AsyncIterator[Client]:
    async with Client(server_params(tmp_path, sandbox, secrets), read_timeout_seconds=60, **kw) as client:
        yield client


async def recorded_calls(tmp_path: Path, run_id: str) -> list:
    async with Store(f"sqlite:///{tmp_path / 'data' / 'guilds.db'}") as store:
        return await kit.settled_calls(store, run_id)


async def test_tools_each_call_and_the_record(tmp_path):
    async with stdio_client(tmp_path) as client:
        await kit.check_tool_list(client)
        run_id = await kit.check_each_tool(client, tmp_path / "home")
        await kit.check_bad_calls(client)
    assert run_id.startswith("mcp-")
    calls = await recorded_calls(tmp_path, run_id)
    assert [c.tool for c in calls[:5]] == ["shell", "file_read", "code_search", "shell_status", "code_task"]
    assert all(c.status == "done" for c in calls)
    assert calls[0].row == "Run echo hi"
    data = tmp_path / "data"  # the record is the user's alone
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in data.glob("guilds.db*"))
    assert stat.S_IMODE((data / "guilds.db").stat().st_mode) == 0o600


async def test_every_escaped_form_of_a_secret_comes_back_redacted(tmp_path):
    from fixtures import secret_forms

    command = f"python3 {shlex.quote(secret_forms.__file__)} DEPLOY_KEY"
    async with stdio_client(tmp_path, secrets={"DEPLOY_KEY": secret_forms.SECRET}) as client:
        result = await client.call_tool("shell", {"command": command})
    assert not result.is_error
    assert kit.text_of(result).splitlines() == [*secret_forms.redacted_lines(), "remaining_tool_calls: 199"]


async def test_a_session_is_one_run_with_progress_and_the_live_coding_flag(tmp_path):
    (tmp_path / "home" / "sub").mkdir(parents=True)
    async with stdio_client(tmp_path) as client:
        first = await client.call_tool("shell", {"command": "cd sub"})
        second = await client.call_tool("shell", {"command": "pwd"})
        await kit.check_progress(client)
        kit.write_settings(tmp_path, coding=False)
        assert (await client.list_tools()).tools == []
        refused = await client.call_tool("shell", {"command": "true"})
    assert kit.text_of(second).startswith(str(tmp_path / "home" / "sub"))
    assert kit.meta_of(first)["run"] == kit.meta_of(second)["run"]
    assert refused.is_error and "coding" in kit.text_of(refused)


@pytest.mark.slow
async def test_a_2025_protocol_client_is_another_session(tmp_path):
    """Clients of the handshake era (Claude Desktop, Cursor, ...) get the same tools; a new session, a new run."""
    async with stdio_client(tmp_path) as client:
        first = await client.call_tool("shell", {"command": "true"})
    async with stdio_client(tmp_path, mode="legacy") as client:
        await kit.check_tool_list(client)
        result = await client.call_tool("shell", {"command": "echo legacy"})
    assert kit.text_of(result).startswith("legacy")
    assert kit.meta_of(result)["run"] != kit.meta_of(first)["run"]


@pytest.mark.parametrize("sandbox", [
    "local",
    pytest.param("bwrap", marks=[pytest.mark.bwrap, pytest.mark.slow,
                                 pytest.mark.skipif(unavailable() is not None, reason=f"bwrap: {unavailable()}")]),
])
async def test_cancel_kills_the_command_and_is_recorded(tmp_path, sandbox):
    async with stdio_client(tmp_path, sandbox) as client:
        arg = await kit.cancel_sleep(client)
        assert not await kit.left_running(arg)
        after = await client.call_tool("shell", {"command": "echo still serving"})
    assert kit.text_of(after).startswith("still serving")
    calls = await recorded_calls(tmp_path, kit.meta_of(after)["run"])
    assert calls[0].status == "cancelled" and calls[0].is_error
    assert calls[1].status == "done"


@pytest.mark.parametrize("leave", ["close stdin", pytest.param("SIGTERM", marks=pytest.mark.slow),
                                   pytest.param("SIGINT", marks=pytest.mark.slow),
                                   pytest.param("SIGHUP", marks=pytest.mark.slow), "SIGKILL"])
async def test_a_client_gone_mid_call_leaves_nothing_running(tmp_path, leave):
    """A raw 2025-protocol client (no courtesy cancel) starts a long command, then goes away
    (or the server is stopped by a signal; killed, it leaves its call ``lost``)."""
    command, arg = kit.sleep_command()
    params = server_params(tmp_path)
    proc = await asyncio.create_subprocess_exec(params.command, *params.args, env=params.env,
                                                stdin=PIPE, stdout=PIPE, stderr=DEVNULL)
    try:
        for message in handshake_and_call(f"trap '' TERM; {command}"):
            proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        assert await kit.wait_for(lambda: kit.processes("sleep", arg), kit.START_SECONDS)
        if leave.startswith("SIG"):
            proc.send_signal(getattr(signal, leave))
        else:
            proc.stdin.close()
        ended = -getattr(signal, leave) if leave.startswith("SIG") else 0  # the calls stopped, the signal ends it
        assert await asyncio.wait_for(proc.wait(), 2 * kit.SETTLE_SECONDS) == ended
    finally:
        if proc.returncode is None:
            proc.kill()
    assert not await kit.left_running(arg)
    async with Store(f"sqlite:///{tmp_path / 'data' / 'guilds.db'}") as store:
        (run,) = await store.list_runs()
        (call,) = await store.calls(run.id)
    assert call.status == ("lost" if leave == "SIGKILL" else "cancelled") and run.id.startswith("mcp-")


def handshake_and_call(command: str) -> list[dict]:
    return [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "shell", "arguments": {"command": command}}},
    ]


async def test_a_run_handle_continues_a_run_of_an_earlier_process(tmp_path):
    """The process is the run of its connection; a later `guilds mcp` that names it as the
    ``run`` argument continues it (the cd carries over), and one that names none starts anew."""
    (tmp_path / "home" / "sub").mkdir(parents=True)
    async with stdio_client(tmp_path) as client:
        first = await client.call_tool("shell", {"command": "cd sub"})
    run = kit.meta_of(first)["run"]
    # stdio: the connection already has its run; the text is the page's, without a run line
    assert kit.text_of(first) == "(no output)\n[working directory now: ~/sub]\nremaining_tool_calls: 199"
    assert first.structured_content is None
    async with stdio_client(tmp_path) as client:
        named = await client.call_tool("shell", {"command": "pwd", "run": run})
        fresh = await client.call_tool("shell", {"command": "pwd"})
    assert kit.meta_of(named)["run"] == run and kit.text_of(named).startswith(str(tmp_path / "home" / "sub"))
    assert kit.meta_of(fresh)["run"] != run


async def test_raw_requests_of_the_current_revision_and_a_task(tmp_path):
    """No handshake: each line a self-contained 2026-07-28 request; a background command
    as a task (stdio has no routing headers), followed with tasks/get to its end."""
    from mcp_raw import envelope

    params = server_params(tmp_path)
    proc = await asyncio.create_subprocess_exec(params.command, *params.args, env=params.env,
                                                stdin=PIPE, stdout=PIPE, stderr=DEVNULL)

    async def ask(message: dict) -> dict:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        while True:
            answer = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
            if answer.get("id") == message["id"]:
                return answer

    try:
        plain = await ask(envelope("tools/call", {"name": "shell", "arguments": {"command": "echo raw"}}))
        assert plain["result"]["content"][0]["text"].startswith("raw\n")
        assert plain["result"]["_meta"][kit.META_KEY]["run"].startswith("mcp-")
        created = (await ask(envelope("tools/call", {"name": "shell", "arguments": {
            "command": "sleep 1; echo bye", "background": True}}, tasks=True, request_id=2)))["result"]
        assert created["resultType"] == "task"
        for attempt in range(100):
            got = await ask(envelope("tasks/get", {"taskId": created["taskId"]}, tasks=True, request_id=3 + attempt))
            if got["result"]["status"] != "working":
                break
            await asyncio.sleep(0.2)
        assert got["result"]["status"] == "completed" and "bye" in got["result"]["result"]["content"][0]["text"]
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)
