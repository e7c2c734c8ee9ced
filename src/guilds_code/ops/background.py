"""Background commands: the start (shell with background), their records and states.

A command starts as ``bash -c WRAPPER guilds-bg EXIT_FILE COMMAND`` in its own
session (the wrapper is the session and group leader), stdin /dev/null, output
appended to <run dir>/<call id>.log (always kept), without the orchestrator's exec
token (``command.background_env``): it outlives the exec that started it. The wrapper runs
``bash -c COMMAND`` and, when it ends, writes its exit status atomically to
EXIT_FILE, so states stay true after the helper has exited.

Under <state root>/<agent id>/background/, per command, nothing rewritten:
    bN.json          the record: id, pid, start_time, command, cwd, started_at,
                     log_path, exit_file, call, instance. Made complete in a
                     temp file, then hard-linked to its name: link() fails on an
                     existing name, so concurrent starts never share an id (b1, b2, ...).
    .exit-<token>    the exit status, written by the wrapper
    bN.stop          made when shell_status stop sent SIGTERM; a stop by the
                     orchestrator (a rewind of the files) writes why into it
    bN.ended         made when the command was first seen gone without a status

States: running, exited N, stopping (stop sent, still alive), stopped (stopped
and gone), ended (gone without an exit code).

A command's identity: bN names it for the life of one sandbox only (a new
sandbox's records begin again at b1), so the record also keeps ``call``, the
id of the call that started it (unique to that call; whoever follows the
command outside the model's calls asks by it: shell_status.py), and
``instance``, the sandbox it runs in (proc.sandbox_instance: the boot id, the pid
namespace and its pid 1's start time). A command of another instance is gone
(``ended``) whatever its pid names now. A record's pid names its process only
with the same start time (/proc/<pid>/stat field 22): a reused pid is gone too.
A group whose leader is gone (a stop's SIGTERM ends the wrapper while a command
that ignores it runs on) still counts while it has members: in one pid
namespace a number is not given out again while a group of that number lives.
The agent can rewrite a record, start time included, so a record is trusted to
name a group this sandbox started (``owned``) only while that group's leader
is the wrapper the helper started for it: the same start time, leading its own
group, with the record's own exit file on its command line. Nothing is ever
signalled for a record that is not owned. shell_status (ops/shell_status.py)
reads them.
"""

from __future__ import annotations

import os
import stat
import time

from .. import codec, limits, proc, protocol, runstate, shaping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterator, List, Optional, Set

BACKGROUND_DIR = "background"
WRAPPER = 'bash -c "$2"; s=$?; printf "%s\\n" "$s" >| "$1.tmp" && mv -f -- "$1.tmp" "$1"'
_RECORD_SUFFIX = ".json"
STOP_REASON_BYTES = 200
"""The most of bN.stop's reason shown in a status."""


def background_dir(request: protocol.Request, create: bool = False, notes: Optional[List[str]] = None) -> str:
    """<state root>/<agent id>/background, made (0700) when create: what is in the way
    of it or of the agent's folder is moved aside (a line in notes says so)."""
    path = os.path.join(runstate.agent_dir(request), BACKGROUND_DIR)
    if create:
        try:
            os.makedirs(runstate.state_dir(), 0o700, exist_ok=True)
        except OSError as exc:
            raise protocol.OpError(f"cannot make {runstate.state_dir()}: {exc.strerror}") from None
        runstate.rebuild_dir(runstate.agent_dir(request), [] if notes is None else notes)
        runstate.rebuild_dir(path, [] if notes is None else notes)
    return path


def records_dir(request: protocol.Request) -> Optional[str]:
    """background_dir for reading: None when it, or the agent's folder, is a link or
    not a folder (never followed to another folder's records)."""
    path = background_dir(request)
    return path if all(_is_folder(f) for f in (runstate.agent_dir(request), path)) else None


def _is_folder(path: str) -> bool:
    """A real folder, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


# --- start -----------------------------------------------------------------
def start(request: protocol.Request) -> protocol.Reply:
    """Start args.command in the background and return at once."""
    notes: List[str] = []  # what was in the way of the state folders, moved aside
    folder = background_dir(request, create=True, notes=notes)
    log = runstate.log_path(request, notes, keep_also=running_run_dirs)
    record = _launch(request, folder, log)
    bid = _recorded(folder, record)
    text = "\n".join([
        f"started {bid} in the background (pid {record['pid']})",
        f"log: {log}",
        f"check it with shell_status id={bid}; stop it with shell_status id={bid} stop=true",
    ] + notes)
    return protocol.Reply(text=shaping.cap_text(text, request.max_bytes), meta={"background_id": bid, "log_path": log})


def _launch(request: protocol.Request, folder: str, log: str) -> Dict[str, Any]:
    """Spawn the wrapper; return the command's record (without its id)."""
    from ..command import background_env, command_script, open_log, start_bash  # a start only

    cwd = runstate.current_cwd(request)
    env = background_env(request, cwd, runstate.load_repo_tokens(request))
    exit_file = os.path.join(folder, f".exit-{os.urandom(8).hex()}")
    command = request.args["command"]
    script = command_script(command, log[: -len(".log")] + ".sh")
    started_at = time.time()
    log_fd = open_log(log)
    try:
        child = start_bash(["bash", "-c", WRAPPER, "guilds-bg", exit_file, script], cwd, env, log_fd)
    finally:
        os.close(log_fd)
    info = proc.proc_stat(child.pid)  # not waited for: it outlives this helper
    return {
        "pid": child.pid, "start_time": info.start_time if info else None,
        "command": command[: limits.RECORD_COMMAND_MAX_CHARS], "cwd": cwd,
        "started_at": started_at, "log_path": log, "exit_file": exit_file,
        "call": request.call_id, "instance": proc.sandbox_instance(),
    }


def _recorded(folder: str, record: Dict[str, Any]) -> str:
    """_allocate; when the record cannot be written (a full state root), the command is
    stopped (its group killed, the wrapper reaped) and OpError says so: nothing runs unrecorded."""
    try:
        return _allocate(folder, record)
    except OSError as exc:
        proc.signal_group(record["pid"], proc.signals.SIGKILL)
        try:
            os.waitpid(record["pid"], 0)
        except ChildProcessError:
            pass
        raise protocol.OpError(f"cannot keep a record of the background command in {folder}: "
                               f"{exc.strerror or exc}; the command was stopped") from None


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
    ids = (name[: -len(_RECORD_SUFFIX)] for name in names if name.endswith(_RECORD_SUFFIX))
    return sorted(int(bid[1:]) for bid in ids if protocol.is_background_id(bid))


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
    stop_time = mtime(os.path.join(folder, f"{bid}.stop"))
    if exit_code is not None:
        state, end = f"exited {exit_code}", exit_time
    elif _alive(record, live):
        state, end = ("stopping" if stop_time else "running"), time.time()
    else:
        state, end = (_stopped(folder, bid) if stop_time else "ended"), _ended_at(folder, bid)
    return Status(bid, record, state, exit_code, end - record["started_at"])


def _stopped(folder: str, bid: str) -> str:
    """stopped, or stopped (why) when the orchestrator wrote why into bN.stop (a rewind)."""
    try:  # never a link, never a fifo's wait
        fd = os.open(os.path.join(folder, f"{bid}.stop"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "stopped"
    try:
        why = os.read(fd, STOP_REASON_BYTES).decode("utf-8", "replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    except OSError:
        why = ""
    finally:
        os.close(fd)
    return f"stopped ({why})" if why else "stopped"


def running_run_dirs(request: protocol.Request) -> Set[str]:
    """The folders of the logs of the agent's background commands that are running or stopping."""
    folder = records_dir(request)
    if folder is None:
        return set()
    return {os.path.dirname(str(record.get("log_path", ""))) for record in _running(folder, {})}


def any_running() -> bool:
    """True when a background command of any agent of the state root is running or
    stopping (the resident server does not sleep then: ``asleep``)."""
    root = runstate.state_dir()
    try:
        names = os.listdir(root)
    except OSError:
        return False
    live: Dict[str, Set[int]] = {}
    for name in names:
        folder = os.path.join(root, name, BACKGROUND_DIR)
        if _is_folder(os.path.join(root, name)) and _is_folder(folder) and next(_running(folder, live), None):
            return True
    return False


def _running(folder: str, live: Dict[str, Set[int]]) -> Iterator[Dict[str, Any]]:
    """The records of folder whose command is running or stopping; live caches
    proc.live_groups() under "groups", read once at the first record that needs it."""
    for n in list_ids(folder):
        record = load_record(folder, f"{limits.BACKGROUND_ID_PREFIX}{n}")
        if record is None or _exit_code(folder, record)[0] is not None:
            continue
        if "groups" not in live:
            live["groups"] = proc.live_groups()
        if _alive(record, live["groups"]):
            yield record


def _alive(record: Dict[str, Any], live: Set[int]) -> bool:
    """The command's group runs, and the record names it (see the module docstring)."""
    if record.get("instance") != proc.sandbox_instance():
        return False  # an earlier sandbox's command: its pid numbers another namespace's processes
    pid = record["pid"]
    info = proc.proc_stat(pid)
    if info is not None and info.start_time != record.get("start_time"):
        return False  # the pid is reused: its number is no longer our group's
    if info is not None and info.state not in "ZX" and not owned(record):
        return False  # the record names a group this sandbox did not start
    return pid in live


def leader(record: Dict[str, Any]) -> Optional[proc.ProcStat]:
    """The process at the record's pid when it is the one the record names: in
    this sandbox instance, with the recorded start time; else None."""
    if record.get("instance") != proc.sandbox_instance():
        return None  # an earlier sandbox's command: its pid numbers another namespace's processes
    info = proc.proc_stat(record["pid"])
    return info if info is not None and info.start_time == record.get("start_time") else None


def owned(record: Dict[str, Any]) -> bool:
    """True when the record's pid is, now, the wrapper this helper started for
    it (see the module docstring): the only case where its group may be signalled."""
    pid, exit_file = record["pid"], record.get("exit_file")
    info = leader(record)
    if info is None or info.pgrp != pid:
        return False
    return isinstance(exit_file, str) and _command_line(pid)[2:5] == [WRAPPER, "guilds-bg", exit_file]


def _command_line(pid: int) -> List[str]:
    """The arguments of pid (/proc/<pid>/cmdline), [] when unreadable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(limits.STATE_FILE_MAX_BYTES)
    except OSError:
        return []
    return [os.fsdecode(arg) for arg in raw.split(b"\0")]


def _exit_code(folder: str, record: Dict[str, Any]):
    name = os.path.basename(str(record.get("exit_file", "")))
    raw = runstate.read_small(folder, [name]) if name.startswith(".exit-") else None
    if raw is None or not raw.strip().isdigit():
        return None, None
    return int(raw), mtime(os.path.join(folder, name))


def _ended_at(folder: str, bid: str) -> float:
    """When the command was first seen gone (recorded by the first to look)."""
    path = os.path.join(folder, f"{bid}.ended")
    touch_new(path)
    return mtime(path) or time.time()


def mtime(path: str) -> Optional[float]:
    """path's modification time (a link's own), or None when it is missing."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


def touch_new(path: str) -> None:
    """Make an empty file at path unless something is there already."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass
