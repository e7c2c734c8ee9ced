"""shell: run `bash -c COMMAND` in the run's working directory, output shaped.

Contract (code-tools.md "shell", contract.md):
- stdin is /dev/null; stdout and stderr share one pipe; the command gets its own
  session and process group; the environment is the helper's own plus
  COMMAND_ENV, GUILD_RUN_ID, GUILD_AGENT_ID, and GH_TOKEN set to the token of
  the repository whose folder holds the working directory (unset elsewhere).
- The shell's final directory (physical) becomes the run's working directory.
  An EXIT trap prepended on the command's first line writes it to descriptor
  PWD_FD, a file the helper made in the run folder and unlinked at once (not a
  pipe a background grandchild could hold, nor a path the command could swap),
  so $0, $@, line numbers and `exit N` behave as in plain `bash -c`. A command
  that replaces that trap, closes PWD_FD, or ends by exec, keeps the old
  working directory.
- Past timeout_seconds: SIGTERM to the group, SIGKILL SHELL_KILL_GRACE_SECONDS
  later; exit_code 124. Once bash has exited, the pipe is read for at most
  SHELL_DRAIN_SECONDS more, so a grandchild holding it cannot pin the call.
- Every raw byte goes to <run dir>/<call id>.log as it arrives; memory holds a
  bounded picture (shaping.Capture). The log is kept only when output was elided.
- A command longer than COMMAND_ARGV_MAX bytes is written to <call id>.sh in
  the run folder and sourced (`. FILE`): one argv string holds 128 KiB at most.
- A helper told to stop (SIGTERM, SIGHUP, SIGINT) mid-command ends the command's
  group first: its own session would otherwise outlive the helper.
- State that cannot be kept (the run folder, its cwd file, the log: tampered
  with, or a full disk) never costs the command or its output: a line
  ``note: ...`` per loss goes before the exit code, and an elided output whose
  log could not be written says ``full output: not kept (why)``.
"""

from __future__ import annotations

import os

from .. import limits, proc, protocol, runstate, shaping
from ..notes import after_run
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
PWD_FD = 87
"""The descriptor the shell writes its final directory to: high, so a command's own
`exec 3>...` (or flock's 9) does not take it."""
_PWD_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
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


def start_bash(argv: List[str], cwd: str, env: Dict[str, str], stdout: int, pwd_fd: Optional[int] = None) -> proc.Child:
    """Start argv (bash) in cwd in its own session, stdin /dev/null, stderr with
    stdout, and pwd_fd (when given) as PWD_FD."""
    passed = None if pwd_fd is None else (pwd_fd, PWD_FD)
    try:
        return proc.spawn(argv, env, stdout=stdout, stderr=proc.STDOUT, cwd=cwd, session=True, pass_fd=passed)
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
def cd_capture() -> str:
    """The prefix that records the shell's final directory on PWD_FD."""
    record = f"builtin pwd -P 2>/dev/null >&{PWD_FD}"
    return f"trap {quote(record)} EXIT; "


def open_pwd_file(folder: str, call_id: str) -> Optional[int]:
    """A new file in folder for the shell's final directory, already unlinked; None
    when it cannot be made."""
    name = os.path.join(folder, f".{call_id}.pwd")
    try:
        fd = os.open(name, _PWD_FLAGS, 0o600)
    except OSError:
        return None
    runstate.unlink_quietly(name)
    return fd


def run_foreground(request: protocol.Request) -> protocol.Reply:
    notes: List[str] = []  # state that could not be kept, one line each (runstate)
    cwd = runstate.current_cwd(request)
    folder = runstate.run_dir(request, notes)
    log = os.path.join(folder, f"{request.call_id}.log") if folder else None
    pwd_fd = open_pwd_file(folder, request.call_id) if folder else None
    try:
        capture, outcome, log_error = _run_logged(request, cwd, log, pwd_fd)
        new_cwd = _record_cwd(request, folder, pwd_fd, notes) if folder else cwd
    finally:
        if pwd_fd is not None:
            os.close(pwd_fd)
    closing = _trailers(outcome, request.args["timeout_seconds"])
    at = len(closing) - 1 if outcome.exit_code else len(closing)  # before the exit_code line
    closing[at:at] = after_run(capture, outcome.timed_out, request.home, cwd, new_cwd)
    shown_log = log if log and not log_error else f"not kept ({log_error or 'no run folder'})"
    finder = _error_finder(request, log) if shown_log == log else None
    out = shaping.render_full(capture, request.max_bytes, shown_log, notes + closing, find_errors=finder)
    meta = {"exit_code": outcome.exit_code, "cwd": new_cwd, "timed_out": outcome.timed_out}
    if out.elided:
        meta["bytes_elided"] = out.elided_bytes
        if out.error_lines:
            meta["error_lines"] = out.error_lines
    if out.elided and shown_log == log:
        meta["log_path"] = log
    elif log:
        runstate.unlink_quietly(log)
    return protocol.Reply(text=out.text, meta=meta)


def _error_finder(request: protocol.Request, log: str):
    """find_errors for render_full: the log's first error lines from a line on."""

    def find(first_line: int):
        from .. import errorlines  # only when output was elided

        return errorlines.scan(log, first_line, runstate.redactor_for(request))

    return find


def _run_logged(request: protocol.Request, cwd: str, log: Optional[str], pwd_fd: Optional[int]):
    """Run the command; return its Capture, Outcome, and why the log could not be
    written in full (None when it was)."""
    tokens = runstate.load_repo_tokens(request)
    capture = shaping.Capture(request.max_bytes)
    log_fd, log_error = _open_log_or_why(log)
    sink = _Sink(log_fd, shaping.Shaper(runstate.redactor_for(request, tokens)), capture)
    spill = log[: -len(".log")] + ".sh" if log else _private_spill(request)
    prefix = cd_capture() if pwd_fd is not None else ""
    argv = ["bash", "-c", prefix + command_script(request.args["command"], spill)]
    try:
        child = start_bash(argv, cwd, command_env(request, cwd, tokens), proc.PIPE, pwd_fd)
        outcome = execute(child, request.args["timeout_seconds"], sink.write)
    finally:
        sink.close()
        runstate.unlink_quietly(spill)
    return capture, outcome, log_error or sink.error


def _open_log_or_why(log: Optional[str]):
    """(descriptor, None), or (None, why) when the log cannot be opened."""
    if log is None:
        return None, "no run folder"
    try:
        return open_log(log), None
    except protocol.OpError as exc:
        return None, str(exc)


def _private_spill(request: protocol.Request) -> str:
    """Where a long command is written when there is no run folder."""
    folder = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(folder, f".guilds-{request.call_id}-{os.urandom(6).hex()}.sh")


def _record_cwd(request: protocol.Request, folder: str, pwd_fd: Optional[int], notes: List[str]) -> str:
    """Save the directory the shell ended in; return the run's cwd now."""
    if pwd_fd is None:
        notes.append("note: the working directory could not be kept: no file for it could be made"
                     f"{_full(folder)}")
        return runstate.current_cwd(request)
    final = _final_cwd(folder, pwd_fd, notes)
    if final is not None:
        runstate.save_cwd(request, final, notes)
    return runstate.current_cwd(request)


def _trailers(outcome: Outcome, timeout: int) -> List[str]:
    if outcome.timed_out:
        return [f"[timed out after {timeout}s; the command was stopped]", f"exit_code: {outcome.exit_code}"]
    return [f"exit_code: {outcome.exit_code}"] if outcome.exit_code else []


def _final_cwd(folder: str, pwd_fd: int, notes: List[str]) -> Optional[str]:
    raw = os.pread(pwd_fd, limits.STATE_FILE_MAX_BYTES, 0)
    if not raw and _full(folder):  # else the command replaced the trap or ended by exec
        notes.append(f"note: the working directory could not be kept: the shell could not write it{_full(folder)}")
    if not raw.endswith(b"\n"):
        return None
    path = os.fsdecode(raw[:-1])
    return path if path.startswith("/") and os.path.isdir(path) else None


def _full(folder: str) -> str:
    """': no space left on the device' when folder's filesystem is full, else ''."""
    try:
        return ": no space left on the device" if os.statvfs(folder).f_bavail == 0 else ""
    except OSError:
        return ""


class _Sink:
    """Each chunk: raw to the log (unredacted), shaped into the capture.
    error: why the log stopped being written (None while it is whole)."""

    def __init__(self, log_fd: Optional[int], shaper: shaping.Shaper, capture: shaping.Capture):
        self._fd: Optional[int] = log_fd
        self._shaper = shaper
        self._capture = capture
        self.error: Optional[str] = None

    def write(self, data: bytes) -> None:
        self._log(data)
        self._capture.add(self._shaper.feed(data))

    def _log(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view and self._fd is not None:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.error = f"the log could not be written: {exc.strerror}"
            self._close_log()

    def _close_log(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._capture.add(self._shaper.flush())
        self._close_log()
