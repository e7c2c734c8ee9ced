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
import select
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set

from .. import limits, protocol, redact, runstate, shaping

COMMAND_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
}
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_TICK = 0.05
"""Without a pidfd, how often the loop looks whether bash has exited."""


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


def redactor_for(request: protocol.Request, tokens: Dict[str, str]) -> redact.Redactor:
    """Secrets of request.redact_env plus every repository token."""
    return redact.from_environment(request.redact_env, extra=tokens.values())


def spawn(argv: List[str], cwd: str, env: Dict[str, str], stdout) -> subprocess.Popen:
    """Start argv in its own session, stdin /dev/null, stderr with stdout."""
    try:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        raise protocol.OpError(f"cannot start bash in {cwd}: {exc.strerror}") from None


def open_log(path: str) -> int:
    """Open (truncate) a log for writing, refusing a link in its place."""
    try:
        return os.open(path, _LOG_FLAGS, 0o600)
    except OSError as exc:
        raise protocol.OpError(f"cannot write the log {path}: {exc.strerror}") from None


def exit_status(returncode: int) -> int:
    """Popen's returncode as bash reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


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
    return f". {shlex.quote(spill_path)}"


# --- foreground --------------------------------------------------------------
def cd_capture(pwd_file: str) -> str:
    """The prefix that records the shell's final directory in pwd_file."""
    record = f"builtin pwd -P 2>/dev/null >| {shlex.quote(pwd_file)}"
    return f"trap {shlex.quote(record)} EXIT; "


def run_foreground(request: protocol.Request) -> protocol.Reply:
    cwd = runstate.current_cwd(request)
    folder = runstate.run_dir(request)
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
    sink = _Sink(open_log(log), shaping.Shaper(redactor_for(request, tokens)), capture)
    spill = pwd_file[: -len(".pwd")] + ".sh"
    argv = ["bash", "-c", cd_capture(pwd_file) + command_script(request.args["command"], spill)]
    try:
        proc = spawn(argv, cwd, command_env(request, cwd, tokens), subprocess.PIPE)
        outcome = execute(proc, request.args["timeout_seconds"], sink.write)
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


def _trailers(outcome: "Outcome", timeout: int) -> List[str]:
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


# --- the process loop ----------------------------------------------------------
@dataclass
class Outcome:
    exit_code: int
    timed_out: bool


def execute(proc: subprocess.Popen, timeout: float, sink: Callable[[bytes], None]) -> Outcome:
    """Pump proc's output into sink until it is done; enforce the timeout.

    Done: bash has exited and the pipe is at EOF or drained for
    SHELL_DRAIN_SECONDS; after a SIGTERM also the group is empty or killed.
    A SIGTERM, SIGHUP or SIGINT to the helper meanwhile ends the command's
    group (CANCEL_KILL_GRACE_SECONDS), which its own session would otherwise
    keep alive.
    """
    loop = _Loop(proc, timeout, sink)
    try:
        loop.run()
    finally:
        loop.close()
    if loop.timed_out:
        return Outcome(limits.TIMEOUT_EXIT_CODE, True)
    return Outcome(exit_status(proc.returncode), False)


CANCEL_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class _Loop:
    """One command's clocks: the timeout, the SIGKILL after SIGTERM, the drain."""

    def __init__(self, proc: subprocess.Popen, timeout: float, sink: Callable[[bytes], None]):
        self.proc = proc
        self.sink = sink
        self.deadline = time.monotonic() + timeout
        self.timed_out = self.cancelled = self.killed = False
        self.kill_at: Optional[float] = None
        self.exited_at: Optional[float] = None
        self.poller = select.poll()
        self.out_fd: Optional[int] = self._watch(proc.stdout.fileno())
        self.pidfd = self._watch(_pidfd(proc.pid))
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self._watch(self.wake_r)
        self.saved = {sig: signal.signal(sig, self._on_signal) for sig in CANCEL_SIGNALS}

    def _watch(self, fd: Optional[int]) -> Optional[int]:
        if fd is not None:
            self.poller.register(fd, select.POLLIN)
        return fd

    def _on_signal(self, signum, frame) -> None:
        self.cancelled = True
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    def run(self) -> None:
        while True:
            now = time.monotonic()
            self._step_clock(now)
            if self._done(now):
                return
            wait = max(0.0, self._next_event(now) - now)
            for fd, _ in self.poller.poll(int(wait * 1000) + 1):
                self._on_ready(fd)

    def _step_clock(self, now: float) -> None:
        if self.exited_at is None and self.proc.poll() is not None:
            self.exited_at = now
        if self.exited_at is None and not self.timed_out and now >= self.deadline:
            self.timed_out = True
            self._terminate(now, limits.SHELL_KILL_GRACE_SECONDS)
        if self.exited_at is None and self.cancelled:
            self._terminate(now, limits.CANCEL_KILL_GRACE_SECONDS)
        if self.kill_at is not None and not self.killed and now >= self.kill_at:
            self.killed = True
            signal_group(self.proc.pid, signal.SIGKILL)

    def _terminate(self, now: float, grace: float) -> None:
        if self.kill_at is None:
            signal_group(self.proc.pid, signal.SIGTERM)
            self.kill_at = now + grace
        self.kill_at = min(self.kill_at, now + grace)

    def _done(self, now: float) -> bool:
        if self.exited_at is None:
            return False
        drained = self.out_fd is None or now >= self.exited_at + limits.SHELL_DRAIN_SECONDS
        if self.kill_at is None or self.killed:
            return drained
        return drained and not group_alive(self.proc.pid)

    def _next_event(self, now: float) -> float:
        times = [now + 1.0]
        if self.exited_at is None:
            if self.kill_at is None:
                times.append(self.deadline)
            if self.pidfd is None:
                times.append(now + _TICK)
        elif self.out_fd is not None:
            times.append(self.exited_at + limits.SHELL_DRAIN_SECONDS)
        if self.kill_at is not None and not self.killed:
            times.append(self.kill_at)
            if self.exited_at is not None:
                times.append(now + _TICK)
        return min(times)

    def _on_ready(self, fd: int) -> None:
        if fd == self.wake_r:
            os.read(fd, 64)
        elif fd == self.pidfd:
            self.poller.unregister(fd)
            os.close(fd)
            self.pidfd = None
            self.proc.poll()
        else:
            data = os.read(fd, limits.READ_CHUNK)
            if data:
                self.sink(data)
            else:
                self.poller.unregister(fd)
                self.out_fd = None

    def close(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        for fd in (self.pidfd, self.wake_r, self.wake_w):
            if fd is not None:
                os.close(fd)
        self.proc.stdout.close()
        if self.proc.returncode is None:
            signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _pidfd(pid: int) -> Optional[int]:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """True while a process of group pgid runs (zombies awaiting reaping don't)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pgid in live_groups()


def live_groups() -> Set[int]:
    """The process groups that have a member that is not a zombie."""
    groups = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = proc_stat(int(name))
            if info is not None and info.state not in "ZX":
                groups.add(info.pgrp)
    return groups


@dataclass
class ProcStat:
    state: str
    pgrp: int
    start_time: int
    """Clock ticks after boot (field 22 of /proc/<pid>/stat): with the pid, it
    names one process for the life of the machine."""


def proc_stat(pid: int) -> Optional[ProcStat]:
    """The state, group and start time of pid from /proc, or None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    try:
        return ProcStat(fields[0].decode(), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None
