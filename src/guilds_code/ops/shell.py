"""shell: run `bash -c COMMAND` in the run's working directory, output shaped.

Contract (docs/helper.md, "shell"):
- stdin is /dev/null; stdout and stderr share one pipe; the command gets its own
  session and process group; the environment is the helper's own plus
  COMMAND_ENV, GUILD_RUN_ID, GUILD_AGENT_ID, and GH_TOKEN set to the token of
  the repository whose folder holds the working directory (unset elsewhere).
- The shell's final directory (physical) becomes the run's working directory.
  An EXIT trap prepended on the command's first line writes it to descriptor
  PWD_FD, a memfd (or, where there is none, a file the helper made in the run
  folder and unlinked at once): not a pipe a background grandchild could hold,
  nor a path the command could swap,
  so $0, $@, line numbers and `exit N` behave as in plain `bash -c`. A command
  that replaces that trap, closes PWD_FD, or ends by exec, keeps the old
  working directory.
- Past timeout_seconds: SIGTERM to the group, SIGKILL SHELL_KILL_GRACE_SECONDS
  later; exit_code 124. Once bash has exited, the pipe is read for at most
  SHELL_DRAIN_SECONDS more, so a grandchild holding it cannot pin the call.
- Every raw byte goes to <run dir>/<call id>.log: held in memory until the
  output passes LOG_HOLD_BYTES, then written as it arrives; memory holds a bounded
  picture (shaping.Capture). The log is kept only when output was elided (an
  elided output shorter than the hold is written then); a call whose output is
  short and whole makes no file.
- A command longer than COMMAND_ARGV_MAX bytes is written to <call id>.sh in
  the run folder and sourced (`. FILE`): one argv string holds 128 KiB at most.
- A helper told to stop (SIGTERM, SIGHUP, SIGINT) mid-command ends the command's
  group first: its own session would otherwise outlive the helper.
- When the call ends (normally, at the timeout, or cancelled), the processes it
  started that left its group (setsid, a daemon) are ended (escaped.py); its
  group's ``cmd &`` jobs run on after a normal end.
- State that cannot be kept (the run folder, its cwd file, the log: tampered
  with, or a full disk) never costs the command or its output: a line
  ``note: ...`` per loss goes before the exit code, and an elided output whose
  log could not be written says ``full output: not kept (why)``.
"""

from __future__ import annotations

import os

from .. import escaped, limits, proc, protocol, runstate, shaping, supervise, watchdog
from ..command import PWD_FD, command_env, command_script, open_log, quote, start_bash
from ..notes import after_run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Set

_PWD_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
def cd_capture() -> str:
    """The prefix that records the shell's final directory on PWD_FD."""
    record = f"builtin pwd -P 2>/dev/null >&{PWD_FD}"
    return f"trap {quote(record)} EXIT; "


def open_pwd_file(folder: str, call_id: str) -> Optional[int]:
    """A file for the shell's final directory that no path names: a memfd where the
    kernel gives one (no file made and unlinked in the run folder, a tenth of a
    millisecond a call), else a new file in folder, unlinked at once; None when
    neither can be made."""
    try:
        return os.memfd_create(f"guilds-pwd-{call_id}", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memfd (an old kernel, a seccomp filter): the file
        pass
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
    folder, held = runstate.held_run_dir(request, notes, keep_also=_running_run_dirs)
    try:  # held: no prune of another run removes the folder while this call uses it
        return _run_in(request, notes, cwd, folder)
    finally:
        if held is not None:
            os.close(held)


def _run_in(request: protocol.Request, notes: List[str], cwd: str, folder: Optional[str]) -> protocol.Reply:
    log = os.path.join(folder, f"{request.call_id}.log") if folder else None
    pwd_fd = open_pwd_file(folder, request.call_id) if folder else None
    try:
        capture, outcome, sink = _run_logged(request, cwd, log, pwd_fd)
        new_cwd = _record_cwd(request, folder, pwd_fd, notes) if folder else cwd
    finally:
        if pwd_fd is not None:
            os.close(pwd_fd)
    closing = _trailers(outcome, request.args["timeout_seconds"])
    at = len(closing) - 1 if outcome.exit_code else len(closing)  # before the exit_code line
    closing[at:at] = after_run(capture, outcome.timed_out, request.home, cwd, new_cwd)
    out, shown_log = _rendered(request, capture, log, sink, notes + closing)
    meta = {"exit_code": outcome.exit_code, "cwd": new_cwd, "timed_out": outcome.timed_out}
    if out.elided:
        meta["bytes_elided"] = out.elided_bytes
        if out.error_lines:
            meta["error_lines"] = out.error_lines
    if out.elided and shown_log == log:
        meta["log_path"] = log
    elif log and sink.opened:
        runstate.unlink_quietly(log)
    return protocol.Reply(text=out.text, meta=meta)


def _rendered(request: protocol.Request, capture: shaping.Capture, log: Optional[str], sink: _Sink,
              closing: List[str]):
    """(the output rendered, the log as its marker names it). An elided output needs the
    log whole: what the sink still holds is written first, and a log that then cannot be
    written is named ``not kept (why)`` as one that failed earlier."""
    shown_log = log if log and not sink.error else f"not kept ({sink.error or 'no run folder'})"
    finder = _error_finder(request, log, sink) if log and shown_log == log else None
    out = shaping.render_full(capture, request.max_bytes, shown_log, closing, find_errors=finder)
    if out.elided and shown_log == log and not sink.flush():
        shown_log = f"not kept ({sink.error})"
        out = shaping.render_full(capture, request.max_bytes, shown_log, closing)
    return out, shown_log


def _error_finder(request: protocol.Request, log: str, sink: _Sink):
    """find_errors for render_full: the log's error lines from a line on (the log written
    whole first); none for a command that only prints files (their text is no diagnostic)."""

    def find(first_line: int):
        from .. import errorlines, fileprint  # only when output was elided

        if fileprint.prints_files(request.args["command"]) or not sink.flush():
            return []
        return errorlines.scan(log, first_line, runstate.redactor_for(request))

    return find


def _run_logged(request: protocol.Request, cwd: str, log: Optional[str], pwd_fd: Optional[int]):
    """Run the command; return its Capture, Outcome, and the _Sink that holds its log."""
    tokens = runstate.load_repo_tokens(request)
    capture = shaping.Capture(request.max_bytes)
    sink = _Sink(log, shaping.Shaper(runstate.redactor_for(request, tokens)), capture)
    spill = log[: -len(".log")] + ".sh" if log else _private_spill(request)
    prefix = cd_capture() if pwd_fd is not None else ""
    script = command_script(request.args["command"], spill)
    argv = ["bash", "-c", prefix + script]
    env = command_env(request, cwd, tokens)
    env[escaped.CALL_KEY_ENV] = key = escaped.new_key()
    try:
        with supervise.Supervisor() as supervisor:  # a cancel is caught from the start on
            since = escaped.boot_ticks()
            child = start_bash(argv, cwd, env, proc.PIPE, pwd_fd)
            call = escaped.start(key, child.pid, since)
            try:
                outcome = execute(supervisor, child, request.args["timeout_seconds"], sink.write)
            finally:
                escaped.end(call)
    finally:
        sink.close()
        if script != request.args["command"]:  # the command went to the spill file
            runstate.unlink_quietly(spill)
    return capture, outcome, sink


class Outcome:
    """How a command ended: its exit code (124 at the timeout) and whether it timed out."""

    __slots__ = ("exit_code", "timed_out")

    def __init__(self, exit_code: int, timed_out: bool):
        self.exit_code, self.timed_out = exit_code, timed_out


def execute(supervisor: supervise.Supervisor, child: proc.Child, timeout: float,
            sink: Callable[[bytes], None]) -> Outcome:
    """Run the started command under the one supervise loop (supervise.SHELL), its
    group watched meanwhile so that it dies with the helper, even by SIGKILL."""
    watching = watchdog.watch_group(child.pid)
    try:
        ended = supervisor.run(child, timeout, (sink,), supervise.SHELL)
    finally:
        watchdog.release(watching)
    if ended.stopped:
        return Outcome(limits.TIMEOUT_EXIT_CODE, True)
    return Outcome(exit_status(ended.returncode), False)


def exit_status(returncode: int) -> int:
    """A returncode as bash reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


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
    if final is not None and runstate.save_cwd(request, final, notes, keep_also=_running_run_dirs):
        return final  # what current_cwd would read back: the state holds it, a folder
    return runstate.current_cwd(request)


def _trailers(outcome: Outcome, timeout: int) -> List[str]:
    if outcome.timed_out:
        return [f"[timed out after {timeout}s; the command was stopped]", f"exit_code: {outcome.exit_code}"]
    return [f"exit_code: {outcome.exit_code}"] if outcome.exit_code else []


def _final_cwd(folder: str, pwd_fd: int, notes: List[str]) -> Optional[str]:
    raw = os.pread(pwd_fd, limits.STATE_FILE_MAX_BYTES, 0)
    full = "" if raw else _full(folder)
    if full:  # else the command replaced the trap, closed PWD_FD or ended by exec
        notes.append(f"note: the working directory could not be kept: the shell could not write it{full}")
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

    The log is opened only once its bytes pass limits.LOG_HOLD_BYTES, or when an
    elided output needs it (``flush``); until then its bytes are held here: a call
    whose output is short and whole makes no file. error: why the log is not whole
    (None while it is, or while nothing needed it); opened: a log file was made."""

    def __init__(self, log: Optional[str], shaper: shaping.Shaper, capture: shaping.Capture):
        self._path = log
        self._fd: Optional[int] = None
        self._held: Optional[bytearray] = bytearray() if log else None
        self._shaper = shaper
        self._capture = capture
        self.error: Optional[str] = None if log else "no run folder"
        self.opened = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            self._held += data
            if len(self._held) > limits.LOG_HOLD_BYTES:
                self.flush()
        elif self._fd is not None:
            self._log(data)
        self._capture.add(self._shaper.feed(data))

    def flush(self) -> bool:
        """The log opened and what is held written to it; False when the log is not whole."""
        held, self._held = self._held, None
        if held is not None and self._path is not None:
            try:
                self._fd = open_log(self._path)
            except protocol.OpError as exc:
                self.error = str(exc)
                return False
            self.opened = True
            self._log(bytes(held))
        return self.error is None

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
        """The end of the output: its last shaped bytes into the capture; the log, if open,
        closed (what is still held stays, for ``flush``)."""
        self._capture.add(self._shaper.flush())
        self._close_log()
