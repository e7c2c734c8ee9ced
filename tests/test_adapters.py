"""guilds.open and the adapters, through whole agent loops: the real ``anthropic`` and
``openai`` SDKs against a scripted model service on loopback (tests/fixtures/
scripted_models.py) speaking each API's JSON, the real local sandbox and SQLite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import openai
import pytest

import guilds
from fixtures.scripted_models import ScriptedModels
from guilds.adapters import anthropic as anthropic_adapter
from guilds.adapters import openai as openai_adapter
from guilds.errors import BadInput, ConfigError

README = Path(__file__).parent.parent / "README.md"
WAIT_FOR_FLAG = ("seen=alone; for i in $(seq 400); do [ -e flag ] && seen=saw-flag && break; sleep 0.05; done; "
                 "sleep 1; cd sub; echo $seen")
"""Prints saw-flag only when another call of the same turn makes `flag` while this one waits (20 s);
it ends a second after the other, so its cd is the run's."""
TURNS = [
    [("shell", {"command": WAIT_FOR_FLAG}), ("shell", {"command": "touch flag && echo made"})],
    [("shell", {"command": "pwd; exit 3"}), ("shell", {"comand": "ls"}), ("file_read", {"path": "notes.txt"})],
    "All done.",
]


def settings_file(tmp_path: Path) -> Path:
    (tmp_path / "home" / "sub").mkdir(parents=True)
    (tmp_path / "home" / "sub" / "notes.txt").write_text("alpha\nbeta\n")
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nhome = "home"\nsandbox = "local"\nmax_tool_calls = 50\n')
    return path


@pytest.fixture
def models() -> Iterator[ScriptedModels]:
    server = ScriptedModels(TURNS)
    yield server
    server.close()


@pytest.fixture
async def agent(tmp_path) -> AsyncIterator[guilds.fronts.agent.Agent]:
    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env={}) as opened:
        yield opened


@pytest.fixture
async def openai_client(models) -> AsyncIterator[openai.AsyncOpenAI]:
    """Closed at the test's end: its pooled connections never outlive the test's event loop."""
    async with openai.AsyncOpenAI(base_url=models.url + "/v1", api_key="test-key", max_retries=0) as client:
        yield client


@pytest.fixture
async def anthropic_client(models) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=models.url, api_key="test-key", max_retries=0) as client:
        yield client


async def check_record(agent, run_id: str, tmp_path: Path) -> None:
    calls = await agent.toolbox.store.calls(run_id)
    assert len(calls) == 5 and all(c.status == "done" for c in calls)
    assert sorted(c.tool for c in calls) == ["file_read", "shell", "shell", "shell", "shell"]
    assert (tmp_path / "home" / "sub" / "flag").exists() is False and (tmp_path / "home" / "flag").exists()


def second_turn_texts(sub: Path) -> list[tuple[str, bool]]:
    return [(f"{sub}\nexit_code: 3\nremaining_tool_calls: 47", False),
            ("comand: unknown argument for shell", True), ("alpha\nbeta", False)]


def check_second_turn(texts: list[tuple[str, bool]], sub: Path, with_error_flag: bool) -> None:
    """The three results of turn 2, in order: a cd carried over, a bad argument named, a read."""
    want = second_turn_texts(sub)
    assert texts[0][0].startswith(want[0][0].split("\n")[0]) and "exit_code: 3" in texts[0][0]
    assert texts[1][0].startswith(want[1][0])
    assert "alpha" in texts[2][0] and "beta" in texts[2][0]
    if with_error_flag:
        assert [flag for _, flag in texts] == [False, True, False]


async def test_anthropic_messages_loop(agent, models, anthropic_client, tmp_path):
    client = anthropic_client
    run = agent.run("loop-anthropic")
    messages: list = [{"role": "user", "content": "go"}]
    while True:
        message = await client.messages.create(model="scripted-1", max_tokens=1024,
                                               tools=agent.tools(format="anthropic"), messages=messages)
        messages.append({"role": "assistant", "content": message.content})
        if message.stop_reason != "tool_use":
            break
        messages.append({"role": "user", "content": await anthropic_adapter.tool_results(run, message)})
    assert message.content[0].text == "All done." and len(models.requests) == 3
    first, second = (r["messages"][-1]["content"] for r in models.requests[1:])
    assert [b["tool_use_id"] for b in first] == ["toolu_0_0", "toolu_0_1"]
    assert first[0]["content"].startswith("saw-flag\n") and first[1]["content"].startswith("made\n")
    assert [b["type"] for b in second] == ["tool_result"] * 3
    check_second_turn([(b["content"], b["is_error"]) for b in second], tmp_path / "home" / "sub", True)
    assert [t["name"] for t in models.requests[0]["tools"]][:2] == ["code_task", "shell"]
    await check_record(agent, run.id, tmp_path)


async def test_openai_responses_loop(agent, models, openai_client, tmp_path):
    client = openai_client
    run = agent.run("loop-responses")
    items: list = [{"role": "user", "content": "go"}]
    while True:
        response = await client.responses.create(model="scripted-1", input=items,
                                                 tools=agent.tools(format="openai-responses"))
        outputs = await openai_adapter.responses_outputs(run, response)
        if not outputs:
            break
        items += [item.model_dump(exclude_none=True) for item in response.output] + outputs
    assert response.output_text == "All done." and len(models.requests) == 3
    sent = models.requests[2]["input"]
    outs = [i for i in sent if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outs] == ["call_0_0", "call_0_1", "call_1_0", "call_1_1", "call_1_2"]
    assert outs[0]["output"].startswith("saw-flag\n")
    check_second_turn([(o["output"], False) for o in outs[2:]], tmp_path / "home" / "sub", False)
    assert models.requests[0]["tools"][1]["name"] == "shell" and models.requests[0]["tools"][1]["type"] == "function"
    await check_record(agent, run.id, tmp_path)


async def test_openai_chat_loop(agent, models, openai_client, tmp_path):
    client = openai_client
    run = agent.run("loop-chat")
    messages: list = [{"role": "user", "content": "go"}]
    while True:
        completion = await client.chat.completions.create(model="scripted-1", messages=messages,
                                                          tools=agent.tools(format="openai"))
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        messages += await openai_adapter.chat_messages(run, completion)
    assert message.content == "All done." and len(models.requests) == 3
    tools = [m for m in models.requests[2]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_0_0", "call_0_1", "call_1_0", "call_1_1", "call_1_2"]
    assert tools[0]["content"].startswith("saw-flag\n")
    check_second_turn([(m["content"], False) for m in tools[2:]], tmp_path / "home" / "sub", False)
    await check_record(agent, run.id, tmp_path)


async def test_agent_call_and_run_share_a_run(agent, tmp_path):
    run = agent.run()
    assert re.fullmatch(r"py-\d{8}T\d{6}Z-[0-9a-f]{6}", run.id) and agent.run().id != run.id
    await run.call("shell", {"command": "cd sub"})
    result = await agent.call(run.id, "shell", {"command": "pwd"})
    assert result.text.startswith(f"{tmp_path}/home/sub\n") and result.meta["seq"] == 2
    assert not result.is_error and result.meta["run"] == run.id
    bad_json = await openai_adapter.chat_messages(run, {"choices": [{"message": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{oops"}}]}}]})
    assert bad_json == [{"role": "tool", "tool_call_id": "c1",
                         "content": 'args: must be an object, got "{oops"\nremaining_tool_calls: 47'}]


async def test_bad_use_says_what_was_wrong(tmp_path):
    with pytest.raises(ConfigError, match=r"agent\.sandbox: must be one of"):
        guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", overrides={"sandbox": "vm"})
    closed = guilds.open(tmp_path / "agent.toml", data_dir=tmp_path / "data", env={})
    with pytest.raises(BadInput, match="the agent is not open"):
        closed.tools()
    async with closed as agent:
        with pytest.raises(BadInput, match="format: must be one of anthropic, mcp, openai, openai-responses"):
            agent.tools(format="gemini")
        with pytest.raises(BadInput, match="run id"):
            await anthropic_adapter.tool_results(agent.run("../x"), {"content": [
                {"type": "tool_use", "id": "t", "name": "shell", "input": {"command": "ls"}}]})
    guilds_mcp = [t["name"] for t in (await _tools(tmp_path, "mcp"))]
    assert guilds_mcp == ["code_task", "shell", "shell_status", "file_read", "code_search"]


async def _tools(tmp_path: Path, fmt: str) -> list[dict]:
    async with guilds.open(tmp_path / "agent.toml", data_dir=tmp_path / "data", env={}) as agent:
        return agent.tools(format=fmt)


def readme_loop() -> str:
    text = README.read_text()
    return text.split("<!-- agent-loop -->\n```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_agent_loop_runs_as_written(tmp_path):
    """The README's loop, unchanged, as a script: against the scripted Messages API."""
    settings_file(tmp_path)
    (tmp_path / "agent.py").write_text(readme_loop())
    assert len(readme_loop().splitlines()) <= 35
    server = ScriptedModels([[("shell", {"command": "cd sub"})], [("shell", {"command": "pwd"})], "3 passed."])
    env = {**os.environ, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "test-key",
           "GUILDS_DATA": str(tmp_path / "data")}
    try:
        proc = subprocess.run([sys.executable, "agent.py"], check=False, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "3 passed." and re.fullmatch(r"run py-\S+: open `guilds serve` to see its calls", lines[1])
    (result,) = server.requests[2]["messages"][-1]["content"]
    assert result["content"] == f"{tmp_path}/home/sub\nremaining_tool_calls: 48"
    assert json.loads(json.dumps(server.requests[0]["tools"]))[1]["name"] == "shell"
