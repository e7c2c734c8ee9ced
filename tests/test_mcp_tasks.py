"""Tasks (io.modelcontextprotocol/tasks) on `/mcp`: raw 2026-07-28 requests and the SDK's
client in its modern mode against a real server on a loopback port, real bash, real SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict

import mcp_kit as kit
from guilds import limits
from guilds.fronts.mcp_server import META_KEY, streamable_http_app
from guilds.toolbox import Toolbox
from guilds.web.endpoint_lock import EndpointLock, Lock, host_names
from mcp_raw import TASKS, RawClient
from test_mcp_http import serving, toolbox, url  # noqa: F401 - toolbox and url: fixtures
from test_toolbox_code_task import fake_path  # noqa: F401 - a fixture

TOKEN_A = "a" * 43
TOKEN_B = "b" * 43


async def until_status(client: RawClient, task_id: str, wanted: set[str], timeout: float = 30) -> dict:
    """Poll tasks/get until the task's status is one of wanted; the task."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        answer = await client.task("tasks/get", task_id)
        task = answer["result"]
        if task["status"] in wanted or asyncio.get_running_loop().time() > deadline:
            return task
        await asyncio.sleep(0.3)


async def test_a_background_command_is_a_task_followed_to_its_end(url, toolbox):
    raw = RawClient(url)
    created = await raw.call("shell", {"command": "echo first-line; sleep 3; echo last-line", "background": True})
    assert created["resultType"] == "task" and created["status"] == "working"
    run = created["_meta"][META_KEY]["run"]  # the server chose it: the text starts with the run line
    assert created["statusMessage"].startswith(kit.run_line(run) + "started b1 in the background")
    assert created["ttlMs"] is None and created["pollIntervalMs"] == 2000
    working = await raw.task("tasks/get", created["taskId"])
    assert working["result"]["resultType"] == "complete" and working["result"]["status"] == "working"
    assert "b1 running" in working["result"]["statusMessage"]
    done = await until_status(raw, created["taskId"], {"completed"})
    assert done["status"] == "completed", done
    result = done["result"]
    assert result["isError"] is False and "last-line" in result["content"][0]["text"]
    assert result["_meta"][META_KEY]["state"] == "exited 0" and result["_meta"][META_KEY]["run"] == run
    again = await raw.task("tasks/get", created["taskId"])
    assert again["result"]["result"] == result  # kept: the record answers, not the sandbox
    assert [c.tool for c in await toolbox.store.calls(run)] == ["shell"]  # polling records no call


async def test_cancel_stops_the_commands_group(url):
    raw = RawClient(url)
    command, arg = kit.sleep_command()
    created = await raw.call("shell", {"command": f"{command} & {command}; wait", "background": True})
    assert await kit.wait_for(lambda: len(kit.processes("sleep", arg)) == 2, 20)
    ack = await raw.task("tasks/cancel", created["taskId"])
    assert ack["result"] == {"resultType": "complete", "_meta": ack["result"]["_meta"]}
    assert not await kit.left_running(arg)
    task = (await raw.task("tasks/get", created["taskId"]))["result"]
    assert task["status"] == "cancelled" and task["statusMessage"].startswith("cancelled at the client's request")
    assert "result" not in task


async def test_a_client_without_the_extension_gets_plain_results(url):
    """No tasks capability on the request: the call answers as ever; tasks/* is refused (-32021)."""
    plain = RawClient(url, tasks=False)
    started = await plain.call("shell", {"command": "sleep 1", "background": True})
    assert started["resultType"] == "complete" and "\nstarted b" in started["content"][0]["text"]
    task_id = (await RawClient(url).call("shell", {"command": "true", "background": True}))["taskId"]
    refused = await plain.task("tasks/get", task_id)
    assert refused["error"]["code"] == -32021
    assert refused["error"]["data"]["requiredCapabilities"]["extensions"] == {TASKS: {}}
    unknown = await RawClient(url).task("tasks/get", "task-nope")
    assert unknown["error"] == {"code": -32602, "message": "Failed to retrieve task: Task not found"}
    misrouted = await RawClient(url).post("tasks/get", {"taskId": task_id}, name="task-other")
    assert misrouted["error"]["code"] == -32020 and "mcp-name" in misrouted["error"]["message"]
    unnamed = await RawClient(url).post("tasks/get", {"taskId": task_id})
    assert unnamed["error"]["code"] == -32020
    quick = await RawClient(url).call("shell", {"command": "echo now"})
    assert quick["resultType"] == "complete" and "\nnow\n" in quick["content"][0]["text"]


async def test_a_command_the_sandbox_no_longer_holds_reads_ended(url, tmp_path):
    """A new container (its background records gone): the task completes, its command ended."""
    import shutil

    raw = RawClient(url)
    command, arg = kit.sleep_command()
    created = await raw.call("shell", {"command": command, "background": True})
    shutil.rmtree(tmp_path / "data" / "state" / "agent1" / "background")
    task = (await raw.task("tasks/get", created["taskId"]))["result"]
    for pid in kit.processes("sleep", arg):  # nothing follows it any more
        os.kill(pid, signal.SIGKILL)
    assert task["status"] == "completed"
    assert task["result"]["content"][0]["text"] == (
        "b1 ended: it ran in an earlier sandbox (this sandbox's b1, if any, is another command)")
    assert task["result"]["_meta"][META_KEY] == {"background_id": "b1", "state": "ended", "run": created["_meta"][
        META_KEY]["run"]}
    again = (await raw.task("tasks/get", created["taskId"]))["result"]
    assert (again["status"], again["result"]) == ("completed", task["result"])


async def test_a_cancel_that_cannot_reach_the_sandbox_is_not_reported_cancelled(url, toolbox):
    """The helper cannot run (the sandbox cannot be reached): the command runs on, so the cancel
    is an error and the task stays working; once the sandbox answers again, the cancel stops it."""
    raw = RawClient(url)
    command, arg = kit.sleep_command()
    created = await raw.call("shell", {"command": command, "background": True})
    assert await kit.wait_for(lambda: kit.processes("sleep", arg), 20)
    helper = Path(toolbox.sandbox.helper_path("guilds-code"))
    aside = helper.with_name(helper.name + ".aside")
    helper.rename(aside)
    await toolbox.transport.opened()  # the resident helper, already running, would still answer the polls
    await toolbox.close()
    try:
        refused = await raw.task("tasks/cancel", created["taskId"])
        working = (await raw.task("tasks/get", created["taskId"]))["result"]
    finally:
        aside.rename(helper)
    assert refused["error"]["code"] == -32603
    assert refused["error"]["message"].startswith(
        "not cancelled, the command may still run: the command's state cannot be read now: ")
    assert working["status"] == "working" and kit.processes("sleep", arg)
    assert working["statusMessage"].startswith("the command's state cannot be read now: ")
    assert (await raw.task("tasks/cancel", created["taskId"]))["result"]["resultType"] == "complete"
    assert not await kit.left_running(arg)
    assert (await raw.task("tasks/get", created["taskId"]))["result"]["status"] == "cancelled"


async def test_a_command_that_outlives_its_sigterm_is_cancelled_once_it_is_gone(url):
    """SIGTERM ignored: the stop's SIGKILL comes STOP_KILL_GRACE_SECONDS later, and only then is
    the task reported cancelled."""
    raw = RawClient(url)
    command, arg = kit.sleep_command()
    created = await raw.call("shell", {"command": f"trap '' TERM; {command} & wait", "background": True})
    assert await kit.wait_for(lambda: kit.processes("sleep", arg), 20)
    ack = await raw.task("tasks/cancel", created["taskId"])
    assert ack["result"]["resultType"] == "complete" and not kit.processes("sleep", arg)
    task = (await raw.task("tasks/get", created["taskId"]))["result"]
    assert task["status"] == "cancelled" and task["statusMessage"].startswith(
        "cancelled at the client's request: b1 stopped ")


async def test_update_acknowledges_and_a_known_task_answers_every_method(url):
    raw = RawClient(url)
    task_id = (await raw.call("shell", {"command": "true", "background": True}))["taskId"]
    assert (await raw.task("tasks/update", task_id))["result"]["resultType"] == "complete"
    assert (await raw.task("tasks/update", "task-nope"))["error"]["code"] == -32602
    assert (await raw.task("tasks/cancel", "task-nope"))["error"]["code"] == -32602
    done = await until_status(raw, task_id, {"completed"})
    assert (await raw.task("tasks/cancel", task_id))["result"]["resultType"] == "complete"
    assert (await raw.task("tasks/get", task_id))["result"]["status"] == done["status"] == "completed"


@contextlib.asynccontextmanager
async def locked(toolbox: Toolbox, token: str) -> AsyncIterator[str]:
    lock = Lock(token, host_names("127.0.0.1"))
    async with serving(EndpointLock(streamable_http_app(toolbox), lock)) as endpoint:
        yield endpoint


async def test_another_tokens_task_and_run_are_refused(toolbox):
    async with locked(toolbox, TOKEN_A) as url_a, locked(toolbox, TOKEN_B) as url_b:
        a, b = RawClient(url_a, TOKEN_A), RawClient(url_b, TOKEN_B)
        created = await a.call("shell", {"command": "sleep 2", "background": True})
        assert (await b.task("tasks/get", created["taskId"]))["error"]["code"] == -32602
        assert (await b.task("tasks/cancel", created["taskId"]))["error"]["code"] == -32602
        assert (await a.task("tasks/get", created["taskId"]))["result"]["status"] == "working"
        run = created["_meta"][META_KEY]["run"]
        refused = await b.call("shell", {"command": "echo in", "run": run})
        assert refused["isError"] and refused["content"][0]["text"] == (
            f"run {run!r} was started with another token; omit run to start a new one")
        mine = await b.call("shell", {"command": "echo mine"})
        assert mine["_meta"][META_KEY]["run"] != run and mine["content"][0]["text"] == (
            kit.run_line(mine["_meta"][META_KEY]["run"]) + "mine\nremaining_tool_calls: 199")
        assert (await a.call("shell", {"command": "true", "run": run}))["isError"] is False


# --- the SDK's client in its modern mode ------------------------------------------------
class TaskCreated(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class TaskState(types.Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    result: dict[str, Any] | None = None


class GetTask(types.GetTaskRequest):
    """tasks/get as the extension sends it: its task id in the Mcp-Name header too."""

    name_param = "taskId"


class TasksClient(ClientExtension):
    """The client side of the extension: a task answer is polled with tasks/get to its result."""

    identifier = TASKS

    def __init__(self) -> None:
        self.seen: list[str] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self.resolve)]

    async def resolve(self, created: TaskCreated, ctx: ClaimContext) -> types.CallToolResult:
        while True:
            request = GetTask(params=types.GetTaskRequestParams(task_id=created.task_id))
            state = await ctx.session.send_request(request, TaskState)
            self.seen.append(state.status)
            if state.status == "completed":
                return types.CallToolResult.model_validate(state.result)
            await asyncio.sleep(0.3)


async def test_the_sdk_client_in_modern_mode_gets_a_tasks_result(url):
    tasks = TasksClient()
    async with Client(url, mode="2026-07-28", extensions=[tasks], read_timeout_seconds=60) as c:
        result = await c.call_tool("shell", {"command": "sleep 1.5; echo from-a-task", "background": True})
        plain = await c.call_tool("shell", {"command": "echo direct"})
    assert "from-a-task" in kit.text_of(result) and kit.meta_of(result)["state"] == "exited 0"
    assert tasks.seen[0] == "working" and tasks.seen[-1] == "completed"
    assert kit.page_text(plain).startswith("direct")


# --- code_task as a task ----------------------------------------------------------------
@pytest.fixture
async def coding_toolbox(tmp_path, fake_path) -> AsyncIterator[Toolbox]:
    from guilds.record.store import Store
    from guilds.sandbox.local import LocalSandbox
    from toolbox_kit import make_settings

    repo = tmp_path / "home" / "repos" / "web"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    settings = make_settings(tmp_path, repos={"web": {"path": "repos/web"}})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        box = Toolbox(settings, LocalSandbox(settings, tmp_path / "data", path=fake_path), store)
        yield box
        await box.close()


async def test_a_long_code_task_is_a_task_that_outlives_its_request(coding_toolbox, monkeypatch):
    async with serving(streamable_http_app(coding_toolbox)) as url:
        raw = RawClient(url)
        monkeypatch.setattr(limits, "MCP_TASK_AFTER_SECONDS", kit.START_SECONDS)  # quick even on a loaded machine
        quick = await raw.call("code_task", {"brief": "fake: say at once"})
        assert quick["resultType"] == "complete" and "at once" in quick["content"][0]["text"]
        monkeypatch.setattr(limits, "MCP_TASK_AFTER_SECONDS", 1.0)
        created = await raw.call("code_task", {"brief": "fake: sleep 4\nfake: say slow done"})
        assert created["resultType"] == "task" and created["_meta"][META_KEY]["run"].startswith("mcp-")
        working = (await raw.task("tasks/get", created["taskId"]))["result"]
        assert working["status"] == "working" and working["statusMessage"].startswith("code_task: running for")
        done = await until_status(raw, created["taskId"], {"completed"})
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert "slow done" in done["result"]["content"][0]["text"]
    run = done["result"]["_meta"][META_KEY]["run"]
    assert [c.status for c in await coding_toolbox.store.calls(run)] == ["done", "done"]


async def test_cancelling_a_code_task_stops_the_harness_and_records_it(coding_toolbox):
    async with serving(streamable_http_app(coding_toolbox)) as url:
        raw = RawClient(url)
        created = await raw.call("code_task", {"brief": "fake: sleep 300.424242\nfake: say never"})
        assert created["resultType"] == "task"
        assert await kit.wait_for(lambda: _with_marker("300.424242"), kit.START_SECONDS)
        assert (await raw.task("tasks/cancel", created["taskId"]))["result"]["resultType"] == "complete"
        task = await until_status(raw, created["taskId"], {"cancelled"})
    assert task["status"] == "cancelled"
    (run,) = await coding_toolbox.store.list_runs()
    (call,) = await kit.settled_calls(coding_toolbox.store, run.id)
    assert call.status == "cancelled" and call.tool == "code_task"
    assert await kit.wait_for(lambda: not _with_marker("300.424242"), kit.SETTLE_SECONDS)


def _with_marker(marker: str) -> list[str]:
    """Pids of live processes whose command line holds marker (the fake harness, its prompt)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and pid != str(os.getpid()):
                found.append(pid)
    return found


# --- a real `guilds serve`, killed and started again ------------------------------------
def _serve(tmp_path: Path, fake_path: str) -> tuple[subprocess.Popen, str]:
    """`guilds serve --no-token` on a free port, the fake harness on its PATH; (process, /mcp's URL)."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nhome = "{tmp_path / "home"}"\nsandbox = "local"\n\n'
                      '[repos.web]\npath = "repos/web"\n')
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data"), "PATH": fake_path}
    env.pop("GUILDS_DATABASE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--no-token",
                             "--config", str(config)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if found := re.search(r"MCP at (http://\S+/mcp)", line):
            return proc, found.group(1)
    proc.kill()
    raise AssertionError("guilds serve did not start")


@pytest.mark.parametrize("stop", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
async def test_a_restart_reports_a_running_task_lost_and_keeps_following_a_command(tmp_path, fake_path, stop):
    repo = tmp_path / "home" / "repos" / "web"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    proc, url = _serve(tmp_path, fake_path)
    try:
        raw = RawClient(url)
        command = (await raw.call("shell", {"command": "sleep 4; echo outlived", "background": True}))["taskId"]
        task = await raw.call("code_task", {"brief": "fake: sleep 300.6161\nfake: say never"})
        assert task["resultType"] == "task" and _with_marker("300.6161")
    finally:
        proc.send_signal(stop)
        proc.wait(30)
        proc.stderr.close()
    assert await kit.wait_for(lambda: not _with_marker("300.6161"), kit.SETTLE_SECONDS)  # its harness went with it
    proc, url = _serve(tmp_path, fake_path)
    try:
        raw = RawClient(url)
        lost = (await raw.task("tasks/get", task["taskId"]))["result"]
        followed = await until_status(raw, command, {"completed"})
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stderr.close()
    assert lost["status"] == "failed" and lost["statusMessage"].startswith("lost: the process running this call")
    assert lost["error"]["code"] == -32603
    assert followed["status"] == "completed" and "outlived" in followed["result"]["content"][0]["text"]


async def test_tasks_are_read_and_cancelled_through_another_server_on_the_record(tmp_path, fake_path):
    """Two servers on one run record (replicas): a code_task task and a command's task started
    through the first are read through the second, and its tasks/cancel stops both: the command's
    group at once, the call by the first server, which reads the ask from the record."""
    repo = tmp_path / "home" / "repos" / "web"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    first, first_url = _serve(tmp_path, fake_path)
    second, second_url = _serve(tmp_path, fake_path)
    try:
        starter, other = RawClient(first_url), RawClient(second_url)
        task = await starter.call("code_task", {"brief": "fake: sleep 300.7272\nfake: say never"})
        command = await starter.call("shell", {"command": "sleep 300.7373", "background": True})
        assert task["resultType"] == "task" and command["resultType"] == "task"
        assert await kit.wait_for(lambda: _with_marker("300.7272") and _with_marker("300.7373"), kit.START_SECONDS)
        working = (await other.task("tasks/get", task["taskId"]))["result"]
        assert working["status"] == "working" and working["statusMessage"].startswith("code_task: running for")
        for each in (task, command):
            assert (await other.task("tasks/cancel", each["taskId"]))["result"]["resultType"] == "complete"
        cancelled = [await until_status(other, each["taskId"], {"cancelled"}) for each in (task, command)]
        assert [c["status"] for c in cancelled] == ["cancelled", "cancelled"]
        assert await kit.wait_for(lambda: not _with_marker("300.7272") and not _with_marker("300.7373"),
                                  kit.SETTLE_SECONDS)
        assert (await starter.task("tasks/get", task["taskId"]))["result"]["status"] == "cancelled"
    finally:
        for proc in (first, second):
            proc.terminate()
            proc.wait(20)
            proc.stderr.close()
