"""shell (foreground) through the built helper, real bash: every rule of the page."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from base64 import b64encode

import pytest

from conftest import PYTHON, error_text, ok_text, sized_tmpfs
from guilds_code.protocol import decode_envelope

MARKER_RE = re.compile(r"\[… (\d+) bytes elided; full output: (/.+) …\]\n")
TIMED_OUT = "[timed out after {}s; the command was stopped]"


def sh(sandbox, command, **args):
    extra = args.pop("extra", {})
    return sandbox.call("shell", dict(command=command, **args), **extra)


def run_dir(sandbox):
    return sandbox.home / ".runs" / sandbox.run_id


def kill_pids(*paths):
    for path in paths:
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


# --- basics -----------------------------------------------------------------
def test_output_and_meta(sandbox):
    env = sh(sandbox, "echo out; echo err >&2; echo out2")
    assert ok_text(env) == "out\nerr\nout2"
    assert env["meta"] == {"exit_code": 0, "cwd": str(sandbox.home), "timed_out": False}
    assert os.listdir(run_dir(sandbox)) == ["cwd"]


@pytest.mark.parametrize(
    "command, text, code",
    [
        ("true", "(no output)", 0),
        ("false", "(no output)\nexit_code: 1", 1),
        ("echo x; exit 3", "x\nexit_code: 3", 3),
        ("nosuchcommand_zz", "bash: line 1: nosuchcommand_zz: command not found\nexit_code: 127", 127),
        ("echo a; kill -9 $$", "a\nexit_code: 137", 137),
        ("kill -TERM $$", "(no output)\nexit_code: 143", 143),
        ("sleep 5 & kill -9 $!; wait $!", "bash: line 1: +[0-9]+ Killed +sleep 5\nexit_code: 137", 137),
        ("if", "bash: -c: line 2: syntax error: unexpected end of file\nexit_code: 2", 2),
    ],
)
def test_exit_codes_and_signals(sandbox, command, text, code):
    env = sh(sandbox, command)
    assert re.fullmatch(text, ok_text(env)) if "[0-9]" in text else ok_text(env) == text
    assert env["meta"]["exit_code"] == code and env["meta"]["timed_out"] is False


def test_stdin_is_closed(sandbox):
    assert ok_text(sh(sandbox, "cat; read x; echo rc=$?", timeout_seconds=5)) == "rc=1"


def test_dollar_zero_and_args_are_plain_bash_c(sandbox):
    assert ok_text(sh(sandbox, 'echo "$0|$#|$*|$LINENO"\necho "$LINENO"')) == "bash|0||1\n2"


def test_own_session_and_group(sandbox):
    out = ok_text(sh(sandbox, "read -r line < /proc/$$/stat; set -- ${line##*)}; echo $$ $3 $4"))
    pid, pgrp, sid = out.split()
    assert pid == pgrp == sid


def test_no_other_descriptor_reaches_the_command(sandbox):
    """Only 0, 1 and 2 (and the shell's cwd file, PWD_FD), also when the helper itself inherited more."""
    read, write = os.pipe()
    req = sandbox.request("shell", {"command": "ls /proc/$$/fd"})
    try:
        proc = subprocess.run(
            [PYTHON, "-I", "-S", str(sandbox.helper), b64encode(json.dumps(req).encode()).decode()],
            check=False, env=sandbox.process_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
            pass_fds=(write,),
        )
    finally:
        os.close(read)
        os.close(write)
    assert ok_text(decode_envelope(proc.stdout.strip())).split() == ["0", "1", "2", "87"]


def test_the_shells_directory_goes_to_a_memfd_and_without_one_to_an_unlinked_file(sandbox, tmp_path, monkeypatch):
    """PWD_FD names no file: a memfd, so a call makes and unlinks nothing in its run folder for it."""
    assert ok_text(sh(sandbox, "readlink /proc/$$/fd/87")).startswith("/memfd:guilds-pwd-")
    from guilds_code.ops import shell

    def no_memfd(*_):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    folder = tmp_path / "run"
    folder.mkdir()
    fd = shell.open_pwd_file(str(folder), "c1")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == f"{folder}/.c1.pwd (deleted)" and not os.listdir(folder)
    finally:
        os.close(fd)


def test_sigpipe_is_the_default_in_the_command(sandbox):
    """Python ignores SIGPIPE; the command must not inherit that (`yes | head` ends quietly)."""
    assert ok_text(sh(sandbox, "yes | head -1; echo ${PIPESTATUS[0]}")) == "y\n141"


# --- working directory --------------------------------------------------------
def test_cd_carries_over_env_does_not(sandbox):
    (sandbox.home / "sub").mkdir()
    env = sh(sandbox, "cd sub && export FOO=1")
    assert env["meta"]["cwd"] == str(sandbox.home / "sub")
    assert ok_text(sh(sandbox, 'pwd; echo "${FOO-unset}"')) == f"{sandbox.home}/sub\nunset"
    assert (run_dir(sandbox) / "cwd").read_text() == f"{sandbox.home}/sub"


def test_cd_survives_exit_and_is_physical(sandbox):
    (sandbox.home / "real").mkdir()
    (sandbox.home / "link").symlink_to(sandbox.home / "real")
    env = sh(sandbox, "cd link; exit 5")
    assert env["meta"] == {"exit_code": 5, "cwd": str(sandbox.home / "real"), "timed_out": False}


def test_starts_at_the_request_default_then_home_when_gone(sandbox):
    start = sandbox.home / "repos" / "web"
    start.mkdir(parents=True)
    default = {"cwd": str(start)}
    assert ok_text(sh(sandbox, "pwd", extra=default)) == str(start)
    sh(sandbox, "mkdir -p gone && cd gone", extra=default)
    env = sh(sandbox, 'rmdir "$PWD"', extra=default)
    assert env["meta"]["cwd"] == str(start)
    start.rmdir()
    assert ok_text(sh(sandbox, "pwd", extra=default)) == str(sandbox.home)


def test_cd_outside_home_is_recorded(sandbox, tmp_path):
    assert sh(sandbox, f"cd {tmp_path}")["meta"]["cwd"] == str(tmp_path)
    assert ok_text(sh(sandbox, "pwd")) == str(tmp_path)


def test_runs_link_is_moved_aside_not_followed(sandbox, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (sandbox.home / ".runs").symlink_to(target)
    text = ok_text(sh(sandbox, "echo ran"))
    assert text.startswith("ran\nnote: ") and " was a link; moved it to " in text
    assert (sandbox.home / ".runs").is_dir() and not (sandbox.home / ".runs").is_symlink()
    assert list(target.iterdir()) == []


# --- environment ----------------------------------------------------------------
def test_command_environment(sandbox):
    out = ok_text(sh(sandbox, "echo $PAGER $GIT_PAGER $GIT_TERMINAL_PROMPT $NO_COLOR $TERM $DEBIAN_FRONTEND "
                              "$GUILD_RUN_ID $GUILD_AGENT_ID $HOME"))
    assert out == f"cat cat 0 1 dumb noninteractive run1 agent1 {sandbox.home}"


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_gh_token_follows_the_repository_folder(sandbox):
    repos = sandbox.home / "repos"
    for name in ("web/src", "web2", "api"):
        (repos / name).mkdir(parents=True)
    agent = sandbox.state / "agent1"
    agent.mkdir()
    tokens = {str(repos / "web"): "tok-web-1234567", str(repos / "api"): "tok-api-7654321"}
    (agent / "repos.json").write_text(json.dumps(tokens))
    sandbox.env["GH_TOKEN"] = "outer-token-value"
    show = 'printf %s "${GH_TOKEN-unset}" | sha256sum | cut -c1-64'
    moved = "\n[working directory now: ~/repos/{}]".format
    assert ok_text(sh(sandbox, "cd repos/web/src && " + show)) == _sha("unset") + moved("web/src")
    assert ok_text(sh(sandbox, show)) == _sha("tok-web-1234567")
    assert ok_text(sh(sandbox, "echo $GH_TOKEN; cd ../../web2")) == "[REDACTED]" + moved("web2")
    assert ok_text(sh(sandbox, show + "; cd ../api")) == _sha("unset") + moved("api")
    assert ok_text(sh(sandbox, show + "; cd ..")) == _sha("tok-api-7654321") + "\n[working directory now: ~/repos]"
    assert ok_text(sh(sandbox, show)) == _sha("unset")


# --- timeouts ---------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [1, 600])
def test_timeout_edges_accepted(sandbox, timeout):
    assert ok_text(sh(sandbox, "echo ok", timeout_seconds=timeout)) == "ok"


@pytest.mark.parametrize("value", [0, 601, True, "5", 1.5, -1])
def test_bad_timeouts_refused_by_name(sandbox, value):
    assert error_text(sh(sandbox, "echo no", timeout_seconds=value)).startswith("timeout_seconds: ")


def test_nan_timeout_refused(sandbox):
    raw = json.dumps(sandbox.request("shell", {"command": "true", "timeout_seconds": float("nan")}))
    proc = sandbox.run_raw(b64encode(raw.encode()).decode())
    assert "NaN" in error_text(decode_envelope(proc.stdout))


def test_timeout_kills_the_group_and_keeps_output(sandbox):
    kid = sandbox.home / "kid"
    started = time.monotonic()
    env = sh(sandbox, f"sleep 30 & echo $! > {kid}; echo before; sleep 30", timeout_seconds=1)
    took = time.monotonic() - started
    text = ok_text(env)
    assert text == "before\n" + TIMED_OUT.format(1) + "\nexit_code: 124"
    assert env["meta"]["exit_code"] == 124 and env["meta"]["timed_out"] is True
    assert 1 <= took < 4
    assert gone(int(kid.read_text()))


def test_timeout_sigkills_what_ignores_sigterm(sandbox):
    started = time.monotonic()
    env = sh(sandbox, "trap '' TERM; echo stubborn; sleep 30", timeout_seconds=1)
    took = time.monotonic() - started
    assert ok_text(env).endswith("stubborn\n" + TIMED_OUT.format(1) + "\nexit_code: 124")
    assert 3 <= took < 6.5


@pytest.mark.parametrize(
    "command",
    ["sleep 30 & echo $! > {p}", "(sleep 30 & echo $! > {p})", "setsid sleep 30 & echo $! > {p}"],
)
def test_grandchild_holding_the_pipe_does_not_hang(sandbox, command):
    pidfile = sandbox.home / "pid"
    try:
        started = time.monotonic()
        env = sh(sandbox, command.format(p=pidfile) + "; echo done", timeout_seconds=20)
        assert time.monotonic() - started < 5  # far below the 30 s the grandchild lives
        assert ok_text(env) == "done" and env["meta"]["exit_code"] == 0
    finally:
        kill_pids(pidfile)


# --- shaping ---------------------------------------------------------------------
def test_ansi_and_carriage_returns(sandbox):
    command = r"printf '\033[31mred\033[0m\n\033]0;title\007a\rb\nprog 1%%\rprog 99%%\rdone\nwin\r\n'"
    assert ok_text(sh(sandbox, command)) == "red\nb\ndone\nwin"


def test_long_output_elided_exactly_with_full_log(sandbox):
    raw = "".join(f"{i}\n" for i in range(1, 20001)).encode()
    env = sh(sandbox, "seq 1 20000; exit 2")
    text = ok_text(env)
    assert len(text.encode()) <= 8192
    match = MARKER_RE.search(text)
    head, tail = text[: match.start()], text[match.end() :]
    assert tail.endswith("\nexit_code: 2")
    tail = tail[: -len("\nexit_code: 2")]
    assert raw.startswith(head.encode()) and head.endswith("\n") and len(head) <= 2048
    assert raw.endswith(tail.encode() + b"\n") and 5000 <= len(tail) <= 6144
    assert int(match.group(1)) == len(raw) - len(head) - len(tail) - 1
    log = match.group(2)
    assert log == env["meta"]["log_path"] == str(run_dir(sandbox) / "c1.log")
    with open(log, "rb") as fh:
        assert fh.read() == raw


def test_a_short_whole_output_makes_no_log_file(sandbox):
    listed = ok_text(sh(sandbox, f"echo hi; ls -a {run_dir(sandbox)}"))
    assert listed.splitlines()[0] == "hi" and "c1.log" not in listed  # not even while it ran


def test_an_elided_output_within_the_hold_gets_its_whole_log(sandbox):
    raw = "".join(f"{i}\n" for i in range(1, 3001)).encode() + b"E   assert 1 == 2\n"
    raw += "".join(f"{i}\n" for i in range(3001, 5001)).encode()
    assert len(raw) < 64 * 1024  # held in memory until the elision needs it
    env = sh(sandbox, "seq 1 3000; echo 'E   assert 1 == 2'; seq 3001 5000", extra={"max_bytes": 1024})
    assert MARKER_RE.search(ok_text(env)) and env["meta"]["error_lines"] == [3001]
    with open(env["meta"]["log_path"], "rb") as fh:
        assert fh.read() == raw


def test_an_output_past_the_hold_is_in_its_log_while_the_command_runs(sandbox):
    log = run_dir(sandbox) / "c1.log"
    env = sh(sandbox, f"head -c 70000 /dev/zero | tr '\\0' x; echo; sleep 0.5; stat -c %s {log}")
    size = int(ok_text(env).rsplit("\n", 2)[-1])
    assert size >= 70001  # past the 64 KiB hold: written as it came
    with open(env["meta"]["log_path"], "rb") as fh:
        assert fh.read() == b"x" * 70000 + b"\n" + f"{size}\n".encode()


def test_small_cap_is_respected(sandbox):
    text = ok_text(sh(sandbox, "seq 1 5000", extra={"max_bytes": 1024}))
    assert len(text.encode()) <= 1024 and MARKER_RE.search(text)


def test_output_that_fits_with_trailer_only_just(sandbox):
    # 8192 bytes of output fit; the exit trailer pushes it over, so it is elided.
    fits = ok_text(sh(sandbox, "head -c 8191 /dev/zero | tr '\\0' x; echo"))
    assert fits == "x" * 8191
    over = sh(sandbox, "head -c 8191 /dev/zero | tr '\\0' x; echo; exit 1")
    assert MARKER_RE.search(ok_text(over)) and len(ok_text(over).encode()) <= 8192


def test_secrets_redacted_before_any_cut(sandbox):
    secret = "s3cr3t-Value-abcdefgh"
    sandbox.env["MY_SECRET"] = secret
    command = (
        "for n in 2030 2040 2045 2050; do head -c $n /dev/zero | tr '\\0' a; echo $MY_SECRET; done; "
        "seq 1 3000; printf 's3cr3t\\033[1m-Value-abcdefgh\\n'; "
        "for n in 5990 6010 6030; do echo $MY_SECRET; head -c $n /dev/zero | tr '\\0' b; echo; done"
    )
    env = sh(sandbox, command, extra={"redact_env": ["MY_SECRET"]})
    text = ok_text(env)
    assert "[REDACTED]" in text
    for i in range(len(secret) - 7):
        assert secret[i : i + 8] not in text
    with open(env["meta"]["log_path"], "rb") as fh:
        assert fh.read().count(secret.encode()) == 7  # the log is unredacted


def _measured_call(sandbox, command):
    """Run the helper under a parent that reports its children's peak RSS (KiB)."""
    arg = b64encode(json.dumps(sandbox.request("shell", {"command": command})).encode()).decode()
    code = (
        "import resource,subprocess,sys\n"
        "p=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE)\n"
        "print(p.stdout.decode().strip());print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    proc = subprocess.run(
        [PYTHON, "-I", "-S", "-c", code, PYTHON, "-I", "-S", str(sandbox.helper), arg],
        env=sandbox.process_env(), capture_output=True, timeout=120, check=True,
    )
    line, rss = proc.stdout.decode().split()
    return decode_envelope(line.encode()), int(rss)


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, size",
    [("head -c 200M /dev/zero | tr '\\0' a", 200 << 20), ("yes 'a line of output' | head -c 100M", 100 << 20)],
)
def test_huge_output_keeps_memory_bounded(sandbox, command, size):
    with sized_tmpfs(sandbox.home, size + (16 << 20), mode="0755"):  # the log is the size of the output
        env, rss_kib = _measured_call(sandbox, command)
        text = ok_text(env)
        assert len(text.encode()) <= 8192 and MARKER_RE.search(text)
        assert os.path.getsize(env["meta"]["log_path"]) == size
    assert rss_kib < 48 * 1024, rss_kib  # holding the output would take 100+ MiB


def test_python_used_is_the_tests_interpreter():
    assert os.path.realpath(sys.executable) == PYTHON


def _call_by_file(sandbox, req):
    folder = sandbox.state / "requests"
    folder.mkdir(exist_ok=True)
    path = folder / f"{req['run_id']}-{req['call_id']}.json"
    path.write_text(json.dumps(req))
    return decode_envelope(sandbox.run_raw(str(path)).stdout)


def test_command_longer_than_one_argv_string(sandbox):
    command = "v='" + "x" * 150_000 + "'\necho ${#v} $0 $# $LINENO; cd /tmp; exit 4"
    env = _call_by_file(sandbox, sandbox.request("shell", {"command": command}))
    assert ok_text(env) == "150000 bash 0 2\n[working directory now: /tmp]\nexit_code: 4"
    assert env["meta"]["cwd"] == "/tmp"
    assert os.listdir(run_dir(sandbox)) == ["cwd"]


@pytest.mark.parametrize("command", ["sleep 30 & echo $! > {p}; wait", "trap '' TERM; sleep 30 & echo $! > {p}; wait"])
def test_helper_told_to_stop_ends_the_commands_group(sandbox, command):
    pidfile = sandbox.home / "pid"
    arg = b64encode(json.dumps(sandbox.request("shell", {"command": command.format(p=pidfile)})).encode()).decode()
    helper = subprocess.Popen([PYTHON, "-I", "-S", str(sandbox.helper), arg], env=sandbox.process_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.monotonic()
        helper.send_signal(signal.SIGTERM)
        out, _ = helper.communicate(timeout=10)
        assert time.monotonic() - began < 2.5
        assert decode_envelope(out)["ok"] is True
        assert gone(int(pidfile.read_text()))
    finally:
        helper.kill()
        kill_pids(pidfile)


def test_a_command_longer_than_one_argv_string_runs_from_a_file_that_is_removed_after(sandbox):
    """Past COMMAND_ARGV_MAX the command is sourced from a file in the run folder, gone at the call's end."""
    from guilds_code import limits as code_limits

    filler = "x" * (code_limits.COMMAND_ARGV_MAX + 1024)
    request = sandbox.request("shell", {"command": f": '{filler}'; echo \"$0\" | grep -c bash; echo done"})
    if sandbox.transport == "exec":  # too long for the one-shot argv: a request file, as the transport writes
        (sandbox.state / "requests").mkdir(exist_ok=True)
        path = sandbox.state / "requests" / f"{request['call_id']}.json"
        path.write_text(json.dumps(request))
        env = decode_envelope(sandbox.run_raw(str(path)).stdout.strip())
    else:
        env = sandbox.call_request(request)
    assert ok_text(env) == "1\ndone"
    assert not list(run_dir(sandbox).glob("*.sh"))
    short = sh(sandbox, "ls -a \"$(pwd)\" >/dev/null; echo short")
    assert ok_text(short) == "short" and not list(run_dir(sandbox).glob("*.sh"))
