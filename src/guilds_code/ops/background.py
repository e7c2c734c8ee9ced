"""Background commands: the start (shell with background) and shell_status.

A command starts as ``bash -c WRAPPER guilds-bg EXIT_FILE COMMAND`` in its own
session (the wrapper is the session and group leader), stdin /dev/null, output
appended to <run dir>/<call id>.log (always kept). The wrapper runs
``bash -c COMMAND`` and, when it ends, writes its exit status atomically to
EXIT_FILE, so states stay true after the helper has exited.

Under <state root>/<agent id>/background/, per command, nothing rewritten:
    bN.json          the record: id, pid, start_time, command, cwd, started_at,
                     log_path, exit_file. Made complete in a temp file, then
                     hard-linked to its name: link() fails on an existing name,
                     so concurrent starts never share an id (b1, b2, ...).
    .exit-<token>    the exit status, written by the wrapper
    bN.stop          made when shell_status stop sent SIGTERM
    bN.ended         made when the command was first seen gone without a status

States: running, exited N, stopping (stop sent, still alive), stopped (stopped
and gone), ended (gone without an exit code). A record's pid names its process
only with the same start time (/proc/<pid>/stat field 22): a reused pid is gone.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from .. import codec, limits, proc, protocol, runstate, shaping
from . import shell

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Set

    from ..redact import Redactor

BACKGROUND_DIR = "background"
WRAPPER = 'bash -c "$2"; s=$?; printf "%s\\n" "$s" >| "$1.tmp" && mv -f -- "$1.tmp" "$1"'
_RECORD_SUFFIX = ".json"
_KILLER = (
    "import os,signal,sys,time\n"
    "g=int(sys.argv[1]);end=time.monotonic()+float(sys.argv[2])\n"
    "while time.monotonic()<end:\n"
    "    try: os.killpg(g,0)\n"
    "    except OSError: sys.exit(0)\n"
    "    time.sleep(0.1)\n"
    "try: os.killpg(g,signal.SIGKILL)\n"
    "except OSError: pass\n"
)


def background_dir(request: protocol.Request, create: bool = False) -> str:
    """<state root>/<agent id>/background, made (0700) when create."""
    path = os.path.join(runstate.agent_dir(request), BACKGROUND_DIR)
    if create:
        try:
            os.makedirs(runstate.state_dir(), 0o700, exist_ok=True)
        except OSError as exc:
            raise protocol.OpError(f"cannot make {runstate.state_dir()}: {exc.strerror}") from None
        runstate.ensure_dir(runstate.agent_dir(request))
        runstate.ensure_dir(path)
    return path


# --- start -----------------------------------------------------------------
def start(request: protocol.Request) -> protocol.Reply:
    """Start args.command in the background and return at once."""
    folder = background_dir(request, create=True)
    log = runstate.log_path(request)
    record = _launch(request, folder, log)
    bid = _allocate(folder, record)
    text = (
        f"started {bid} in the background (pid {record['pid']})\n"
        f"log: {log}\n"
        f"check it with shell_status id={bid}; stop it with shell_status id={bid} stop=true"
    )
    return protocol.Reply(text=shaping.cap_text(text, request.max_bytes), meta={"background_id": bid, "log_path": log})


def _launch(request: protocol.Request, folder: str, log: str) -> Dict[str, Any]:
    """Spawn the wrapper; return the command's record (without its id)."""
    cwd = runstate.current_cwd(request)
    env = shell.command_env(request, cwd, runstate.load_repo_tokens(request))
    exit_file = os.path.join(folder, f".exit-{os.urandom(8).hex()}")
    command = request.args["command"]
    script = shell.command_script(command, log[: -len(".log")] + ".sh")
    started_at = time.time()
    log_fd = shell.open_log(log)
    try:
        child = shell.start_bash(["bash", "-c", WRAPPER, "guilds-bg", exit_file, script], cwd, env, log_fd)
    finally:
        os.close(log_fd)
    info = proc.proc_stat(child.pid)  # not waited for: it outlives this helper
    return {
        "pid": child.pid, "start_time": info.start_time if info else None,
        "command": command[: limits.RECORD_COMMAND_MAX_CHARS], "cwd": cwd,
        "started_at": started_at, "log_path": log, "exit_file": exit_file,
    }


def _allocate(folder: str, record: Dict[str, Any]) -> str:
    """Write record as the next free bN.json; return bN."""
    n = max(list_ids(folder), default=0) + 1
    while True:
        bid = f"{limits.BACKGROUND_ID_PREFIX}{n}"
        data = codec.dumps(dict(record, id=bid), separators=(", ", ": ")).encode("utf-8", "surrogateescape")
        tmp = os.path.join(folder, f".new-{os.urandom(8).hex()}")
        runstate.atomic_write(tmp, data)
        try:
            os.link(tmp, os.path.join(folder, f"{bid}.json"))
            return bid
        except FileExistsError:
            n += 1
        finally:
            os.unlink(tmp)


def list_ids(folder: str) -> List[int]:
    """The numbers of the records in folder, ascending."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(int(name[1:-5]) for name in names if _is_record_name(name))


def _is_record_name(name: str) -> bool:
    """bN.json, N from 1 to 999999999."""
    return name.endswith(_RECORD_SUFFIX) and protocol.is_background_id(name[: -len(_RECORD_SUFFIX)])


# --- state -----------------------------------------------------------------
class Status:
    """A background command's state now (see the module docstring)."""

    __slots__ = ("bid", "record", "state", "exit_code", "elapsed")

    def __init__(self, bid: str, record: Dict[str, Any], state: str, exit_code: Optional[int], elapsed: float):
        self.bid, self.record, self.state = bid, record, state
        self.exit_code, self.elapsed = exit_code, elapsed


def load_record(folder: str, bid: str) -> Optional[Dict[str, Any]]:
    raw = runstate.read_small(folder, [f"{bid}.json"])
    try:
        record = codec.loads(raw.decode("utf-8", "surrogateescape")) if raw else None
    except ValueError:
        return None
    ok = isinstance(record, dict) and isinstance(record.get("pid"), int) and isinstance(record.get("started_at"), (int, float))
    return record if ok else None


def status(folder: str, bid: str, record: Dict[str, Any], live: Set[int]) -> Status:
    """The command's state now; live is proc.live_groups()."""
    exit_code, exit_time = _exit_code(folder, record)
    stop_time = _mtime(os.path.join(folder, f"{bid}.stop"))
    if exit_code is not None:
        state, end = f"exited {exit_code}", exit_time
    elif _alive(record, live):
        state, end = ("stopping" if stop_time else "running"), time.time()
    else:
        state, end = ("stopped" if stop_time else "ended"), _ended_at(folder, bid)
    return Status(bid, record, state, exit_code, end - record["started_at"])


def _alive(record: Dict[str, Any], live: Set[int]) -> bool:
    pid = record["pid"]
    info = proc.proc_stat(pid)
    if info is not None and info.start_time != record.get("start_time"):
        return False  # the pid is reused: its number is no longer our group's
    return pid in live


def _exit_code(folder: str, record: Dict[str, Any]):
    name = os.path.basename(str(record.get("exit_file", "")))
    raw = runstate.read_small(folder, [name]) if name.startswith(".exit-") else None
    if raw is None or not raw.strip().isdigit():
        return None, None
    return int(raw), _mtime(os.path.join(folder, name))


def _ended_at(folder: str, bid: str) -> float:
    """When the command was first seen gone (recorded by the first to look)."""
    path = os.path.join(folder, f"{bid}.ended")
    _touch_new(path)
    return _mtime(path) or time.time()


def _mtime(path: str) -> Optional[float]:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


# --- shell_status ------------------------------------------------------------
def run(request: protocol.Request) -> protocol.Reply:
    """shell_status: list, check one (id), or stop one (id, stop)."""
    folder = background_dir(request)
    bid = request.args["id"]
    if bid is None:
        return _list(request, folder)
    record = load_record(folder, bid)
    if record is None:
        raise protocol.OpError(f"id: no background command {bid}")
    if request.args["stop"]:
        return _stop(request, folder, bid, record)
    return _check(request, folder, status(folder, bid, record, proc.live_groups()))


def _summary(st: Status, redactor: Redactor) -> str:
    command = str(st.record.get("command", ""))
    first = command.split("\n", 1)[0] + (" …" if "\n" in command.strip("\n") else "")
    first = shaping.clip_line(redactor.redact(first), limits.STATUS_COMMAND_MAX_CHARS)
    return f"{st.bid} {st.state} {shaping.elapsed(st.elapsed)} {first}"


def _list(request: protocol.Request, folder: str) -> protocol.Reply:
    redactor = runstate.redactor_for(request)
    live = proc.live_groups()
    lines = []
    for n in list_ids(folder):
        bid = f"{limits.BACKGROUND_ID_PREFIX}{n}"
        record = load_record(folder, bid)
        if record is not None:
            lines.append(_summary(status(folder, bid, record, live), redactor))
    if not lines:
        return protocol.Reply(text="no background commands", meta={})
    return protocol.Reply(text=_fit_newest(lines, request.max_bytes), meta={})


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


def _check(request: protocol.Request, folder: str, st: Status) -> protocol.Reply:
    redactor = runstate.redactor_for(request)
    log = str(st.record.get("log_path", ""))
    header = f"{_summary(st, redactor)}\nlog: {log}"
    tail = _log_tail(log, redactor)
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
    return protocol.Reply(text=text, meta=_meta(st))


def _meta(st: Status) -> Dict[str, Any]:
    meta = {"background_id": st.bid, "state": st.state, "log_path": st.record.get("log_path")}
    if st.exit_code is not None:
        meta["exit_code"] = st.exit_code
    return meta


def _log_tail(path: str, redactor: Redactor) -> Optional[shaping.Capture]:
    """The last STATUS_TAIL_LINES lines of the log, shaped, in a Capture."""
    raw = read_tail(path, limits.STATUS_TAIL_LINES, limits.STATUS_TAIL_MAX_BYTES)
    if raw is None:
        return None
    shaped = shaping.shape_bytes(raw, redactor).rstrip(b"\n")
    lines = shaped.split(b"\n")[-limits.STATUS_TAIL_LINES :]
    capture = shaping.Capture(limits.PLATFORM_CAP_BYTES)
    capture.add(b"\n".join(lines))
    return capture


def read_tail(path: str, lines: int, cap: int) -> Optional[bytes]:
    """The end of a file holding at least `lines` lines (or all of it), read
    backwards in READ_CHUNK blocks, at most cap bytes; None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        end = pos = os.lseek(fd, 0, os.SEEK_END)
        data = b""
        while pos > 0 and end - pos < cap and data.rstrip(b"\n").count(b"\n") < lines:
            size = min(limits.READ_CHUNK, pos, cap - (end - pos))
            pos -= size
            data = os.pread(fd, size, pos) + data
        return data
    finally:
        os.close(fd)


def _stop(request: protocol.Request, folder: str, bid: str, record: Dict[str, Any]) -> protocol.Reply:
    """SIGTERM to the group; SIGKILL STOP_KILL_GRACE_SECONDS later by a detached
    killer unless it is gone within STOP_WAIT_SECONDS."""
    before = status(folder, bid, record, proc.live_groups())
    if before.state not in ("running", "stopping"):
        return protocol.Reply(text=f"{bid} is not running: {before.state}", meta=_meta(before))
    pgid = record["pid"]
    if before.state == "running":
        _touch_new(os.path.join(folder, f"{bid}.stop"))
        proc.signal_group(pgid, proc.signals.SIGTERM)
    deadline = time.monotonic() + limits.STOP_WAIT_SECONDS
    while time.monotonic() < deadline and proc.group_alive(pgid):
        time.sleep(0.05)
    if proc.group_alive(pgid):
        stop_time = _mtime(os.path.join(folder, f"{bid}.stop")) or time.time()
        _spawn_killer(pgid, stop_time + limits.STOP_KILL_GRACE_SECONDS - time.time())
    after = status(folder, bid, record, proc.live_groups())
    if after.state == "stopping":
        head = f"sent SIGTERM to {bid}; SIGKILL follows {limits.STOP_KILL_GRACE_SECONDS}s later if it is still running"
    else:
        head = f"stopped {bid}"
    redactor = runstate.redactor_for(request)
    text = f"{head}\n{_summary(after, redactor)}"
    return protocol.Reply(text=shaping.cap_text(text, request.max_bytes), meta=_meta(after))


def _touch_new(path: str) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


def _spawn_killer(pgid: int, delay: float) -> None:
    """A detached python that SIGKILLs the group after delay seconds unless it is gone."""
    argv = [sys.executable, "-I", "-S", "-c", _KILLER, str(pgid), str(max(0.0, delay))]
    proc.spawn(argv, os.environ, stdout=None, session=True)
