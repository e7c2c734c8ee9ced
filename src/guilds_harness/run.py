"""code_task: snapshot the repository, run the harness, read its stream, report.

Statuses (``meta.status``, first word of the result):

    completed        the harness's final event reported success and it exited 0
                     (or was stopped for not exiting after it: see process.py)
    failed           its final event reported an error (or it exited non-zero after it)
    timed out        timeout_minutes passed; its process group was stopped
    unknown session  session_id names a session the harness does not know
    not installed    the harness's program is not on PATH (nothing ran)
    crashed          it ended without its final event: killed by a signal, or
                     exited on its own, or printed no events it understood

Every status but "not installed" and "unknown session" (when the adapter
tells before starting) comes with a diffstat and the log; the log is always
written. Whatever the status, nothing the harness started is left running
(process.Leftovers).
"""

from __future__ import annotations

import collections
import os
import shutil
from typing import Deque, Dict

from guilds_code import protocol, reach, runstate
from guilds_code.command import command_env
from guilds_code.ops.background import running_run_dirs

from . import diffstat, harnesses, limits, process, report
from .request import HarnessRequest, TaskArgs, resolve_repo
from .stream import EventLog, LineFramer


def prompt(task: TaskArgs) -> str:
    """The brief, then the notes under their own heading."""
    if task.notes and task.notes.strip():
        return f"{task.brief.rstrip()}\n\nNotes:\n{task.notes.strip()}"
    return task.brief


class _Streams:
    """stdout -> events into the parser; stderr -> log and a bounded tail."""

    def __init__(self, log: EventLog, parser) -> None:
        self.log, self.parser = log, parser
        self.out = LineFramer(limits.LINE_MAX_BYTES)
        self.err = LineFramer(limits.STDERR_LINE_MAX_BYTES)
        self.stderr_tail: Deque[str] = collections.deque(maxlen=limits.STDERR_TAIL_LINES)
        self.events = 0
        self.other_lines = 0

    def on_stdout(self, data: bytes) -> None:
        for line in self.out.feed(data):
            self._line(line)

    def _line(self, line) -> None:
        event = self.log.stdout_line(line, limits.OVERSIZED_HEAD_BYTES)
        if event is None:
            self.other_lines += bool(line.size)
            return
        self.events += 1
        self.parser.feed(event)

    def on_stderr(self, data: bytes) -> None:
        for line in self.err.feed(data):
            self.stderr_tail.append(self.log.stderr_line(line))

    def flush(self) -> None:
        for line in self.out.flush():
            self._line(line)
        for line in self.err.flush():
            self.stderr_tail.append(self.log.stderr_line(line))


def run(request: HarnessRequest) -> protocol.Reply:
    """The op: one code_task, start to end (see the module docstring)."""
    task = request.task
    if task is None:  # parse_request always sets it; a HarnessRequest made in code may not
        raise protocol.OpError("code_task: the request has no task")
    name, repo = resolve_repo(request, runstate.current_cwd(request))
    if not os.path.isdir(repo):
        blocked = reach.out_of_reach(repo, request.home)
        if blocked is not None:
            raise protocol.OpError(f"repo: the folder of {name}, {repo}, is out of reach: {blocked}")
        raise protocol.OpError(f"repo: the folder of {name}, {repo}, does not exist")
    adapter = harnesses.get(request.harness)
    tokens = runstate.load_repo_tokens(request)
    env = command_env(request, repo, tokens)  # what a shell command there would get
    env.update(adapter.environ())
    log = EventLog(runstate.log_path(request, keep_also=running_run_dirs))
    rep = report.Report(status="crashed", harness=adapter.name, repo=name, cwd=repo, log_path=log.path)
    try:
        _execute(rep, adapter, task, env, log)
    finally:
        log.record("end", status=rep.status, exit_code=rep.exit.exit_code if rep.exit else None,
                   session_id=rep.session_id, error=rep.error)
        log.close()
    return report.render(rep, request.max_bytes, runstate.redactor_for(request, tokens))


def _execute(rep: report.Report, adapter, task: TaskArgs, env: Dict[str, str], log: EventLog) -> None:
    argv = adapter.argv(prompt(task), task.session_id)
    log.record("start", harness=adapter.name, argv=argv, cwd=rep.cwd, repo=rep.repo,
               session_id=task.session_id, timeout_minutes=task.timeout_minutes)
    rep.session_id = task.session_id
    program = shutil.which(adapter.executable, path=env.get("PATH", os.defpath))
    if program is None:
        rep.status = "not installed"
        rep.error = f"{adapter.name} is not installed: no {adapter.executable} on PATH"
        return
    if task.session_id and adapter.unknown_session(task.session_id, env):
        _unknown_session(rep, task.session_id)
        return
    before = diffstat.snapshot(rep.cwd, env)
    streams = _Streams(log, adapter.parser())
    try:
        ended = process.run_process(
            [program] + argv[1:], rep.cwd, env, task.timeout_minutes * 60,
            streams.on_stdout, streams.on_stderr, lambda: streams.parser.outcome().finished,
        )
    except OSError as exc:
        rep.status, rep.error = "not installed", f"cannot start {program}: {exc.strerror}"
        return
    rep.exit = ended
    streams.flush()
    rep.stat = _stat(before, diffstat.snapshot(rep.cwd, env), env)
    rep.outcome = streams.parser.outcome()
    _decide(rep, ended, task, streams)


def _stat(before, after, env):
    for snap in (before, after):
        if isinstance(snap, diffstat.Unavailable):
            return snap
    return diffstat.diffstat(before, after, env)


def _unknown_session(rep: report.Report, session_id: str) -> None:
    rep.status = "unknown session"
    rep.session_id = None
    rep.error = f"{rep.harness} has no session {session_id}; start a new one without session_id"


def _decide(rep: report.Report, ex: process.Exit, task: TaskArgs, streams: _Streams) -> None:
    out = rep.outcome
    rep.session_id = out.session_id or task.session_id
    if ex.timed_out:
        rep.status = "timed out"
        rep.error = f"stopped after {task.timeout_minutes} min (timeout_minutes)"
    elif out.unknown_session:
        _unknown_session(rep, task.session_id or "")
    elif out.finished and out.ok and (ex.exit_code == 0 or ex.lingered):
        rep.status, rep.error = "completed", None
    elif out.finished:
        rep.status = "failed"
        rep.error = out.error or f"{rep.harness} reported success but exited with {ex.exit_code}"
    else:
        rep.status, rep.error = "crashed", _crash_reason(rep, ex, streams)


def _crash_reason(rep: report.Report, ex: process.Exit, streams: _Streams) -> str:
    how = (f"was killed by {report.signal_name(ex.signal)}" if ex.signal
           else f"exited with {ex.exit_code}")
    parts = [f"{rep.harness} {how} before its final event"]
    if streams.other_lines:
        parts.append(f"it printed {streams.other_lines} lines that are not {rep.harness} events")
    elif streams.events == 0:
        parts.append("it printed no events")
    if rep.outcome.error:
        parts.append(rep.outcome.error)
    if streams.stderr_tail:
        parts.append("stderr: " + streams.stderr_tail[-1])
    return "; ".join(parts)
