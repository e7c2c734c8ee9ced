"""shell: run `bash -c COMMAND` in the run's working directory, output shaped.

Contract (docs/helper.md, "shell"):
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

from .. import proc, protocol, runstate, shaping
from ..command import COMMAND_ENV, command_env, command_script, open_log, quote, repo_token, start_bash
from .supervise import execute

__all__ = ["COMMAND_ENV", "command_env", "command_script", "open_log", "quote", "repo_token", "run", "start_bash"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Set

    from .supervise import Outcome


def run(request: protocol.Request) -> protocol.Reply:
    """The shell op: foreground, or a background start when args.background."""
    if request.args["background"]:
        from . import background

        return background.start(request)
    return run_foreground(request)


def _running_run_dirs(request: protocol.Request) -> Set[str]:
    """The run folders a running background command still uses (asked only when pruning)."""
    from .background import running_run_dirs

    return running_run_dirs(request)


# --- foreground --------------------------------------------------------------
def cd_capture(pwd_file: str) -> str:
    """The prefix that records the shell's final directory in pwd_file."""
    record = f"builtin pwd -P 2>/dev/null >| {quote(pwd_file)}"
    return f"trap {quote(record)} EXIT; "


def run_foreground(request: protocol.Request) -> protocol.Reply:
    cwd = runstate.current_cwd(request)
    folder = runstate.run_dir(request, _running_run_dirs)
    log = os.path.join(folder, f"{request.call_id}.log")
    pwd_file = os.path.join(folder, f".{request.call_id}.pwd")
    capture, outcome = _run_logged(request, cwd, log, pwd_file)
    new_cwd = _record_cwd(request, folder, pwd_file)
    trailers = _trailers(outcome, request.args["timeout_seconds"])
    text, elided = shaping.render(capture, request.max_bytes, log, trailers)
    meta = {"exit_code": outcome.exit_code, "cwd": new_cwd, "timed_out": outcome.timed_out}
    if elided:
        meta["log_path"] = log
    else:
        runstate.unlink_quietly(log)
    return protocol.Reply(text=text, meta=meta)


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
    if outcome.timed_out:
        return [f"[timed out after {timeout}s; the command was stopped]", f"exit_code: {outcome.exit_code}"]
    return [f"exit_code: {outcome.exit_code}"] if outcome.exit_code else []


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
