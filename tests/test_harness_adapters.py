"""Harness adapters: one conformance suite over every adapter, on event streams
in the shapes the CLIs document; plus the pure parts of guilds-harness
(framing, request validation, diffstat parsing, the report's shape)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from guilds_code.protocol import RequestError
from guilds_code.redact import Redactor
from guilds_harness import diffstat, harnesses, limits, report, request
from guilds_harness.harnesses.contract import Outcome
from guilds_harness.process import Exit
from guilds_harness.stream import EventLog, LineFramer, decode_event

SESSION = "9b2f6c1e-4a57-4d8e-9c3b-2e1f0a7d6b54"

# --- streams in the documented shapes, per adapter --------------------------
CLAUDE_SUCCESS = [
    {"type": "system", "subtype": "init", "cwd": "/repo", "session_id": SESSION,
     "tools": ["Bash", "Edit", "Read", "Write"], "model": "claude-x", "permissionMode": "bypassPermissions"},
    {"type": "assistant", "session_id": SESSION, "parent_tool_use_id": None, "message": {
        "role": "assistant", "content": [
            {"type": "text", "text": "I'll edit the file."},
            {"type": "tool_use", "id": "toolu_1", "name": "Edit",
             "input": {"file_path": "/repo/a.py", "old_string": "a", "new_string": "b"}}]}},
    {"type": "user", "session_id": SESSION, "parent_tool_use_id": None, "message": {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}},
    {"type": "assistant", "session_id": SESSION, "parent_tool_use_id": None, "message": {
        "role": "assistant", "content": [{"type": "text", "text": "Changed a to b."}]}},
    {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 2100,
     "duration_api_ms": 1900, "num_turns": 2, "result": "Changed a to b.", "session_id": SESSION,
     "total_cost_usd": 0.0421, "usage": {"input_tokens": 1200, "output_tokens": 80},
     "permission_denials": []},
]
CLAUDE_FAILED = CLAUDE_SUCCESS[:2] + [
    {"type": "result", "subtype": "error_max_turns", "is_error": True, "duration_ms": 10,
     "num_turns": 1, "session_id": SESSION, "total_cost_usd": 0.01,
     "usage": {"input_tokens": 10, "output_tokens": 1}, "errors": ["Reached maximum number of turns (1)"]},
]
# As the real CLI (2.1.x) prints it for --resume=<a uuid it does not know>.
CLAUDE_UNKNOWN = [
    {"type": "result", "subtype": "error_during_execution", "duration_ms": 0, "is_error": True,
     "num_turns": 0, "stop_reason": None, "session_id": SESSION, "total_cost_usd": 0,
     "usage": {"input_tokens": 0, "output_tokens": 0}, "permission_denials": [],
     "errors": [f"No conversation found with session ID: {SESSION}"]},
]

CODEX_SUCCESS = [
    {"type": "thread.started", "thread_id": SESSION},
    {"type": "turn.started"},
    {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "Looking."}},
    {"type": "item.started", "item": {"id": "item_1", "type": "command_execution",
                                      "command": "bash -lc ls", "aggregated_output": "",
                                      "exit_code": None, "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution",
                                        "command": "bash -lc ls", "aggregated_output": "a.py\n",
                                        "exit_code": 0, "status": "completed"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "I'll edit the file."}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "file_change", "status": "completed",
                                        "changes": [{"path": "/repo/a.py", "kind": "update"}]}},
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "Changed a to b."}},
    {"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 900, "output_tokens": 80}},
]
CODEX_FAILED = CODEX_SUCCESS[:2] + [
    {"type": "error", "message": "stream disconnected before completion"},
    {"type": "turn.failed", "error": {"message": "stream disconnected before completion"}},
]

STREAMS = {
    "claude-code": {"success": CLAUDE_SUCCESS, "failed": CLAUDE_FAILED},
    "codex": {"success": CODEX_SUCCESS, "failed": CODEX_FAILED},
}
ALL = sorted(harnesses.HARNESSES)


def parse(name, events):
    parser = harnesses.get(name).parser()
    for event in events:
        parser.feed(json.loads(json.dumps(event)))
    return parser.outcome()


# --- the conformance suite ----------------------------------------------------
def test_every_adapter_has_streams_here():
    assert sorted(STREAMS) == ALL


@pytest.mark.parametrize("name", ALL)
def test_argv_starts_with_the_program_and_ends_with_the_prompt(name):
    adapter = harnesses.get(name)
    assert adapter.name == name
    for session in (None, SESSION):
        argv = adapter.argv("-rf: a brief starting with a dash", session)
        assert argv[0] == adapter.executable
        assert argv[-2:] == ["--", "-rf: a brief starting with a dash"]
        assert all(isinstance(a, str) for a in argv)
        assert (SESSION in " ".join(argv)) == (session is not None)


@pytest.mark.parametrize("name", ALL)
def test_environ_is_strings_and_no_secret(name):
    env = harnesses.get(name).environ()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert not any(word in k for k in env for word in ("KEY", "TOKEN", "SECRET"))


@pytest.mark.parametrize("name", ALL)
def test_success_stream(name):
    out = parse(name, STREAMS[name]["success"])
    assert out.finished and out.ok and not out.unknown_session
    assert out.session_id == SESSION
    assert out.final_message == "Changed a to b."
    assert out.input_tokens == 1200 and out.output_tokens == 80
    assert out.num_turns and out.num_turns >= 1


@pytest.mark.parametrize("name", ALL)
def test_failed_stream(name):
    out = parse(name, STREAMS[name]["failed"])
    assert out.finished and not out.ok
    assert out.session_id == SESSION
    assert out.error


@pytest.mark.parametrize("name", ALL)
def test_a_cut_stream_keeps_the_session_and_last_message(name):
    stream = STREAMS[name]["success"]
    out = parse(name, stream[:-1])
    assert not out.finished and out.session_id == SESSION
    assert out.final_message in ("I'll edit the file.", "Changed a to b.")


@pytest.mark.parametrize("name", ALL)
def test_unknown_events_and_odd_fields_are_ignored(name):
    odd = [
        {"type": "future.event", "x": 1},
        {"type": "result", "num_turns": "three", "total_cost_usd": True, "usage": []},
        {"type": "item.completed", "item": "not an object"},
        {"type": "turn.failed", "error": None},
        {"type": "assistant", "message": {"content": "text"}},
    ]
    out = parse(name, odd)
    assert isinstance(out, Outcome)
    assert out.num_turns in (None, 0) or isinstance(out.num_turns, int)
    assert out.cost_usd is None


@pytest.mark.parametrize("name", ALL)
def test_a_fresh_parser_per_call(name):
    adapter = harnesses.get(name)
    first = adapter.parser()
    for event in STREAMS[name]["success"]:
        first.feed(event)
    assert adapter.parser().outcome() == Outcome()


# --- per adapter ---------------------------------------------------------------
def test_claude_unknown_session_as_the_real_cli_says_it():
    out = parse("claude-code", CLAUDE_UNKNOWN)
    assert out.finished and not out.ok and out.unknown_session
    assert "No conversation found" in out.error


def test_claude_result_fields():
    out = parse("claude-code", CLAUDE_SUCCESS)
    assert out.cost_usd == pytest.approx(0.0421)
    assert out.num_turns == 2
    failed = parse("claude-code", CLAUDE_FAILED)
    assert failed.error == "Reached maximum number of turns (1)"
    assert not failed.unknown_session


def test_claude_argv_resume_and_permissions():
    argv = harnesses.get("claude-code").argv("do it", SESSION)
    assert argv == ["claude", "-p", "--output-format", "stream-json", "--verbose",
                    "--dangerously-skip-permissions", f"--resume={SESSION}", "--", "do it"]
    assert harnesses.get("claude-code").environ() == {"IS_SANDBOX": "1"}


def test_codex_argv_resume():
    argv = harnesses.get("codex").argv("do it", SESSION)
    assert argv == ["codex", "exec", "--json", "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox", "resume", SESSION, "--", "do it"]


def test_codex_sessions_are_looked_up_in_its_rollout_files(tmp_path):
    codex = harnesses.get("codex")
    env = {"HOME": str(tmp_path)}
    assert codex.unknown_session(SESSION, env)
    day = tmp_path / ".codex" / "sessions" / "2025" / "10" / "12"
    day.mkdir(parents=True)
    (day / f"rollout-2025-10-12T17-00-00-{SESSION}.jsonl").write_text("{}\n")
    assert not codex.unknown_session(SESSION, env)
    assert codex.unknown_session("0000", env)
    assert codex.unknown_session(SESSION, {"HOME": str(tmp_path), "CODEX_HOME": str(tmp_path / "other")})


def test_codex_usage_sums_over_turns_and_error_then_success():
    out = parse("codex", CODEX_SUCCESS[:2] + [{"type": "error", "message": "Reconnecting... 1/5"}]
                + CODEX_SUCCESS[2:])
    assert out.ok and out.error is None


# --- NDJSON framing --------------------------------------------------------
def test_framer_splits_across_chunks_and_flushes_the_last_line():
    framer = LineFramer(100)
    lines = framer.feed(b'{"a"') + framer.feed(b':1}\n{"b":2}\n{"c"')
    assert [line.data for line in lines] == [b'{"a":1}', b'{"b":2}']
    assert [line.data for line in framer.flush()] == [b'{"c"']
    assert framer.flush() == []


def test_framer_guards_line_size():
    framer = LineFramer(10)
    lines = framer.feed(b"x" * 7) + framer.feed(b"y" * 20 + b"\nok\n")
    assert lines[0].oversized and lines[0].size == 27 and lines[0].data == b"xxxxxxxyyy"
    assert not lines[1].oversized and lines[1].data == b"ok"


@pytest.mark.parametrize("raw", [b"", b"garbage", b"[1,2]", b'{"type": 3}', b'{"type":"x","v":NaN}',
                                 b"\xff\xfe", b"[" * 100000])
def test_decode_event_refuses_what_is_not_an_event(raw):
    assert decode_event(raw) is None


def test_event_log_keeps_events_verbatim_and_wraps_the_rest(tmp_path):
    log = EventLog(str(tmp_path / "c1.log"))
    framer = LineFramer(32)
    lines = framer.feed(b'{"type":"a","n":1}\r\nWelcome!\n' + b"z" * 50 + b"\n\n")
    events = [log.stdout_line(line, 8) for line in lines]
    log.stderr_line(LineFramer(5).feed(b"warning: x\n")[0])
    log.close()
    assert events[0] == {"type": "a", "n": 1} and events[1:] == [None, None, None]
    rows = [json.loads(line) for line in (tmp_path / "c1.log").read_text().splitlines()]
    assert rows == [
        {"type": "a", "n": 1},
        {"type": "guilds.stdout", "text": "Welcome!"},
        {"type": "guilds.oversized", "bytes": 50, "head": "zzzzzzzz"},
        {"type": "guilds.stderr", "text": "warni … [+5 bytes]"},
    ]


# --- request ------------------------------------------------------------------
def base_request(**extra):
    req = {"op": "code_task", "args": {"brief": "fix it"}, "run_id": "r1", "agent_id": "a1",
           "call_id": "c1", "home": "/home/agent", "repos": {"web": "/home/agent/repos/web"}}
    req.update(extra)
    return req


def test_request_defaults():
    req = request.parse_request(base_request())
    assert req.harness == "claude-code" and req.task.timeout_minutes == limits.TIMEOUT_MINUTES_DEFAULT
    assert req.task.session_id is None and req.repos == {"web": "/home/agent/repos/web"}
    assert req.max_bytes == 8192


@pytest.mark.parametrize("args, message", [
    ({}, "brief: required by code_task"),
    ({"brief": "  "}, "brief: must not be empty"),
    ({"brief": 3}, "brief: must be a string"),
    ({"brief": "x", "timeout_minutes": 0}, "timeout_minutes: must be from 1 to 120, got 0"),
    ({"brief": "x", "timeout_minutes": 121}, "timeout_minutes: must be from 1 to 120"),
    ({"brief": "x", "timeout_minutes": True}, "timeout_minutes: must be an integer"),
    ({"brief": "x", "timeout_minutes": "5"}, "timeout_minutes: must be an integer"),
    ({"brief": "x", "session_id": "../../etc"}, "session_id: must be a session id"),
    ({"brief": "x", "session_id": "-rf"}, "session_id: must be a session id"),
    ({"brief": "x", "model": "y"}, "model: unknown argument for code_task"),
    ({"brief": "x" * limits.BRIEF_MAX_CHARS, "notes": "y"}, "brief: with notes, longer than"),
])
def test_bad_arguments_name_the_field(args, message):
    with pytest.raises(RequestError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        request.parse_request(base_request(args=args))


@pytest.mark.parametrize("extra, message", [
    ({"op": "shell"}, "op: must be 'code_task'"),
    ({"harness": "vim"}, "harness: unknown harness \"vim\" (known: claude-code, codex)"),
    ({"repos": {"web": "relative"}}, "repos.web: must be an absolute path"),
    ({"repos": {"../x": "/a"}}, "repos: bad repository name"),
    ({"repos": ["/a"]}, "repos: must be an object"),
    ({"run_id": "../x"}, "run_id: must be letters"),
])
def test_bad_request_fields_name_the_field(extra, message):
    with pytest.raises(RequestError) as info:
        request.parse_request(base_request(**extra))
    assert str(info.value).startswith(message)


def test_repo_resolution():
    repos = {"web": "/h/repos/web", "api": "/h/repos/api"}
    req = request.parse_request(base_request(repos=repos))
    assert request.resolve_repo(req, "/h/repos/api/src") == ("api", "/h/repos/api")
    with pytest.raises(RequestError, match=r"^repo: required, the agent has several \(api, web\)"):
        request.resolve_repo(req, "/h")
    req.task.repo = "web"
    assert request.resolve_repo(req, "/h/repos/api") == ("web", "/h/repos/web")
    req.task.repo = "nope"
    with pytest.raises(RequestError, match=r'^repo: unknown repository "nope" \(known: api, web\)'):
        request.resolve_repo(req, "/h")
    one = request.parse_request(base_request())
    assert request.resolve_repo(one, "/elsewhere") == ("web", "/home/agent/repos/web")
    none = request.parse_request(base_request(repos={}))
    with pytest.raises(RequestError, match=r"^repo: the agent has no repository"):
        request.resolve_repo(none, "/h")
    prefix = request.parse_request(base_request(repos={"web": "/h/web", "web2": "/h/web2"}))
    assert request.resolve_repo(prefix, "/h/web2/x")[0] == "web2"


# --- diffstat -------------------------------------------------------------------
@pytest.mark.parametrize("text, counts", [
    ("", (0, 0, 0)),
    (" a | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)", (1, 1, 1)),
    (" a | 3 +++\n b | 1 +\n 2 files changed, 4 insertions(+)", (2, 4, 0)),
    (" a | 2 --\n 1 file changed, 2 deletions(-)", (1, 0, 2)),
])
def test_parse_stat(text, counts):
    stat = diffstat.parse_stat(text)
    assert (stat.files_changed, stat.insertions, stat.deletions) == counts


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


def test_snapshot_counts_untracked_and_leaves_the_index_alone(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    (repo / ".gitignore").write_text("build/\n")
    _git(repo, "add", "a.txt")  # staged, never committed: an unborn HEAD
    env = dict(os.environ)
    before = diffstat.snapshot(str(repo), env)
    (repo / "a.txt").write_text("one\ntwo\n")
    (repo / "new.txt").write_text("new\n")
    (repo / "build").mkdir()
    (repo / "build" / "out.o").write_text("ignored\n")
    after = diffstat.snapshot(str(repo), env)
    stat = diffstat.diffstat(before, after, env)
    assert "a.txt" in stat.text and "new.txt" in stat.text and "build" not in stat.text
    assert (stat.files_changed, stat.insertions, stat.deletions) == (2, 2, 0)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout.splitlines() == ["AM a.txt", "?? .gitignore", "?? new.txt"]


def test_snapshot_of_a_plain_folder_is_unavailable(tmp_path):
    result = diffstat.snapshot(
        str(tmp_path), {"PATH": os.environ["PATH"], "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    )
    assert isinstance(result, diffstat.Unavailable) and "rev-parse" in result.reason
    assert diffstat.describe(result).startswith("(unavailable: git rev-parse failed")


# --- the report ------------------------------------------------------------------
def make_report(**extra):
    fields = {"status": "completed", "harness": "claude-code", "repo": "web", "cwd": "/h/web",
                  "log_path": "/h/.runs/r1/c1.log", "session_id": SESSION,
                  "outcome": Outcome(session_id=SESSION, finished=True, ok=True, final_message="Done.",
                                  cost_usd=0.5, num_turns=3),
                  "exit": Exit(0), "stat": diffstat.parse_stat(" a | 1 +\n 1 file changed, 1 insertion(+)")}
    fields.update(extra)
    return report.Report(**fields)


def test_report_text_and_meta():
    reply = report.render(make_report(), 8192, Redactor([]))
    assert reply.text == (
        "status: completed · claude-code · 3 turns · $0.5000\n"
        f"session: {SESSION} (pass it as session_id to resume)\n"
        "diffstat:\n a | 1 +\n 1 file changed, 1 insertion(+)\n"
        "final message:\nDone.\n"
        "log: /h/.runs/r1/c1.log"
    )
    assert reply.meta == {
        "status": "completed", "harness": "claude-code", "repo": "web", "cwd": "/h/web",
        "session_id": SESSION, "diffstat": " a | 1 +\n 1 file changed, 1 insertion(+)",
        "final_message": "Done.", "log_path": "/h/.runs/r1/c1.log", "cost_usd": 0.5, "num_turns": 3,
        "files_changed": 1, "insertions": 1, "deletions": 0, "exit_code": 0, "timed_out": False,
    }


def test_report_shapes_a_long_message_under_the_cap_and_redacts_first():
    long = "start secret-value-123\n" + "middle line\n" * 5000 + "the end"
    rep = make_report(outcome=Outcome(final_message=long), error="token secret-value-123 leaked")
    reply = report.render(rep, 1024, Redactor(["secret-value-123"]))
    assert len(reply.text.encode()) <= 1024
    assert "secret-value" not in reply.text and "secret-value" not in json.dumps(reply.meta)
    assert "[REDACTED]" in reply.text and "bytes elided" in reply.text
    assert reply.text.endswith("log: /h/.runs/r1/c1.log") and "the end" in reply.text


def test_report_of_a_kill_names_the_signal_and_keeps_the_counts():
    rep = make_report(status="crashed", error="killed", exit=Exit(137, 9), stat=diffstat.Unavailable("no git"),
                      outcome=Outcome())
    reply = report.render(rep, 8192, Redactor([]))
    assert reply.meta["signal"] == "SIGKILL" and reply.meta["exit_code"] == 137
    assert "diffstat" not in reply.meta and "final_message" not in reply.meta
    assert "status: crashed · claude-code · exit 137\n" in reply.text
    assert "diffstat:\n(unavailable: no git)\nfinal message:\n(none)\n" in reply.text


def test_a_huge_diffstat_keeps_its_summary():
    lines = [f" file{i}.py | 1 +" for i in range(40)] + [" 80 files changed, 80 insertions(+)"]
    rep = make_report(stat=diffstat.parse_stat("\n".join(lines)))
    reply = report.render(rep, 1024, Redactor([]))
    assert len(reply.text.encode()) <= 1024
    assert " 80 files changed, 80 insertions(+)" in reply.text and "more files" in reply.text
