"""The real Claude Code (the ``claude`` of the claude-agent-sdk wheel) connected to ``/mcp``
over HTTP with the token, as a user adds it, its model a scripted Messages API on loopback
(tests/fixtures/scripted_anthropic.py). It speaks the 2026-07-28 revision: its first call
goes to a run the server chose, and the model must read that run in the tool result and
continue it by passing ``run``.

``ENABLE_TOOL_SEARCH=false``: without it Claude Code offers MCP tools to the model only
through its tool search, which a scripted model does not drive.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import mcp_kit as kit
from fixtures.scripted_anthropic import QUIET_CLAUDE, ScriptedToolCalls, Step, bundled_claude, tool_results
from guilds.fronts.mcp_server import streamable_http_app
from guilds.toolbox import Toolbox
from guilds.web.endpoint_lock import EndpointLock, Lock, host_names
from test_mcp_http import serving
from toolbox_kit import local_toolbox

TOKEN = "t" * 43
PREFIX = "mcp__guilds__"
CLAUDE_SECONDS = 180
RUN_LINE = re.compile(r'\Arun: (mcp-[0-9a-f]{32}) \(pass it back as "run" to continue this run\)\n')

CLAUDE = bundled_claude()
pytestmark = pytest.mark.skipif(CLAUDE is None, reason="claude-agent-sdk (with its bundled claude) is not installed")


def run_of(text: str) -> str:
    """The run a result's run line names ("no-run-line" when it has none: the server refuses that)."""
    found = RUN_LINE.match(text)
    return found.group(1) if found else "no-run-line"


PREVIEW_RUN_LINE = re.compile(r'"text": "run: (mcp-[0-9a-f]{32}) \(pass it back as \\"run\\" to continue this run\)\\n')
"""The run line starting the first text block of a long result's preview (its content, as JSON)."""


def run_in_preview(text: str) -> str:
    """The run a preview of a long result names, as a model reads it ("no-run-line": none)."""
    found = PREVIEW_RUN_LINE.search(text[:2500])
    return found.group(1) if found else "no-run-line"


async def run_claude(servers: dict | list[str], steps: list[Step], folder: Path
                     ) -> tuple[list[dict], ScriptedToolCalls]:
    """claude -p with a model scripted by steps: its stream-json events and the scripted API
    (its ``requests``), once it ended well. servers: the MCP servers as ``--mcp-config`` takes
    them, or the arguments of a ``claude mcp add`` made first (as a user adds a server)."""
    api = ScriptedToolCalls(PREFIX, steps)
    home = folder / "claude-home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
           "ANTHROPIC_BASE_URL": api.url, "ENABLE_TOOL_SEARCH": "false", **QUIET_CLAUDE}
    if isinstance(servers, list):
        added = await asyncio.create_subprocess_exec(str(CLAUDE), "mcp", "add", *servers, cwd=home, env=env,
                                                     stdout=asyncio.subprocess.DEVNULL)
        assert await asyncio.wait_for(added.wait(), CLAUDE_SECONDS) == 0
        config: list[str] = []
    else:
        config = ["--mcp-config", json.dumps({"mcpServers": servers}), "--strict-mcp-config"]
    try:
        proc = await asyncio.create_subprocess_exec(
            str(CLAUDE), "-p", "Look around the project.", *config, "--allowedTools", PREFIX.rstrip("_"),
            "--output-format", "stream-json", "--verbose", "--model", "claude-sonnet-4-5", "--no-session-persistence",
            cwd=home, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), CLAUDE_SECONDS)
    finally:
        api.close()
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and events[-1].get("subtype") == "success", (out[-2000:], err[-2000:])
    return events, api


async def claude_through(url: str, steps: list[Step], folder: Path) -> list[str]:
    """Run claude -p with guilds over HTTP and a model scripted by steps; the tool results it sent."""
    servers = {"guilds": {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}}
    events, api = await run_claude(servers, steps, folder)
    assert {"name": "guilds", "status": "connected"}.items() <= events[0]["mcp_servers"][0].items()
    conversation = [body for body in api.requests if any(
        t.get("name", "").startswith(PREFIX) for t in body.get("tools") or [])]
    return tool_results(conversation[-1])


@pytest.fixture
async def locked_url(tmp_path) -> AsyncIterator[tuple[str, Toolbox]]:
    """/mcp behind the endpoint lock with TOKEN; the home holds sub/n.txt and big.txt."""
    (tmp_path / "home" / "sub").mkdir(parents=True)
    (tmp_path / "home" / "sub" / "n.txt").write_text("one\ntwo\n")
    (tmp_path / "home" / "big.txt").write_text("".join(f"{n:04d} " + "x" * 380 + "\n" for n in range(600)))
    async with local_toolbox(tmp_path, agent={"result_max_bytes": 65536}) as box:
        app = EndpointLock(streamable_http_app(box), Lock(TOKEN, host_names("127.0.0.1")))
        async with serving(app) as url:
            yield url, box


async def test_the_model_reads_the_output_and_the_run_and_continues_it(locked_url, tmp_path):
    """The first shell call's result holds the command's output (not a structuredContent
    in its place) and the run line; passing that run keeps the cd and the read pointers."""
    url, box = locked_url
    sub = tmp_path / "home" / "sub"
    steps: list[Step] = [
        lambda seen: ("shell", {"command": "cd sub && pwd"}),
        lambda seen: ("file_read", {"path": "n.txt", "run": run_of(seen[0])}),
        lambda seen: ("file_read", {"path": "n.txt", "run": run_of(seen[0])}),
        lambda seen: ("shell", {"command": "pwd", "run": run_of(seen[0])}),
    ]
    first, read, again, pwd = await claude_through(url, steps, tmp_path)
    run = run_of(first)
    assert first.startswith(kit.run_line(run) + f"{sub}\n[working directory now: ~/sub]\nremaining_tool_calls: 199")
    assert read.startswith("n.txt lines 1–2 of 2\n1  one\n2  two\nremaining_tool_calls: 198")  # read in sub/
    assert again.startswith("n.txt lines 1–2: unchanged since step 2; read that result.\nremaining_tool_calls: 197")
    assert pwd.startswith(f"{sub}\nremaining_tool_calls: 196")  # the client named the run: no run line
    calls = await box.store.calls(run)
    assert [(c.seq, c.tool) for c in calls] == [(1, "shell"), (2, "file_read"), (3, "file_read"), (4, "shell")]


async def test_a_result_past_claude_codes_preview_size_still_shows_the_run(locked_url, tmp_path):
    """A result near the 64 KiB cap: Claude Code keeps a long result in a file and shows the
    model its start; the run line, first, is in what the model reads."""
    url, _ = locked_url
    steps: list[Step] = [
        lambda seen: ("file_read", {"path": "big.txt", "limit": 500}),
        lambda seen: ("shell", {"command": "pwd", "run": run_in_preview(seen[0])}),
    ]
    big, pwd = await claude_through(url, steps, tmp_path)
    assert big.startswith("<persisted-output>") and "Preview (first 2KB)" in big, big[:500]
    assert run_in_preview(big).startswith("mcp-"), big[:2500]
    assert pwd.startswith(f"{tmp_path / 'home'}\nremaining_tool_calls: 198")
