"""shell_status: list the background commands, check one (its log's end), or stop one.

The records and states are ops/background.py's. Every text is redacted, then
capped at the request's max_bytes.

A request with ``started_by`` (protocol.py) asks about the command that call
started: when record bN was not started by it (a later sandbox's bN, or no
bN at all) the answer is NOT_HELD, state ``ended``, and nothing of bN is read
or signalled.
"""

from __future__ import annotations

import os
import sys
import time

from .. import limits, proc, protocol, runstate, shaping
from .background import (
    Status,
    list_ids,
    load_record,
    mtime,
    owned,
    records_dir,
    status,
    touch_new,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, NoReturn, Optional, Tuple

    from ..redact import Redactor

_KILLER = (
    "import os,signal,sys,time\n"
    "g=int(sys.argv[1]);end=time.monotonic()+float(sys.argv[2])\n"
    "while time.monotonic()<end:\n"
    "    try: os.killpg(g,0)\n"
    "    except OSError: sys.exit(0)\n"
    f"    time.sleep({limits.STOP_KILLER_POLL_SECONDS})\n"
    "try: os.killpg(g,signal.SIGKILL)\n"
    "except OSError: pass\n"
)


NOT_HELD = "{bid} ended: it ran in an earlier sandbox (this sandbox's {bid}, if any, is another command)"


def run(request: protocol.Request) -> protocol.Reply:
    """shell_status: list, check one (id), or stop one (id, stop)."""
    folder = records_dir(request)
    bid = request.args["id"]
    waits = request.args["wait"] is not None or request.args["until"] is not None
    if request.started_by is not None and not _started_by(folder, bid, request.started_by):
        meta: Dict[str, Any] = {"background_id": bid, "state": "ended"}
        return protocol.Reply(text=NOT_HELD.format(bid=bid), meta=dict(meta, waited_ms=0) if waits else meta)
    if folder is None:  # no records, or something the agent put in their place
        if bid is not None:
            _unknown(bid)
        if waits:
            return protocol.Reply(text="no command is running\nno background commands", meta={"waited_ms": 0})
        return protocol.Reply(text="no background commands", meta={})
    if bid is None:
        return _wait_any(request, folder) if waits else _list(request, folder)
    record = load_record(folder, bid)
    if record is None:
        _unknown(bid)
    if request.args["stop"]:
        return _stop(request, folder, bid, record)
    if waits:
        return _wait_check(request, folder, bid, record)
    return _check(request, folder, status(folder, bid, record, proc.live_groups()))


def _started_by(folder: Optional[str], bid: str, call_id: str) -> bool:
    """Record bid is there and was started by call call_id."""
    record = None if folder is None else load_record(folder, bid)
    return record is not None and record.get("call") == call_id


def _unknown(bid: str) -> NoReturn:
    raise protocol.OpError(f"id: no background command {bid}")
def _wait_check(request: protocol.Request, folder: str, bid: str, record: Dict[str, Any]) -> protocol.Reply:
    """Check one command after waiting on it (ops/waiting.py); what ended the wait first."""
    from . import waiting

    before = status(folder, bid, record, proc.live_groups())
    waited = waiting.wait_one(request, record, before.state in ("running", "stopping"))
    reply = _check(request, folder, status(folder, bid, record, proc.live_groups()), lead=waited.line)
    reply.meta["waited_ms"] = waited.waited_ms
    if request.args["until"] is not None:
        reply.meta["matched"] = waited.matched
    return reply


def _wait_any(request: protocol.Request, folder: str) -> protocol.Reply:
    """List the commands after waiting for any running one to end."""
    from . import waiting

    live = proc.live_groups()
    running = waiting.running_records(folder, lambda bid, record: status(folder, bid, record, live).state)
    waited = waiting.wait_any(request, folder, running)
    reply = _list(request, folder, lead=waited.line)
    reply.meta["waited_ms"] = waited.waited_ms
    return reply


def _summary(st: Status, redactor: Redactor) -> str:
    command = str(st.record.get("command", ""))
    first = command.split("\n", 1)[0] + (" …" if "\n" in command.strip("\n") else "")
    first = shaping.clip_line(redactor.redact(first), limits.STATUS_COMMAND_MAX_CHARS)
    return f"{st.bid} {st.state} {shaping.elapsed(st.elapsed)} {first}"


def _list(request: protocol.Request, folder: str, lead: Optional[str] = None) -> protocol.Reply:
    """Every command's line; after a lead line (what ended a wait) when given."""
    redactor = runstate.redactor_for(request)
    live = proc.live_groups()
    lines = []
    for n in list_ids(folder):
        bid = f"{limits.BACKGROUND_ID_PREFIX}{n}"
        record = load_record(folder, bid)
        if record is not None:
            lines.append(_summary(status(folder, bid, record, live), redactor))
    first = "" if lead is None else lead + "\n"
    if not lines:
        return protocol.Reply(text=first + "no background commands", meta={})
    room = request.max_bytes - shaping.utf8_len(first)
    return protocol.Reply(text=first + _fit_newest(lines, room), meta={})


def _fit_newest(lines: List[str], max_bytes: int) -> str:
    """The newest lines that fit, after a line counting the ones left out."""
    kept: List[str] = []
    size = 48  # room for the line counting the others
    for line in reversed(lines):
        size += shaping.utf8_len(line) + 1
        if size > max_bytes:
            break
        kept.append(line)
    left = len(lines) - len(kept)
    head = [f"… {left} earlier commands not shown"] if left else []
    return shaping.cap_text("\n".join(head + kept[::-1]), max_bytes)


def _check(request: protocol.Request, folder: str, st: Status, lead: Optional[str] = None) -> protocol.Reply:
    """The command's line, its log, error lines before its last lines, its last lines;
    after a lead line (what ended a wait) when given."""
    redactor = runstate.redactor_for(request)
    log = str(st.record.get("log_path", ""))
    header = f"{_summary(st, redactor)}\nlog: {log}"
    if lead is not None:
        header = f"{lead}\n{header}"
    tail, window = _log_tail(log, redactor)
    errors = _errors_before(log, window, redactor, (request.max_bytes - shaping.utf8_len(header)) // 2)
    header += "".join("\n" + line for line in errors)
    budget = request.max_bytes - shaping.utf8_len(header) - 1
    if tail is None:
        body = "the log is missing"
    elif tail.total == 0:
        body = "the log is empty"
    else:
        body = f"last {limits.STATUS_TAIL_LINES} lines of the log:\n" + shaping.render(
            tail, max(0, budget - 40), log, [], head_max=0
        )[0]
    text = shaping.cap_text(f"{header}\n{body}", request.max_bytes)
    meta = _meta(st)
    if errors:
        meta["error_lines"] = [int(line.split(":", 1)[0]) for line in errors[1:]]
    return protocol.Reply(text=text, meta=meta)


BEFORE_TAIL_HEADER = f"[error lines before the last {limits.STATUS_TAIL_LINES} lines, by line number in the log:]"


def _errors_before(log: str, window: int, redactor: Redactor, room: int) -> List[str]:
    """The lines listing the log's first error lines before byte `window`, in at
    most `room` bytes (half what the header leaves: the last lines keep the rest);
    [] when there are none."""
    if window <= 0:
        return []
    from .. import errorlines  # only for a log longer than its last lines

    kept: List[Tuple[int, str]] = []
    size = shaping.utf8_len(BEFORE_TAIL_HEADER)
    found = shaping.by_priority(errorlines.scan(log, 1, redactor, stop_offset=window))
    for line, text in found[: limits.ERROR_LINES_MAX]:
        size += shaping.utf8_len(f"{line}: {text}") + 1
        if size > room:
            break
        kept.append((line, text))
    return errorlines.block_lines(sorted(kept), BEFORE_TAIL_HEADER)


def _meta(st: Status) -> Dict[str, Any]:
    meta = {"background_id": st.bid, "state": st.state, "log_path": st.record.get("log_path")}
    if st.exit_code is not None:
        meta["exit_code"] = st.exit_code
    return meta


def _log_tail(path: str, redactor: Redactor) -> Tuple[Optional[shaping.Capture], int]:
    """The last STATUS_TAIL_LINES lines of the log, shaped, in a Capture; and the
    log's byte offset where those lines start (0: the view shows all of it)."""
    read = read_tail(path, limits.STATUS_TAIL_LINES, limits.STATUS_TAIL_MAX_BYTES, with_end=True)
    if read is None:
        return None, 0
    raw, end = read
    shaped = shaping.shape_bytes(raw, redactor).rstrip(b"\n")
    lines = shaped.split(b"\n")[-limits.STATUS_TAIL_LINES :]
    capture = shaping.Capture(limits.PLATFORM_CAP_BYTES)
    capture.add(b"\n".join(lines))
    return capture, end - len(raw) + _window_start(raw, len(lines))


def _window_start(raw: bytes, count: int) -> int:
    """Where the last `count` lines of raw start (raw's lines map one for one to
    the shaped ones; trailing empty lines are not shown)."""
    body = raw.rstrip(b"\n")
    pos = len(body)
    for _ in range(count):
        pos = body.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


def read_tail(path: str, lines: int, cap: int, with_end: bool = False):
    """The end of a file holding at least `lines` lines (or all of it), read
    backwards in READ_CHUNK blocks, at most cap bytes; None if unreadable.
    with_end: (those bytes, the file's size when read)."""
    fd = runstate.open_regular(path)
    if fd is None:
        return None
    try:
        end = pos = os.lseek(fd, 0, os.SEEK_END)
        data = b""
        while pos > 0 and end - pos < cap and data.rstrip(b"\n").count(b"\n") < lines:
            size = min(limits.READ_CHUNK, pos, cap - (end - pos))
            pos -= size
            data = os.pread(fd, size, pos) + data
        return (data, end) if with_end else data
    finally:
        os.close(fd)


def _stop(request: protocol.Request, folder: str, bid: str, record: Dict[str, Any]) -> protocol.Reply:
    """SIGTERM to the group; SIGKILL STOP_KILL_GRACE_SECONDS later by a detached
    killer unless it is gone within STOP_WAIT_SECONDS. Only a group the record
    is verified to name (background.owned) is ever signalled."""
    before = status(folder, bid, record, proc.live_groups())
    if before.state not in ("running", "stopping"):
        return protocol.Reply(text=f"{bid} is not running: {before.state}", meta=_meta(before))
    pgid = record["pid"]
    signalled = before.state == "running" and owned(record)
    if signalled:
        touch_new(os.path.join(folder, f"{bid}.stop"))
        proc.signal_group(pgid, proc.signals.SIGTERM)
    deadline = time.monotonic() + limits.STOP_WAIT_SECONDS
    while signalled and time.monotonic() < deadline and proc.group_alive(pgid):
        time.sleep(limits.STOP_POLL_SECONDS)
    if signalled and proc.group_alive(pgid):
        stop_time = mtime(os.path.join(folder, f"{bid}.stop")) or time.time()
        _spawn_killer(pgid, stop_time + limits.STOP_KILL_GRACE_SECONDS - time.time())
    after = status(folder, bid, record, proc.live_groups())
    if before.state == "running" and not signalled:
        head = f"not stopped {bid}: its process group is not verified as the one started for it"
    elif after.state == "stopping":
        head = f"sent SIGTERM to {bid}; SIGKILL follows {limits.STOP_KILL_GRACE_SECONDS}s later if it is still running"
    else:
        head = f"stopped {bid}"
    redactor = runstate.redactor_for(request)
    text = f"{head}\n{_summary(after, redactor)}"
    return protocol.Reply(text=shaping.cap_text(text, request.max_bytes), meta=_meta(after))


def _spawn_killer(pgid: int, delay: float) -> None:
    """A detached python that SIGKILLs the group after delay seconds unless it is gone."""
    argv = [sys.executable, "-I", "-S", "-c", _KILLER, str(pgid), str(max(0.0, delay))]
    proc.spawn(argv, os.environ, stdout=None, session=True)
