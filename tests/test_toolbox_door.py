"""The one door to the helper: ``Toolbox.request`` builds what the helper's parser reads,
``Toolbox.send`` takes every request (tool calls, the app's log reads, the MCP tasks'
polls) through the agent's transport, and maps the failures once, to NoAnswer."""

from __future__ import annotations

from guilds.errors import NoAnswer, SandboxError
from guilds.record.store import Store
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox import Toolbox
from guilds.toolbox.background_read import background_state
from guilds.toolbox.log_reading import read_log
from guilds.toolbox.tools import CODE_TASK, FILE_READ, SHELL_STATUS
from guilds_code.protocol import parse_request
from guilds_harness import request as harness_request
from test_toolbox import fake_store  # noqa: F401 - a fixture
from toolbox_kit import FakeSandbox, local_toolbox, make_settings, ok


async def test_the_request_is_what_the_helpers_parser_reads_back(tmp_path):
    async with local_toolbox(tmp_path, secrets={"ZED": "z-secret"}) as box:
        read = box.request(FILE_READ.name, {"path": "a"}, run_id="r1", call_id="c1", seq=3, max_bytes=2048,
                           reads=[{"path": "/x", "range": [1, 2], "content_hash": "h", "seq": 1}])
        status = box.request(SHELL_STATUS.name, {"id": "b1"}, run_id="r1", call_id="c2", started_by="c1")
        task = box.request(CODE_TASK.name, {"brief": "b"}, run_id="r1", call_id="c3", kind=CODE_TASK.request_type,
                           harness="codex", repos={"web": "/home/web"})
    for wire, parse in ((read, parse_request), (status, parse_request), (task, harness_request.parse_request)):
        parsed = parse(wire)
        assert {name: getattr(parsed, name) for name in wire} == {**wire, "args": parsed.args}
    assert read["redact_env"] == ["ZED"] and read["home"] == read["cwd"] == str(tmp_path / "home")
    assert "reads" not in status and "started_by" not in read and "reads" not in task


class CountingSandbox(LocalSandbox):
    """The local sandbox, counting the helper processes it runs one per request."""

    execs = 0

    async def exec(self, argv, **kw):
        self.execs += 1
        return await super().exec(argv, **kw)


async def test_log_reads_and_task_polls_ride_the_resident_channel(tmp_path):
    settings = make_settings(tmp_path, agent={"transport": "resident"})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        sandbox = CountingSandbox(settings, tmp_path / "data")
        toolbox = Toolbox(settings, sandbox, store)
        try:
            started = await toolbox.call("run1", "shell", {"command": "sleep 30", "background": True})
            log = started.meta["log_path"]
            state = await background_state(toolbox, "run1", "b1", started.meta["call"])
            assert state["ok"] and state["meta"]["state"] == "running"
            assert (await read_log(toolbox, log))["ok"]
            stopped = await background_state(toolbox, "run1", "b1", started.meta["call"], stop=True)
            assert stopped["meta"]["state"] == "stopped"
            assert sandbox.execs == 0 and toolbox.transport.channel is not None
        finally:
            await toolbox.close()


async def test_a_failure_to_reach_the_sandbox_is_mapped_once(tmp_path, fake_store):  # noqa: F811
    def unreachable(request):
        raise SandboxError("the container is gone")

    toolbox = Toolbox(make_settings(tmp_path), FakeSandbox(unreachable), fake_store)
    request = toolbox.request(SHELL_STATUS.name, {}, run_id="r1", call_id="c1")
    try:
        await toolbox.send(request, wait=5)
    except NoAnswer as exc:
        assert (str(exc), exc.reason) == ("sandbox error: the container is gone", "the container is gone")
    else:
        raise AssertionError("no NoAnswer")
    unread = await read_log(toolbox, "/x.log")
    assert unread == {"ok": False, "error": "The log cannot be read: the container is gone"}
    result = await toolbox.call("r1", "file_read", {"path": "a"})
    assert result.is_error and result.text.startswith("sandbox error: the container is gone\n")
    assert (await Toolbox(make_settings(tmp_path), FakeSandbox(lambda r: ok("x")), fake_store).send(
        request, wait=5)) == {"ok": True, "text": "x", "meta": {}}
