"""shell: run `bash -c COMMAND` in the run's working directory, output shaped.

Contract (code-tools.md "shell", contract.md):
- stdin is /dev/null; stdout and stderr share one pipe; the command gets its own
  session and process group; the environment is the helper's own plus
  COMMAND_ENV, GUILD_RUN_ID, GUILD_AGENT_ID, and GH_TOKEN set to the token of
  the repository whose folder holds the working directory (unset elsewhere).
- The shell's final directory (physical) becomes the run's working directory.
  An EXIT trap prepended on the command's first line writes it to a file (not
  a pipe a background grandchild could hold), so $0, $@, line numbers and
  `exit N` behave as in plain `bash -c`. A command that replaces that trap, or
  ends by exec, keeps the old working directory.
- Past timeout_seconds: SIGTERM to the group, SIGKILL SHELL_KILL_GRACE_SECONDS
  later; exit_code 124. Once bash has exited, the pipe is read for at most
  SHELL_DRAIN_SECONDS more, so a grandchild holding it cannot pin the call.
- Every raw byte goes to <run dir>/<call id>.log as it arrives; memory holds a
  bounded picture (shaping.Capture). The log is kept only when output was elided.
- A command longer than COMMAND_ARGV_MAX bytes is written to <call id>.sh in
  the run folder and sourced (`. FILE`): one argv string holds 128 KiB at most.
- A helper told to stop (SIGTERM, SIGHUP, SIGINT) mid-command ends the command's
  group first: its own session would otherwise outlive the helper.
"""

from __future__ import annotations

import os

from .. import limits, notes, proc, protocol, runstate, shaping
from .supervise import execute

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

    from .supervise import Outcome

COMMAND_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
    # Nothing may stop to ask: stdin is closed and there is no terminal, so a
    # prompt would only sit until the timeout. Each names the non-asking answer.
    "GIT_EDITOR": "true",  # commit, merge, tag messages: keep git's default message
    "GIT_SEQUENCE_EDITOR": "true",  # rebase -i: run the todo list as written
    "EDITOR": "true",  # crontab -e, gh, anything else that opens $EDITOR
    "VISUAL": "true",  # the same, for programs that ask $VISUAL first
    "GIT_ASKPASS": "echo",  # a git credential prompt gets an empty answer and fails
    "SSH_ASKPASS": "echo",  # the same for ssh, when it would use askpass at all...
    "SSH_ASKPASS_REQUIRE": "never",  # ...which it never does: it fails instead of asking
    "PIP_NO_INPUT": "1",  # pip fails rather than asking (credentials, confirmations)
    "npm_config_yes": "true",  # npx and npm init install or proceed without asking
}
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_SHELL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-")


def run(request: protocol.Request) -> protocol.Reply:
    """The shell op: foreground, or a background start when args.background."""
    if request.args["background"]:
        from . import background

        return background.start(request)
    return run_foreground(request)


# --- environment -----------------------------------------------------------
def repo_token(cwd: str, tokens: Dict[str, str]) -> Optional[str]:
    """The token of the deepest repository folder holding cwd (whole path
    components compared, each folder also as its links resolve), or None."""
    best, best_len = None, -1
    for folder, token in tokens.items():
        for candidate in {folder, os.path.realpath(folder)}:
            if _holds(candidate, cwd) and len(candidate) > best_len:
                best, best_len = token, len(candidate)
    return best


def _holds(folder: str, path: str) -> bool:
    try:
        return os.path.commonpath([folder, path]) == folder
    except ValueError:
        return False


def command_env(request: protocol.Request, cwd: str, tokens: Dict[str, str]) -> Dict[str, str]:
    """The environment a command runs with (see the module docstring)."""
    env = dict(os.environ)
    env.update(COMMAND_ENV)
    env["GUILD_RUN_ID"] = request.run_id
    env["GUILD_AGENT_ID"] = request.agent_id
    token = repo_token(cwd, tokens)
    if token is None:
        env.pop("GH_TOKEN", None)
    else:
        env["GH_TOKEN"] = token
    return env


def start_bash(argv: List[str], cwd: str, env: Dict[str, str], stdout: int) -> proc.Child:
    """Start argv (bash) in cwd in its own session, stdin /dev/null, stderr with stdout."""
    try:
        return proc.spawn(argv, env, stdout=stdout, stderr=proc.STDOUT, cwd=cwd, session=True)
    except OSError as exc:
        raise protocol.OpError(f"cannot start bash in {cwd}: {exc.strerror}") from None


def open_log(path: str) -> int:
    """Open (truncate) a log for writing, refusing a link in its place."""
    try:
        return os.open(path, _LOG_FLAGS, 0o600)
    except OSError as exc:
        raise protocol.OpError(f"cannot write the log {path}: {exc.strerror}") from None


def quote(word: str) -> str:
    """word as one bash word: shlex.quote, without importing shlex (and re)."""
    if not word:
        return "''"
    if _SHELL_SAFE.issuperset(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command_script(command: str, spill_path: str) -> str:
    """What to give `bash -c`: the command itself, or, when it would not fit in
    one argv string, `. FILE` after writing it to spill_path."""
    data = command.encode("utf-8", "surrogateescape")
    if len(data) <= limits.COMMAND_ARGV_MAX:
        return command
    try:
        runstate.atomic_write(spill_path, data)
    except OSError as exc:
        raise protocol.OpError(f"cannot write the command to {spill_path}: {exc.strerror}") from None
    return f". {quote(spill_path)}"


# --- foreground --------------------------------------------------------------
def cd_capture(pwd_file: str) -> str:
    """The prefix that records the shell's final directory in pwd_file."""
    record = f"builtin pwd -P 2>/dev/null >| {quote(pwd_file)}"
    return f"trap {quote(record)} EXIT; "


def run_foreground(request: protocol.Request) -> protocol.Reply:
    cwd = runstate.current_cwd(request)
    folder = runstate.run_dir(request)
    log = os.path.join(folder, f"{request.call_id}.log")
    pwd_file = os.path.join(folder, f".{request.call_id}.pwd")
    capture, outcome = _run_logged(request, cwd, log, pwd_file)
    new_cwd = _record_cwd(request, folder, pwd_file)
    trailers = _trailers(outcome, request.args["timeout_seconds"])
    trailers[-1:-1] = notes.after_run(capture, outcome.timed_out, request.home, cwd, new_cwd)
    out = shaping.render_full(capture, request.max_bytes, log, [t for t in trailers if t],
                              find_errors=_error_finder(request, log))
    meta = {"exit_code": outcome.exit_code, "cwd": new_cwd, "timed_out": outcome.timed_out}
    if out.elided:
        meta["log_path"] = log
        meta["bytes_elided"] = out.elided_bytes
        if out.error_lines:
            meta["error_lines"] = out.error_lines
    else:
        runstate.unlink_quietly(log)
    return protocol.Reply(text=out.text, meta=meta)


def _error_finder(request: protocol.Request, log: str):
    """find_errors for render_full: the log's first error lines from a line on."""

    def find(first_line: int):
        from .. import errorlines  # only when output was elided

        return errorlines.scan(log, first_line, runstate.redactor_for(request))

    return find


def _run_logged(request: protocol.Request, cwd: str, log: str, pwd_file: str):
    """Run the command; return its Capture and Outcome (the log is written)."""
    tokens = runstate.load_repo_tokens(request)
    capture = shaping.Capture(request.max_bytes)
    sink = _Sink(open_log(log), shaping.Shaper(runstate.redactor_for(request, tokens)), capture)
    spill = pwd_file[: -len(".pwd")] + ".sh"
    argv = ["bash", "-c", cd_capture(pwd_file) + command_script(request.args["command"], spill)]
    try:
        child = start_bash(argv, cwd, command_env(request, cwd, tokens), proc.PIPE)
        outcome = execute(child, request.args["timeout_seconds"], sink.write)
    finally:
        sink.close()
        runstate.unlink_quietly(spill)
    return capture, outcome


def _record_cwd(request: protocol.Request, folder: str, pwd_file: str) -> str:
    """Save the directory the shell ended in; return the run's cwd now."""
    final = _final_cwd(folder, pwd_file)
    if final is not None:
        runstate.save_cwd(request, final)
    return runstate.current_cwd(request)


def _trailers(outcome: Outcome, timeout: int) -> List[str]:
    """The closing lines; the last is the exit code line, or "" when none (dropped)."""
    if outcome.timed_out:
        return [f"[timed out after {timeout}s; the command was stopped]", f"exit_code: {outcome.exit_code}"]
    return [f"exit_code: {outcome.exit_code}" if outcome.exit_code else ""]


def _final_cwd(folder: str, pwd_file: str) -> Optional[str]:
    raw = runstate.read_small(folder, [os.path.basename(pwd_file)])
    runstate.unlink_quietly(pwd_file)
    if not raw or not raw.endswith(b"\n"):
        return None
    path = os.fsdecode(raw[:-1])
    return path if path.startswith("/") and os.path.isdir(path) else None


class _Sink:
    """Each chunk: raw to the log (unredacted), shaped into the capture."""

    def __init__(self, log_fd: int, shaper: shaping.Shaper, capture: shaping.Capture):
        self._fd: Optional[int] = log_fd
        self._shaper = shaper
        self._capture = capture

    def write(self, data: bytes) -> None:
        self._log(data)
        self._capture.add(self._shaper.feed(data))

    def _log(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view and self._fd is not None:
                view = view[os.write(self._fd, view) :]
        except OSError:
            self._close_log()

    def _close_log(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._capture.add(self._shaper.flush())
        self._close_log()
