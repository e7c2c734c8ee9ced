"""What the MCP tests share: the checks a real client's view must pass over
any transport, and /proc probes for the commands a cancel must stop."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from guilds.fronts.mcp_server import META_KEY
from guilds.toolbox import export, tool_specs
from guilds.toolbox.tools import tool_named

SETTLE_SECONDS = 10.0
START_SECONDS = 60.0
"""The longest a server's start and first call may take on a loaded machine (a wait ends as soon as it is done)."""
"""How long a cancelled command may take to be gone: the helper's 1 s grace, the
spawn path's 2 s, with room for a machine under load (a passing test waits less)."""


def write_settings(folder: Path, *, sandbox: str = "local", coding: bool = True,
                   secrets: dict[str, str] | None = None) -> Path:
    """A settings file for a stdio server: home under folder, the given sandbox and secrets."""
    path = folder / "settings.toml"
    path.write_text(
        f'[agent]\nid = "agent1"\nhome = "{folder / "home"}"\nsandbox = "{sandbox}"\n'
        f"coding = {'true' if coding else 'false'}\n"
        + "".join(f'[secrets]\n{name} = "{value}"\n' for name, value in (secrets or {}).items())
    )
    path.chmod(0o600)  # a settings file with secrets others may read is refused
    return path


def sleep_command() -> tuple[str, str]:
    """A `sleep` no other test shares: (command, its argument), to find it in /proc."""
    arg = f"300.{random.randrange(10**6):06d}"
    return f"sleep {arg}", arg


def processes(argv0: str, arg: str) -> list[int]:
    """Pids of live processes whose argv is exactly [argv0, arg]."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[:-1]
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X") and [a.decode(errors="replace") for a in argv] == [argv0, arg]:
            found.append(int(name))
    return found


async def wait_for(predicate: Any, timeout: float) -> bool:
    """Poll predicate() until it is true or timeout passes."""
    with anyio.move_on_after(timeout):
        while not predicate():
            await asyncio.sleep(0.05)
        return True
    return False


async def left_running(arg: str) -> list[int]:
    """Wait up to SETTLE_SECONDS for the sleep with this argument to end; the pids still running."""
    await wait_for(lambda: not processes("sleep", arg), SETTLE_SECONDS)
    return processes("sleep", arg)


async def settled_calls(store: Any, run_id: str, timeout: float = SETTLE_SECONDS) -> list:
    """The run's calls, once none is still running (a cancelled call records itself as it stops)."""
    calls = await store.calls(run_id)
    with anyio.move_on_after(timeout):
        while not calls or any(c.status == "running" for c in calls):
            await asyncio.sleep(0.05)
            calls = await store.calls(run_id)
    return calls


def run_line(run_id: str) -> str:
    """The first line of a result whose run the server chose, as docs/mcp.md gives it, with its newline."""
    return f'run: {run_id} (pass it back as "run" to continue this run)\n'


def page_text(result: Any) -> str:
    """The text without the run line a result of a run the server chose starts with."""
    return text_of(result).removeprefix(run_line(meta_of(result)["run"]))


def meta_of(result: Any) -> dict:
    return (result.meta or {})[META_KEY]


def text_of(result: Any) -> str:
    (block,) = result.content
    return block.text


async def check_tool_list(client: Client) -> None:
    """The five tools with the toolbox's exact schemas (and the optional ``run`` handle),
    descriptions and truthful annotations."""
    listed = (await client.list_tools()).tools
    expected = export(tool_specs(), "mcp")
    assert [t.name for t in listed] == [e["name"] for e in expected]
    for tool, want in zip(listed, expected, strict=True):
        run = tool.input_schema["properties"]["run"]
        assert tool.input_schema == want["inputSchema"]
        assert run["type"] == "string" and "run" not in tool.input_schema["required"]
        assert tool.description == want["description"]
        hints = tool_named(tool.name).hints
        assert tool.annotations.read_only_hint is hints.read_only
        assert tool.annotations.idempotent_hint is hints.idempotent
        assert tool.annotations.destructive_hint is hints.destructive
    by_name = {t.name: t.annotations for t in listed}
    for name in ("file_read", "code_search"):
        assert by_name[name].read_only_hint and by_name[name].idempotent_hint
    for name in ("shell", "code_task", "shell_status"):
        assert by_name[name].read_only_hint is False
    assert by_name["shell"].idempotent_hint is False and by_name["code_task"].idempotent_hint is False


async def check_each_tool(client: Client, home: Path, **call: Any) -> str:
    """Call every tool once (call: extra keywords for call_tool); return the run id they shared."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "notes.txt").write_text("alpha\nbeta needle\ngamma\n")
    shell = await client.call_tool("shell", {"command": "echo hi"}, **call)
    assert not shell.is_error and text_of(shell).startswith("hi\n")
    assert meta_of(shell)["exit_code"] == 0 and meta_of(shell)["row"] == "Run echo hi"
    read = await client.call_tool("file_read", {"path": "notes.txt"}, **call)
    assert not read.is_error and "beta needle" in text_of(read)
    assert meta_of(read)["range"] == [1, 3]
    search = await client.call_tool("code_search", {"pattern": "needle"}, **call)
    assert not search.is_error and "notes.txt" in text_of(search)
    status = await client.call_tool("shell_status", {}, **call)
    assert not status.is_error
    task = await client.call_tool("code_task", {"brief": "add a test"}, **call)
    assert meta_of(task)["tool"] == "code_task"  # an error here: the agent has no repository
    runs = {meta_of(r)["run"] for r in (shell, read, search, status, task)}
    assert len(runs) == 1
    seqs = [meta_of(r)["seq"] for r in (shell, read, search, status, task)]
    assert seqs == sorted(seqs)
    return runs.pop()


async def check_bad_calls(client: Client, **call: Any) -> None:
    """Bad arguments and an unknown tool come back as error results naming what was wrong."""
    typo = await client.call_tool("shell", {"comand": "ls"}, **call)
    assert typo.is_error and "comand" in text_of(typo)
    wrong = await client.call_tool("file_read", {"path": "x", "limit": "ten"}, **call)
    assert wrong.is_error and "limit" in text_of(wrong)
    missing = await client.call_tool("code_search", {}, **call)
    assert missing.is_error and "pattern" in text_of(missing)
    unknown = await client.call_tool("rm_rf", {}, **call)
    assert unknown.is_error and "rm_rf" in text_of(unknown)
    assert (await client.call_tool("shell", {"command": "true"}, **call)).is_error is False


async def check_progress(client: Client, **call: Any) -> None:
    """A command running 2.5 s reports its elapsed seconds at least twice."""
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    result = await client.call_tool("shell", {"command": "sleep 2.5; echo done"},
                                    progress_callback=on_progress, **call)
    assert page_text(result).startswith("done")
    assert len(seen) >= 2 and [p for p, _ in seen] == sorted(p for p, _ in seen)
    assert seen[0][1] == "shell: running for 1 s"


async def cancel_sleep(client: Client, **call: Any) -> str:
    """Start a long sleep that ignores SIGTERM, cancel the call after 1.5 s; return the sleep's argument."""
    command, arg = sleep_command()
    with anyio.move_on_after(1.5):
        await client.call_tool("shell", {"command": f"trap '' TERM; {command}"}, **call)
        raise AssertionError("the call was not cancelled")
    return arg
