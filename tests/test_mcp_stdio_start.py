"""`guilds mcp` answers a client's opening requests before the MCP SDK has loaded
(guilds.fronts.mcp_quick, guilds.fronts.mcp_stdio), each answer the SDK's byte for byte,
and the real Claude Code on a busy machine starts its session with the tools."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import select
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

import mcp_kit as kit
from fixtures.scripted_anthropic import tool_results
from guilds.fronts import mcp_quick
from guilds.fronts.mcp_quick import QuickAnswers
from guilds.fronts.mcp_stdio import Relay
from guilds.toolbox.tools import TOOL_NAMES
from test_mcp_claude_code import CLAUDE, PREFIX, run_claude

ANSWER_SECONDS = 60
BUSY_LOAD = 4
"""The load the busy machine is brought to (the load at which Claude Code went on without the tools)."""
CLAUDE_CODE = {"name": "claude-code", "title": "Claude Code", "version": "2.1.332",
               "description": "Anthropic's agentic coding tool", "websiteUrl": "https://claude.com/claude-code"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": CLAUDE_CODE,
            "io.modelcontextprotocol/clientCapabilities": {"roots": {"listChanged": True},
                                                           "elicitation": {"form": {}, "url": {}}}}
"""What Claude Code 2.1.332 puts in every request's _meta (read off its wire)."""


def request(request_id: int | str, method: str, params: dict | None = None) -> dict:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    return message if params is None else {**message, "params": params}


def initialize(version: str, request_id: int | str = 1, **params) -> dict:
    return request(request_id, "initialize", {"protocolVersion": version, "capabilities": {},
                                              "clientInfo": {"name": "raw", "version": "0"}, **params})


def modern(request_id: int | str, method: str) -> dict:
    return request(request_id, method, {"_meta": ENVELOPE})


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LISTS = ("tools/list", "prompts/list", "resources/list")
OPENINGS = {
    **{f"handshake {version}": [initialize(version), INITIALIZED, *(request(n, m) for n, m in enumerate(LISTS, 2)),
                                request("p", "ping")] for version in (*HANDSHAKE_PROTOCOL_VERSIONS, "1999-01-01")},
    "handshake, string ids, params {}": [initialize("2025-06-18", "i"), request("t", "tools/list", {})],
    "claude code": [modern("server-discover-probe-1", "server/discover"), *(modern(n, m) for n, m in enumerate(LISTS))],
}
"""Openings answered early, whole: each request's answer must be the SDK's."""
LAST = request("last", "no/such-method")
"""Sent after an opening: the SDK answers it (an error), after the opening's requests."""


def sdk_loaded(pid: int) -> bool:
    """The process has loaded pydantic's core (the MCP SDK's models need it)."""
    return "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()


SDK_GATE = """
import os, runpy, sys, time
gate = sys.argv.pop(1)
class HoldTheSdk:
    def find_spec(self, name, path=None, target=None):
        while name == "pydantic_core" and not os.path.exists(gate):
            time.sleep(0.002)
        return None
sys.meta_path.insert(0, HoldTheSdk())
runpy.run_module("guilds.fronts.mcp_stdio", run_name="__main__", alter_sys=True)
"""
"""`python -m guilds.fronts.mcp_stdio` with the MCP SDK's load held until a file (its first
argument) exists: an answer sent while it is held cannot have waited for the SDK."""


def start(tmp_path: Path, coding: bool = True, hold_sdk: bool = True) -> subprocess.Popen:
    """`guilds mcp` on fresh settings; unless hold_sdk is false, the SDK's load waits for
    converse to let it go once the first answer is in."""
    settings = kit.write_settings(tmp_path, coding=coding)
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GUILDS_")}
    launch = ["-c", SDK_GATE, str(tmp_path / "sdk-gate")] if hold_sdk else ["-m", "guilds.fronts.mcp_stdio"]
    return subprocess.Popen([sys.executable, *launch, str(settings), str(tmp_path / "data")],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def first_answer(proc: subprocess.Popen) -> tuple[dict, bool]:
    """The first answer, and whether the SDK was loaded when it came (for a process started
    holding the SDK: false, and the SDK let go; an answer that needed it never comes)."""
    assert proc.stdout
    gate = Path(proc.args[3]) if proc.args[1] == "-c" else None  # type: ignore[index]
    if gate is None:
        answer = json.loads(proc.stdout.readline())
        return answer, sdk_loaded(proc.pid)
    ready, _, _ = select.select([proc.stdout], [], [], ANSWER_SECONDS)
    if not ready:
        proc.kill()
        raise AssertionError("no answer while the SDK was held: the first answer waited for the SDK")
    answer = json.loads(proc.stdout.readline())
    loaded = sdk_loaded(proc.pid)
    gate.touch()
    return answer, loaded


def converse(proc: subprocess.Popen, messages: list[dict], expect: int) -> tuple[list[dict], bool, str]:
    """Send messages, read expect answers: (the answers, whether the SDK was loaded at the
    first one, stderr once the process ended on stdin's close)."""
    assert proc.stdin and proc.stdout and proc.stderr
    with proc:
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        proc.stdin.flush()
        answer, loaded_at_first = first_answer(proc)
        answers = [answer, *(json.loads(proc.stdout.readline()) for _ in range(expect - 1))]
        proc.stdin.close()
        assert proc.wait(ANSWER_SECONDS) == 0
        assert proc.stdout.read() == b""  # nothing answered twice
        return answers, loaded_at_first, proc.stderr.read().decode()


HEAVY = ("mcp", "mcp_types", "pydantic", "anyio", "asyncio", "starlette")
"""What the early answers must not wait for: the SDK and what it stands on."""
LATER = ("guilds.toolbox.tools", "guilds.checkpoints", "importlib.metadata")
"""What the opening answer does not wait for either: the tool registry (loaded next, for
tools/list), the checkpoints, the lookup of installed distributions."""
EARLY_PATH = """
import sys
from guilds.fronts import cli
cli._parser("mcp")
from guilds.fronts.wiring import resolve
from guilds.fronts.mcp_quick import QuickAnswers
import guilds.fronts.mcp_stdio
wired = resolve(sys.argv[1], data_dir=sys.argv[2])
line = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",' \\
    b'"capabilities":{},"clientInfo":{"name":"a","version":"1"}}}'
assert QuickAnswers(wired.coding).answer(line)
print(" ".join(name for name in sys.argv[3:] if name in sys.modules))
"""
"""`guilds mcp`'s way to its first answer: the command line, the settings, the relay, the answer."""


def test_the_first_answer_imports_nothing_heavy(tmp_path):
    settings = kit.write_settings(tmp_path)
    loaded = subprocess.run([sys.executable, "-c", EARLY_PATH, str(settings), str(tmp_path / "data"), *HEAVY, *LATER],
                            capture_output=True, text=True, check=True, timeout=ANSWER_SECONDS)
    assert loaded.stdout.split() == []


def test_the_versions_are_the_sdks():
    assert mcp_quick.HANDSHAKE_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS
    assert (mcp_quick.MODERN_VERSION,) == MODERN_PROTOCOL_VERSIONS


@pytest.mark.parametrize("opening", list(OPENINGS))
def test_the_opening_is_answered_before_the_sdk_loads_as_the_sdk_answers_it(tmp_path, opening):
    """Early answers, then the SDK's answers to the same requests compared with them in the
    process (a difference is a line on stderr), and dropped: one answer per request."""
    messages = OPENINGS[opening]
    asked = [m["id"] for m in messages if "id" in m]
    answers, loaded, stderr = converse(start(tmp_path), [*messages, LAST], len(asked) + 1)
    assert not loaded, "the first answer waited for the SDK"
    assert [a["id"] for a in answers] == [*asked, "last"]
    assert all("result" in a for a in answers[:-1]) and "error" in answers[-1]
    assert "differs" not in stderr, stderr


@pytest.mark.parametrize("coding", [True, False])
def test_tools_list_early_is_the_offered_tools(tmp_path, coding):
    answers, loaded, stderr = converse(start(tmp_path, coding=coding),
                                       [modern(1, "tools/list"), LAST], 2)
    assert not loaded and "differs" not in stderr, stderr
    assert [tool["name"] for tool in answers[0]["result"]["tools"]] == (list(TOOL_NAMES) if coding else [])


DEFERRED = {
    "clientInfo without a version": [initialize("2025-06-18", clientInfo={"name": "raw"})],
    "an unknown capability": [initialize("2025-06-18", capabilities={"sampling": {"x": 1}})],
    "tools/list before initialize": [request(1, "tools/list")],
    "an envelope of another version": [request(1, "tools/list", {"_meta": {
        **ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2027-01-01"}})],
    "initialize after an envelope": [modern(1, "tools/list"), initialize("2025-06-18", 2)],
    "a cursor": [initialize("2025-06-18"), request(2, "tools/list", {"cursor": "x"}), request(3, "tools/list")],
}
"""Openings whose last request the SDK answers (and every request after the first it answers)."""


@pytest.mark.parametrize("case", list(DEFERRED))
def test_what_is_not_plainly_valid_is_left_to_the_sdk(case):
    answers = QuickAnswers(lambda: True, version="0")
    *before, last = DEFERRED[case]
    for message in before:
        answers.answer(json.dumps(message).encode())
    assert answers.answer(json.dumps(last).encode()) is None
    assert not answers.open


def test_a_deferred_request_gets_the_sdks_answer_in_the_process(tmp_path):
    messages = [initialize("2025-06-18", clientInfo={"name": "raw"}), request(2, "tools/list")]
    answers, loaded, stderr = converse(start(tmp_path, hold_sdk=False), messages, 2)
    assert answers[0]["id"] == 1 and answers[0]["error"]["code"] == -32602  # the SDK's refusal
    assert answers[1]["id"] == 2 and "error" in answers[1]  # not initialized: the SDK says so too
    assert loaded and "differs" not in stderr


def test_a_differing_early_answer_is_reported_and_dropped(caplog):
    """The SDK's answer to an early-answered request is compared with the one sent."""
    relay = Relay(QuickAnswers(lambda: True, version="0"), None, -1, -1, None)  # type: ignore[arg-type]
    relay.answered["1"] = deque([b'{"jsonrpc":"2.0","id":1,"result":{"a":1}}\n'])
    with caplog.at_level(logging.WARNING):
        assert relay._answered_early(b'{"jsonrpc":"2.0","id":1,"result":{"a":2}}\n')
        assert not relay._answered_early(b'{"jsonrpc":"2.0","id":1,"result":{"a":2}}\n')  # only the first
    server = '{"jsonrpc":"2.0","id":1,"result":{"a":2}}'
    assert [r.getMessage() for r in caplog.records] == [
        f"guilds mcp: the early answer to request 1 differs from the server's: {server}"]


@contextmanager
def busy(load: int) -> Iterator[None]:
    """Processes spinning on the CPU, as many as bring the machine's load to about load (none when
    it is there already: a suite run in parallel loads it by itself, and past it the test would
    measure a machine busier than the one it stands for)."""
    spinners = max(0, math.ceil(load - os.getloadavg()[0]))
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.skipif(CLAUDE is None, reason="claude-agent-sdk (with its bundled claude) is not installed")
async def test_claude_code_on_a_busy_machine_has_the_tools_in_its_first_request(tmp_path):
    """`guilds mcp` as a user adds it (claude mcp add guilds -- guilds mcp), on a machine at a load of
    about BUSY_LOAD: Claude Code's first model request offers the five tools, and a call goes through.
    (With the SDK answering the handshake, the server was still "pending" then, and the first
    request had none of its tools.)"""
    settings = kit.write_settings(tmp_path)
    (tmp_path / "home").mkdir()
    guilds = Path(sys.executable).with_name("guilds")
    added = ["guilds", "-e", f"GUILDS_DATA={tmp_path / 'data'}", "--", str(guilds), "mcp", "--config", str(settings)]
    with busy(BUSY_LOAD):
        await asyncio.sleep(0.5)
        events, api = await run_claude(added, [lambda seen: ("shell", {"command": "echo hi"})], tmp_path)
    assert {"name": "guilds", "status": "connected"}.items() <= events[0]["mcp_servers"][0].items()
    first = next(body for body in api.requests if body.get("tools"))
    offered = sorted(tool["name"] for tool in first["tools"] if tool["name"].startswith(PREFIX))
    assert offered == sorted(PREFIX + name for name in TOOL_NAMES)
    assert tool_results(api.requests[-1])[0].startswith("hi\n")
