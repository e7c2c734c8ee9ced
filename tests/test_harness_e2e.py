"""code_task end to end: the built one-file guilds-harness under ``python -I -S``,
run as the orchestrator runs it, driving stand-in harnesses (tests/fixtures/
fake_claude.py, fake_codex.py) that speak the real CLIs' stream formats and
really edit files in a git repository."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, Sandbox, error_text, ok_text
from guilds.sandbox.helpers import build_helper

FIXTURES = Path(__file__).parent / "fixtures"
FAKES = {"claude": "fake_claude.py", "codex": "fake_codex.py"}


@pytest.fixture(scope="session")
def harness_helper(tmp_path_factory) -> Path:
    """The one-file guilds-harness, built once per test session."""
    return build_helper(tmp_path_factory.mktemp("helper") / "guilds-harness", "guilds-harness")


@pytest.fixture(scope="session")
def fake_bin(tmp_path_factory) -> Path:
    """A folder with `claude` and `codex` that run the stand-ins."""
    folder = tmp_path_factory.mktemp("bin")
    for name, script in FAKES.items():
        path = folder / name
        path.write_text(f'#!/bin/sh\nexec "{PYTHON}" "{FIXTURES / script}" "$@"\n')
        path.chmod(0o755)
    return folder


def git(repo, *args) -> str:
    proc = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True)
    return proc.stdout


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    (path / "app.py").write_text("print('hello')\n")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


@pytest.fixture
def hb(harness_helper, fake_bin, tmp_path) -> Sandbox:
    """A sandbox folder: a home with one repository (repos/web), fakes on PATH."""
    home, state = tmp_path / "home", tmp_path / "state"
    state.mkdir()
    make_repo(home / "repos" / "web")
    box = Sandbox(helper=harness_helper, home=home, state=state)
    box.env = {"PATH": f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    return box


def task(box: Sandbox, brief: str, harness: str = "claude-code", **args):
    args = {"brief": brief, **args}
    repos = {"web": str(box.home / "repos" / "web")}
    return box.call("code_task", args, harness=harness, repos=repos, timeout=90,
                    **{k: v for k, v in (("redact_env", box.__dict__.get("redact")),) if v})


def log_rows(meta):
    return [json.loads(line) for line in Path(meta["log_path"]).read_text().splitlines()]


HARNESSES = ["claude-code", "codex"]


# --- the happy path ---------------------------------------------------------
@pytest.mark.parametrize("harness", HARNESSES)
def test_completed_with_diffstat_of_tracked_and_untracked_changes(hb, harness):
    repo = hb.home / "repos" / "web"
    env = task(hb, "Add a greeting.\nfake: append app.py print('bye')\nfake: write NOTES.md hi\n"
                   "fake: say Added a goodbye and notes.", harness)
    text, meta = ok_text(env), env["meta"]
    assert text.startswith(f"status: completed · {harness}")
    assert meta["status"] == "completed" and meta["exit_code"] == 0 and meta["timed_out"] is False
    assert meta["final_message"] == "Added a goodbye and notes."
    assert (meta["files_changed"], meta["insertions"], meta["deletions"]) == (2, 2, 0)
    assert "app.py" in meta["diffstat"] and "NOTES.md" in meta["diffstat"]
    assert meta["repo"] == "web" and meta["cwd"] == str(repo)
    assert meta["log_path"] == str(hb.home / ".runs" / "run1" / "c1.log")
    assert text.endswith(f"\nlog: {meta['log_path']}")
    assert meta["session_id"] and f"session: {meta['session_id']}" in text
    # The user's index and work tree are as the harness left them: nothing staged by us.
    assert git(repo, "status", "--porcelain").splitlines() == [" M app.py", "?? NOTES.md"]
    rows = log_rows(meta)
    assert rows[0]["type"] == "guilds.start" and rows[-1]["type"] == "guilds.end"
    assert rows[-1]["status"] == "completed"
    assert len(rows) > 4 and not any(r["type"] == "guilds.stdout" for r in rows)


@pytest.mark.parametrize("harness", HARNESSES)
def test_resume_continues_the_session(hb, harness):
    first = task(hb, "fake: write a.txt one", harness)["meta"]
    second = task(hb, "fake: append a.txt two\nfake: say again", harness, session_id=first["session_id"])
    meta = second["meta"]
    assert meta["status"] == "completed" and meta["session_id"] == first["session_id"]
    assert meta["final_message"] == "again (resumed, turn 2)"
    assert "a.txt" in meta["diffstat"] and meta["insertions"] == 1  # against the state when it began
    assert log_rows(meta)[0]["session_id"] == first["session_id"]


def test_a_harness_that_commits_still_shows_its_change(hb):
    repo = hb.home / "repos" / "web"
    meta = task(hb, "fake: append app.py x = 1\nfake: commit add x")["meta"]
    assert meta["status"] == "completed" and meta["files_changed"] == 1
    assert git(repo, "log", "--format=%s", "-1").strip() == "add x"


def test_stdin_is_closed(hb):
    assert task(hb, "fake: stdin")["meta"]["final_message"] == "stdin held 0 bytes"


def test_notes_reach_the_harness_and_env_is_the_agents(hb):
    hb.env.update(AGENT_SETTING="from-the-agent")
    meta = task(hb, "fake: env AGENT_SETTING", notes="keep it small")["meta"]
    assert meta["final_message"] == "from-the-agent"
    start = log_rows(meta)[0]
    assert start["argv"][-1] == "fake: env AGENT_SETTING\n\nNotes:\nkeep it small"


def test_secrets_are_redacted_and_gh_token_is_the_repos(hb):
    repo = hb.home / "repos" / "web"
    (hb.state / "agent1").mkdir()
    (hb.state / "agent1" / "repos.json").write_text(json.dumps({str(repo): "ghp_repo_token_1234"}))
    hb.env.update(MY_SECRET="s3cret-value-42")
    meta = hb.call("code_task", {"brief": "fake: env GH_TOKEN"}, harness="claude-code",
                   repos={"web": str(repo)}, redact_env=["MY_SECRET"])["meta"]
    assert meta["final_message"] == "[REDACTED]"
    # The log is the harness's stream as it was, in the agent's home (like shell logs).
    assert log_rows(meta)[-2]["result"] == "ghp_repo_token_1234"
    env = hb.call("code_task", {"brief": "fake: env MY_SECRET"}, harness="codex",
                  repos={"web": str(repo)}, redact_env=["MY_SECRET"])
    assert "s3cret" not in json.dumps(env) and env["meta"]["final_message"] == "[REDACTED]"


def test_a_long_final_message_is_shaped_to_max_bytes(hb):
    env = hb.call("code_task", {"brief": "fake: big 50000"}, harness="claude-code",
                  repos={"web": str(hb.home / "repos" / "web")}, max_bytes=1024)
    text = ok_text(env)
    assert len(text.encode()) <= 1024
    assert "bytes elided" in text and text.endswith(f"log: {env['meta']['log_path']}")


def test_request_file_transport(hb):
    requests = hb.state / "requests"
    requests.mkdir()
    req = hb.request("code_task", {"brief": "fake: say via file"}, harness="codex",
                     repos={"web": str(hb.home / "repos" / "web")})
    path = requests / "run1-c1.json"
    path.write_text(json.dumps(req))
    proc = hb.run_raw(str(path), timeout=60)
    from guilds_code.protocol import decode_envelope
    env = decode_envelope(proc.stdout.strip())
    assert env["meta"]["final_message"] == "via file" and not path.exists()


# --- bad input and bad harnesses ------------------------------------------------
@pytest.mark.parametrize("args, extra, message", [
    ({}, {}, "brief: required by code_task"),
    ({"brief": "x", "repo": "api"}, {}, 'repo: unknown repository "api" (known: web)'),
    ({"brief": "x"}, {"harness": "aider2"}, 'harness: unknown harness "aider2"'),
    ({"brief": "x", "session_id": "a b"}, {}, "session_id: must be a session id"),
    ({"brief": "x", "timeout_minutes": 500}, {}, "timeout_minutes: must be from 1 to 120, got 500"),
])
def test_bad_requests_are_one_line_errors(hb, args, extra, message):
    req = hb.request("code_task", args, repos={"web": str(hb.home / "repos" / "web")}, **extra)
    assert error_text(hb.call_request(req)).startswith(message)
    assert not (hb.home / ".runs").exists()


def test_a_repository_folder_that_is_gone(hb):
    env = hb.call("code_task", {"brief": "x"}, repos={"gone": str(hb.home / "nope")})
    assert error_text(env) == f"repo: the folder of gone, {hb.home / 'nope'}, does not exist"


@pytest.mark.parametrize("harness, program", [("claude-code", "claude"), ("codex", "codex")])
def test_not_installed(hb, harness, program):
    hb.env["PATH"] = "/usr/bin:/bin"
    env = task(hb, "fake: write x y", harness)
    meta = env["meta"]
    assert meta["status"] == "not installed"
    assert meta["error"] == f"{harness} is not installed: no {program} on PATH"
    assert "exit_code" not in meta and "diffstat" not in meta
    rows = log_rows(meta)
    assert [r["type"] for r in rows] == ["guilds.start", "guilds.end"]
    assert not (hb.home / "repos" / "web" / "x").exists()


def test_unknown_session_claude_says_so(hb):
    sid = "123e4567-e89b-12d3-a456-426614174000"
    env = task(hb, "fake: write x y", session_id=sid)
    meta = env["meta"]
    assert meta["status"] == "unknown session" and "session_id" not in meta
    assert meta["error"] == f"claude-code has no session {sid}; start a new one without session_id"
    assert env["text"].startswith("status: unknown session · claude-code")
    assert meta["diffstat"] == ""  # it changed nothing
    assert any("No conversation found" in json.dumps(r) for r in log_rows(meta))


def test_unknown_session_codex_is_caught_before_it_runs(hb):
    meta = task(hb, "fake: write x y", "codex", session_id="0199a213-81c0-7800-8aa1-bbab2a035a53")["meta"]
    assert meta["status"] == "unknown session" and "exit_code" not in meta
    assert not (hb.home / "repos" / "web" / "x").exists()


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_harness_reporting_failure(hb, harness):
    meta = task(hb, "fake: write half.txt x\nfake: fail the model refused", harness)["meta"]
    assert meta["status"] == "failed" and meta["exit_code"] == 1
    assert meta["error"] == "the model refused"
    assert meta["session_id"] and meta["files_changed"] == 1


def test_a_crash_keeps_the_diffstat_session_and_log(hb):
    env = task(hb, "fake: write partial.txt x\nfake: stderr panic: out of memory\nfake: crash")
    meta = env["meta"]
    assert meta["status"] == "crashed" and meta["signal"] == "SIGKILL" and meta["exit_code"] == 137
    assert meta["error"] == ("claude-code was killed by SIGKILL before its final event; "
                             "stderr: panic: out of memory")
    assert meta["session_id"] and meta["files_changed"] == 1
    assert {"type": "guilds.stderr", "text": "panic: out of memory"} in log_rows(meta)


def test_garbage_on_stdout(hb):
    meta = task(hb, "fake: garbage")["meta"]
    assert meta["status"] == "crashed" and meta["exit_code"] == 0
    assert meta["error"] == ("claude-code exited with 0 before its final event; "
                             "it printed 2 lines that are not claude-code events")
    assert {"type": "guilds.stdout", "text": "Welcome to the harness!"} in log_rows(meta)


def test_an_exit_before_the_final_event(hb):
    meta = task(hb, "fake: exit 3", "codex")["meta"]
    assert meta["status"] == "crashed" and meta["exit_code"] == 3
    assert meta["error"].startswith("codex exited with 3 before its final event")


def test_unexpected_arguments_to_the_harness(hb, fake_bin, tmp_path):
    odd = tmp_path / "oddbin"
    odd.mkdir()
    (odd / "claude").write_text("#!/bin/sh\necho \"error: unknown option '$1'\" >&2\nexit 2\n")
    (odd / "claude").chmod(0o755)
    hb.env["PATH"] = f"{odd}:/usr/bin:/bin"
    meta = task(hb, "x")["meta"]
    assert meta["status"] == "crashed" and meta["exit_code"] == 2
    assert meta["error"] == ("claude-code exited with 2 before its final event; it printed no events; "
                             "stderr: error: unknown option '-p'")


@pytest.mark.slow
def test_a_harness_that_hangs_after_its_final_event_is_stopped(hb):
    started = time.monotonic()
    env = task(hb, "fake: write done.txt x\nfake: linger 600\nfake: say finished", "codex")
    meta = env["meta"]
    assert time.monotonic() - started < 30
    assert meta["status"] == "completed" and meta["lingered"] is True and meta["timed_out"] is False
    assert meta["final_message"] == "finished" and meta["files_changed"] == 1
    assert "stopped: it did not exit after its final event" in env["text"].splitlines()[0]


def test_a_repository_inside_a_larger_work_tree_is_diffed_alone(hb):
    git(hb.home, "init", "-q")  # the home itself is a git repository
    inner = hb.home / "plain"
    inner.mkdir()
    (inner / "old.txt").write_text("old\n")
    env = hb.call("code_task", {"brief": "fake: write new.txt x"}, repos={"plain": str(inner)})
    meta = env["meta"]
    assert meta["status"] == "completed" and meta["files_changed"] == 1
    assert meta["diffstat"].startswith(" new.txt | 1 +")  # not .runs/, not plain/old.txt


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ")[1][0] != "Z"


@pytest.mark.parametrize("verb", ["child", "daemon"])
def test_nothing_is_left_running(hb, tmp_path, verb):
    """Also a child that left the group with setsid: the helper is its subreaper."""
    pidfile = tmp_path / "child.pid"
    meta = task(hb, f"fake: {verb} {pidfile}\nfake: say bye")["meta"]
    assert meta["status"] == "completed"
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.slow
def test_timeout_stops_the_whole_group(hb, tmp_path):
    """timeout_minutes is at least 1: this test takes a minute."""
    pidfile = tmp_path / "child.pid"
    brief = f"fake: write early.txt x\nfake: child {pidfile}\nfake: ignore-term\nfake: sleep 600"
    started = time.monotonic()
    env = task(hb, brief, "codex", timeout_minutes=1)
    took = time.monotonic() - started
    meta = env["meta"]
    assert meta["status"] == "timed out" and meta["timed_out"] is True and meta["exit_code"] == 124
    assert meta["signal"] == "SIGKILL"  # it ignored SIGTERM
    assert meta["error"] == "stopped after 1 min (timeout_minutes)"
    assert meta["session_id"] and meta["files_changed"] == 1
    assert 60 <= took < 60 + 30
    assert not _alive(int(pidfile.read_text()))


# --- the real Claude Code, against a scripted Messages API on loopback ---------------
@pytest.fixture
def real_claude(hb, tmp_path):
    """hb with the real `claude` on PATH, talking to a scripted API on 127.0.0.1."""
    from fixtures.scripted_anthropic import QUIET_CLAUDE, ScriptedAnthropic, bundled_claude

    binary = bundled_claude()
    if binary is None:
        pytest.skip("claude-agent-sdk (with its bundled claude) is not installed")

    repo = hb.home / "repos" / "web"
    api = ScriptedAnthropic([
        {"file_path": str(repo / "hello.txt"), "content": "hello from claude\n"},
        {"file_path": str(repo / "second.txt"), "content": "and again\n"},
    ])
    bin_dir = tmp_path / "realbin"
    bin_dir.mkdir()
    (bin_dir / "claude").symlink_to(binary)
    hb.env.update(PATH=f"{bin_dir}:/usr/bin:/bin", ANTHROPIC_BASE_URL=api.url, **QUIET_CLAUDE)
    yield hb, api
    api.close()


def test_the_real_claude_code_edits_and_resumes(real_claude):
    box, api = real_claude
    repo = box.home / "repos" / "web"
    first = box.call("code_task", {"brief": "Write hello.txt saying hello."}, harness="claude-code",
                     repos={"web": str(repo)}, redact_env=["ANTHROPIC_API_KEY"], timeout=120)
    meta = first["meta"]
    assert meta["status"] == "completed", first
    assert (repo / "hello.txt").read_text() == "hello from claude\n"
    assert meta["final_message"] == "I wrote the file as asked."
    assert "hello.txt" in meta["diffstat"] and meta["files_changed"] == 1
    assert meta["num_turns"] >= 1 and meta["cost_usd"] >= 0
    assert len(api.requests) >= 2
    assert any(row.get("type") == "result" for row in log_rows(meta))

    second = box.call("code_task", {"brief": "Now write second.txt.", "session_id": meta["session_id"]},
                      harness="claude-code", repos={"web": str(repo)}, timeout=120)
    again = second["meta"]
    assert again["status"] == "completed", second
    assert again["session_id"] == meta["session_id"]
    assert (repo / "second.txt").read_text() == "and again\n"
    assert again["files_changed"] == 1 and "second.txt" in again["diffstat"]
    # The resumed conversation carried the first one's messages.
    assert "Write hello.txt saying hello." in json.dumps(api.requests[-1]["messages"])


def test_the_real_claude_code_does_not_know_a_session(real_claude):
    box, _ = real_claude
    sid = "123e4567-e89b-12d3-a456-426614174000"
    meta = box.call("code_task", {"brief": "x", "session_id": sid}, harness="claude-code",
                    repos={"web": str(box.home / "repos" / "web")}, timeout=120)["meta"]
    assert meta["status"] == "unknown session" and meta["exit_code"] == 1
    assert meta["error"] == f"claude-code has no session {sid}; start a new one without session_id"


def test_a_cancelled_call_stops_the_harness(hb):
    """The orchestrator cancels by SIGTERM to the helper: the harness, in its own
    session and ignoring SIGTERM, must not outlive it."""
    import base64
    import signal as signals

    pidfile = hb.home / "harness.pid"
    req = hb.request("code_task", {"brief": f"fake: ignore-term\nfake: child {pidfile}\nfake: sleep 300"},
                     harness="claude-code", repos={"web": str(hb.home / "repos" / "web")})
    arg = base64.b64encode(json.dumps(req).encode()).decode()
    proc = subprocess.Popen([PYTHON, "-I", "-S", str(hb.helper), arg], env=hb.process_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    proc.send_signal(signals.SIGTERM)
    proc.communicate(timeout=10)
    assert proc.returncode == -signals.SIGTERM
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}").exists() else "gone"
    assert state in ("gone", "Z"), state
