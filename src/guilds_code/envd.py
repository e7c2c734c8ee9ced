"""``guilds-code envd``: the E2B front's process and filesystem service inside a sandbox.

One long-lived process per E2B sandbox (``Sandbox.open_process``), speaking JSON
lines: requests on stdin, replies and events on stdout, one line each.

    request  {"id": N, "op": OP, ...}
    reply    {"id": N, "ok": {...}}  or  {"id": N, "error": {"code": CODE, "message": LINE}}
    event    {"ev": "data", "pid": P, "fd": "stdout"|"stderr", "b64": ...}
             {"ev": "end", "pid": P, "exit_code": N, "signal": S|null, "timed_out": bool}

CODE is a Connect error code (not_found, invalid_argument, permission_denied,
already_exists, internal). Ops:

- ``start`` {cmd, args, envs, cwd, tag, stdin, timeout_ms, base_env, run_id,
  call_id}: argv [cmd, *args] through the helper's spawn path (``proc.spawn``), in
  a session of its own, with the environment a ``shell`` command gets
  (``command.COMMAND_ENV``) plus base_env (the sandbox's) and envs (the request's);
  behind the egress proxy, the proxy variables name run_id/call_id (as a ``shell``
  command's name its call: ``command.name_call_in_proxy``); cwd any folder of the
  sandbox, as E2B's (``~`` and a relative path from the home; default: the home):
  the command could ``cd`` there itself, so no confinement is lost. stdin a pipe
  when asked, else /dev/null. With timeout_ms the group gets SIGTERM at the
  deadline and SIGKILL limits.ENVD_KILL_GRACE_SECONDS later. Reply {pid, config} (config as
  ``list`` gives it); then data events and one end event.
  With pty {cols, rows} the command runs in a new terminal of that size, its
  controlling one (envd_pty.py): its output comes as data events of fd "pty",
  ``input`` goes to the terminal, stdin is not asked for.
- ``resize`` {pid, cols, rows}: a terminal's new size (the command gets SIGWINCH).
- ``ack`` {pid, bytes}: the host took that many bytes of the command's output.
  At most limits.ENVD_OUTPUT_WINDOW_BYTES are sent and not yet taken: past them the
  command's pipes are not read until an ack (its writes block, as into a full pipe).
  After the command exits its output is still sent while the host takes it; when
  the host takes nothing for limits.ENVD_DRAIN_SECONDS the end is sent anyway.
  Its reply carries no id the host waits on.
- ``input`` {pid, b64}, ``close_stdin`` {pid}, ``signal`` {pid, signal}: the
  signal goes to the command's whole group; a SIGKILL is answered once the
  command's process is reaped (at most limits.ENVD_KILL_GRACE_SECONDS later).
  ``list``: the running commands.
  ``stop_all``: every command's group stopped (SIGTERM, then SIGKILL), then the reply.
- ``stat`` / ``list_dir`` {path, depth} / ``make_dir`` / ``remove`` / ``move``
  {source, destination} / ``read`` {path, offset, size} / ``write`` {path, b64,
  append}: confined to the home (envd_files.py).
- ``watch_create`` / ``watch_events`` / ``watch_remove``: folder watchers (envd_watch.py).

End of stdin ends the service: every command's group gets SIGTERM, then SIGKILL.

``guilds-code envd HOME [--sleep-idle S] [--woken BYTE]``: with no request for S
seconds (limits.ENVD_SLEEP_IDLE_SECONDS; 0: never), no command it started still
running or still sending output, no thread of its own left (a reader, a waiter, a
deadline, a watcher) and no request half read, the service sleeps as the resident
helper does (``asleep``): it execs a bash waiter in its own process (same pid, same
pipes), and the first byte on stdin execs the service again with ``--woken BYTE``,
which takes that byte as the start of its first request. The host never knows.
"""

import base64
import json
import os
import select
import threading
import time

from . import asleep, command, envd_pty, limits, paths, proc, protocol
from .envd_files import Failed, Files, b64, text
from .envd_watch import Watchers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

SIGNALS = {"SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9, 15: 15, 9: 9}


class Out:
    """stdout, one whole line at a time from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def send(self, obj: "Dict[str, Any]") -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]


class Window:
    """A command's output sent and not yet taken by the host (see ``ack``)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.unacked = 0
        self.last_ack = time.monotonic()
        self.readers = 2
        """Its pipes still read: acks are taken until both are done (a grandchild may outlive the end)."""

    def take(self, size: int) -> None:
        """Wait until the window has room, then count size bytes as sent."""
        with self.cond:
            while self.unacked >= limits.ENVD_OUTPUT_WINDOW_BYTES:
                self.cond.wait()
            self.unacked += size

    def ack(self, size: int) -> None:
        with self.cond:
            self.unacked = max(0, self.unacked - size)
            self.last_ack = time.monotonic()
            self.cond.notify_all()

    def full(self) -> bool:
        return self.unacked >= limits.ENVD_OUTPUT_WINDOW_BYTES

    def stalled(self) -> bool:
        """Full, and the host took nothing for limits.ENVD_DRAIN_SECONDS."""
        return self.full() and time.monotonic() - self.last_ack > limits.ENVD_DRAIN_SECONDS


class Command:
    """One started command: its child, its stdin's write end, its deadline, its output window."""

    def __init__(self, child: proc.Child, config: "Dict[str, Any]", tag: "Optional[str]", stdin_fd: "Optional[int]"):
        self.child, self.config, self.tag, self.stdin_fd = child, config, tag, stdin_fd
        self.terminal = None  # type: Optional[int]
        """A terminal's input side (the stdin_fd of a command run in one), to resize it."""
        self.timed_out = False
        self.reaped = threading.Event()
        """Its process waited for: its pid names no process, not even a zombie."""
        self.ended = threading.Event()
        self.window = Window()

    def stop_group(self) -> None:
        """SIGTERM to the group, SIGKILL a grace later unless it is gone by then."""
        proc.signal_group(self.child.pid, 15)
        deadline = time.monotonic() + limits.ENVD_KILL_GRACE_SECONDS
        while time.monotonic() < deadline and proc.group_alive(self.child.pid):
            time.sleep(limits.ENVD_POLL_SECONDS)
        proc.signal_group(self.child.pid, 9)

    def close_stdin(self) -> None:
        fd, self.stdin_fd = self.stdin_fd, None
        if fd is not None:
            os.close(fd)


class Service:
    def __init__(self, home: str, out: Out):
        self.out, self.files = out, Files(home)
        self.watchers = Watchers(self.files, out.send)
        self.commands = {}  # type: Dict[int, Command]
        self.windows = {}  # type: Dict[int, Window]
        self.lock = threading.Lock()

    # --- processes ---------------------------------------------------------
    def start(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        argv = [text(req.get("cmd"), "cmd")] + [text(a, "args") for a in req.get("args") or []]
        cwd = working_folder(self.files.home, req.get("cwd") or "~")
        env = dict(os.environ)
        env.update(command.COMMAND_ENV)
        env.update(_strings(req.get("base_env")))
        env.update(_strings(req.get("envs")))
        run_id, call_id = req.get("run_id"), req.get("call_id")
        if env.get(command.EGRESS_PROXY_ENV) and protocol.is_safe_name(run_id) and protocol.is_safe_name(call_id):
            command.name_call_in_proxy(env, str(run_id), str(call_id))
        if req.get("pty"):
            return self._start_in_terminal(req, argv, env, cwd)
        read_fd, stdin_fd = os.pipe() if req.get("stdin") else (None, None)
        try:
            child = proc.spawn(argv, env, stdin=read_fd, stdout=proc.PIPE, stderr=proc.PIPE, cwd=cwd, session=True)
        except OSError as exc:
            if stdin_fd is not None:
                os.close(stdin_fd)
            raise Failed("invalid_argument", f"cannot start {argv[0]}: {exc.strerror}") from None
        finally:
            if read_fd is not None:
                os.close(read_fd)
        if stdin_fd is not None:
            os.set_blocking(stdin_fd, True)
        cmd = self._started(child, req, argv, cwd, stdin_fd)
        readers = [self._reader(cmd, proc.read_end(child.stdout), "stdout"),
                   self._reader(cmd, proc.read_end(child.stderr), "stderr")]
        self._follow(cmd, readers, req)
        return {"pid": child.pid, "config": cmd.config}

    def _start_in_terminal(self, req: "Dict[str, Any]", argv: "List[str]", env: "Dict[str, str]",
                           cwd: str) -> "Dict[str, Any]":
        size = envd_pty.size_of(req.get("pty"))
        child, terminal = envd_pty.spawn(argv, env, cwd, size)
        cmd = self._started(child, req, argv, cwd, os.dup(terminal))
        cmd.terminal, cmd.window.readers = cmd.stdin_fd, 1
        self._follow(cmd, [self._reader(cmd, terminal, "pty")], req)
        return {"pid": child.pid, "config": cmd.config}

    def _started(self, child: proc.Child, req: "Dict[str, Any]", argv: "List[str]", cwd: str,
                 stdin_fd: "Optional[int]") -> Command:
        config = {"cmd": argv[0], "args": argv[1:], "envs": _strings(req.get("envs")), "cwd": cwd}
        cmd = Command(child, config, req.get("tag"), stdin_fd)
        self.commands[child.pid] = cmd
        self.windows[child.pid] = cmd.window
        return cmd

    def _follow(self, cmd: Command, readers: "List[threading.Thread]", req: "Dict[str, Any]") -> None:
        """Its end awaited (and its deadline kept) in threads of their own."""
        threading.Thread(target=self._waiter, args=(cmd, readers), daemon=True).start()
        timeout_ms = req.get("timeout_ms")
        if isinstance(timeout_ms, int) and timeout_ms > 0:
            threading.Thread(target=self._deadline, args=(cmd, timeout_ms / 1000.0), daemon=True).start()

    def _reader(self, cmd: Command, read_fd: int, name: str) -> threading.Thread:
        def read() -> None:
            while True:
                try:
                    data = os.read(read_fd, limits.ENVD_READ_BYTES)
                except OSError:  # a terminal whose every user is gone: EIO
                    data = b""
                if not data:
                    break
                cmd.window.take(len(data))
                self.out.send({"ev": "data", "pid": cmd.child.pid, "fd": name, "b64": b64(data)})
            os.close(read_fd)
            with self.lock:
                cmd.window.readers -= 1
                if not cmd.window.readers:
                    self.windows.pop(cmd.child.pid, None)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread

    def _waiter(self, cmd: Command, readers: "List[threading.Thread]") -> None:
        code = cmd.child.wait()
        cmd.reaped.set()
        for reader in readers:  # a grandchild left holding the pipes does not hold the end back
            reader.join(limits.ENVD_DRAIN_SECONDS)
            while reader.is_alive() and cmd.window.full() and not cmd.window.stalled():
                reader.join(limits.ENVD_DRAIN_SECONDS)  # the host still takes its output: all of it first
        cmd.close_stdin()
        cmd.ended.set()
        self.commands.pop(cmd.child.pid, None)
        self.out.send({"ev": "end", "pid": cmd.child.pid, "exit_code": code if code >= 0 else 128 - code,
                       "signal": -code if code < 0 else None, "timed_out": cmd.timed_out})

    def _deadline(self, cmd: Command, seconds: float) -> None:
        if not cmd.ended.wait(seconds):
            cmd.timed_out = True
            cmd.stop_group()

    def command(self, req: "Dict[str, Any]") -> Command:
        pid = req.get("pid")
        cmd = self.commands.get(pid) if isinstance(pid, int) else None
        if cmd is None:
            raise Failed("not_found", f"process with pid {pid} not found")
        return cmd

    def input(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        cmd = self.command(req)
        if cmd.stdin_fd is None:
            raise Failed("failed_precondition", f"process {cmd.child.pid} has no stdin open")
        try:
            os.write(cmd.stdin_fd, base64.b64decode(req.get("b64") or "", validate=True))
        except (ValueError, OSError) as exc:
            raise Failed("invalid_argument", f"stdin of {cmd.child.pid}: {exc}") from None
        return {}

    def close_stdin(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        cmd = self.command(req)
        if cmd.terminal is not None:
            raise Failed("failed_precondition", f"process {cmd.child.pid} runs in a terminal: send Ctrl-D (0x04)")
        cmd.close_stdin()
        return {}

    def resize(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        cmd = self.command(req)
        if cmd.terminal is None or cmd.stdin_fd is None:
            raise Failed("failed_precondition", f"process {cmd.child.pid} runs in no terminal")
        envd_pty.resize(cmd.terminal, envd_pty.size_of(req))
        return {}

    def ack(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        pid, size = req.get("pid"), req.get("bytes")
        window = self.windows.get(pid) if isinstance(pid, int) else None
        if window is not None and isinstance(size, int) and not isinstance(size, bool):
            window.ack(size)
        return {}

    def signal(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        cmd = self.command(req)
        sig = SIGNALS.get(req.get("signal"))
        if sig is None:
            raise Failed("invalid_argument", f"signal {req.get('signal')!r}: only SIGTERM and SIGKILL")
        proc.signal_group(cmd.child.pid, sig)
        if sig == 9:  # answered once the process is gone (kill -0 of its pid then fails), as E2B's
            cmd.reaped.wait(limits.ENVD_KILL_GRACE_SECONDS)
        return {}

    def list(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        return {"processes": [{"pid": pid, "tag": c.tag, "config": c.config} for pid, c in self.commands.items()]}

    def stop_all(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        self.end_all()
        return {}

    def busy(self) -> bool:
        """Something of its own still runs or is held: a command, its output, a folder watcher
        (its events), or any thread but the main one."""
        return bool(self.commands or self.windows or self.watchers.all) or threading.active_count() > 1

    def end_all(self) -> None:
        for cmd in list(self.commands.values()):
            threading.Thread(target=cmd.stop_group, daemon=True).start()
        deadline = time.monotonic() + limits.ENVD_KILL_GRACE_SECONDS + 1
        while self.commands and time.monotonic() < deadline:
            time.sleep(limits.ENVD_POLL_SECONDS)


def working_folder(home: str, given: "Any") -> str:
    """A command's working folder, links resolved: ``~`` and a relative path from the home,
    an absolute one as given; ``invalid_argument`` when no such folder is there."""
    path = os.path.realpath(paths.absolute(home, home, text(given, "cwd")))
    if not os.path.isdir(path):
        raise Failed("invalid_argument", f"cwd: {given} is not a folder of the sandbox")
    return path


def _strings(value: "Any") -> "Dict[str, str]":
    """An environment from a JSON object: names without '=' and no NUL anywhere."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if "=" not in str(k) and "\0" not in str(k) + str(v)}


PROCESS_OPS = ("start", "stop_all", "input", "close_stdin", "signal", "list", "ack", "resize")
FILE_OPS = ("stat", "list_dir", "make_dir", "remove", "move", "read", "write")
WATCH_OPS = ("watch_create", "watch_events", "watch_remove")


def handle(service: Service, line: bytes) -> "Dict[str, Any]":
    try:
        req = json.loads(line)
    except ValueError:
        return {"id": None, "error": {"code": "invalid_argument", "message": "not a JSON line"}}
    ident = req.get("id") if isinstance(req, dict) else None
    op = req.get("op") if isinstance(req, dict) else None
    if op not in PROCESS_OPS and op not in FILE_OPS and op not in WATCH_OPS:
        return {"id": ident, "error": {"code": "unimplemented", "message": f"no op {op!r}"}}
    serving = service if op in PROCESS_OPS else service.files if op in FILE_OPS else service.watchers
    try:
        return {"id": ident, "ok": getattr(serving, op)(req)}
    except Failed as exc:
        return {"id": ident, "error": {"code": exc.code, "message": str(exc)}}
    except OSError as exc:
        return {"id": ident, "error": {"code": "internal", "message": f"{op}: {exc.strerror or exc}"}}
    except (RecursionError, MemoryError, ValueError) as exc:  # one request's failure, never the service's
        return {"id": ident, "error": {"code": "internal", "message": f"{op}: {type(exc).__name__}"}}


class Options:
    """``HOME [--sleep-idle S] [--woken BYTE]`` (``--woken``: the waiter's, ``asleep``)."""

    def __init__(self, argv: "List[str]") -> None:
        self.home = argv[0] if argv else os.environ.get("HOME", "/")
        self.sleep_idle = limits.ENVD_SLEEP_IDLE_SECONDS
        self.woken = None  # type: Optional[int]
        rest = argv[1:]
        if len(rest) % 2:
            raise protocol.RequestError(f"{rest[-1]} needs a value")
        bounds = {"--sleep-idle": (0, limits.ENVD_SLEEP_IDLE_MAX_SECONDS), asleep.WOKEN: (0, 255)}
        for name, value in zip(rest[::2], rest[1::2]):
            if name not in bounds:
                raise protocol.RequestError(f"unknown option {name}")
            if not value.isdigit():
                raise protocol.RequestError(f"{name}: must be an integer, got {value!r}")
            number = protocol.check_int(name, int(value), bounds[name])
            if name == asleep.WOKEN:
                self.woken = number
            else:
                self.sleep_idle = number


class Requests:
    """stdin's lines, read with no buffer but its own: what it holds is known, so the
    service sleeps only with nothing half read."""

    def __init__(self, woken: "Optional[int]") -> None:
        self.pending = bytearray() if woken is None else bytearray((woken,))
        self.scanned = 0
        """How much of pending holds no newline (a long line is not searched again each read)."""
        self.ended = False

    def line(self) -> "Optional[bytes]":
        """The next whole line held (its newline kept), else None."""
        end = self.pending.find(b"\n", self.scanned)
        if end < 0:
            self.scanned = len(self.pending)
            return None
        line = bytes(self.pending[:end + 1])
        del self.pending[:end + 1]
        self.scanned = 0
        return line

    def read(self, timeout: float) -> None:
        """What stdin has within timeout seconds; ``ended`` at its end."""
        if select.select([0], [], [], timeout)[0]:
            data = os.read(0, limits.ENVD_READ_BYTES)
            self.pending += data
            self.ended = not data


def serve(service: Service, requests: Requests, options: Options, argv: "List[str]") -> None:
    """Answer each line until stdin ends (a last line without its newline too); asleep when idle."""
    idle_since = time.monotonic()
    while not requests.ended:
        line = requests.line()
        if line is not None:
            service.watchers.settle()
            service.out.send(handle(service, line))
            idle_since = time.monotonic()
            continue
        now = time.monotonic()
        if service.busy():
            idle_since = now
        elif options.sleep_idle and not requests.pending and now - idle_since >= options.sleep_idle:
            _sleep(service, argv)
            idle_since = now  # it could not: looked at again sleep_idle later
        wait = limits.ENVD_BUSY_LOOK_SECONDS if service.busy() or not options.sleep_idle else \
            max(0.0, idle_since + options.sleep_idle - now)
        requests.read(wait)
    if requests.pending.strip():
        service.watchers.settle()
        service.out.send(handle(service, bytes(requests.pending)))


def _sleep(service: Service, argv: "List[str]") -> None:
    """Exec the bash waiter in this process (``asleep``); returns when it cannot."""
    waiter = asleep.waiter_argv(argv, None)
    if waiter is None:
        return
    os.set_blocking(0, True)  # bash reads it
    try:
        asleep.sleep(waiter, lambda: not service.busy())
    except OSError:
        return


def main(argv: "List[str]") -> int:
    """guilds-code envd HOME [options]: serve requests from stdin until it ends; 2 (and one
    line on stderr) for bad options."""
    try:
        options = Options(argv)
    except protocol.RequestError as exc:
        os.write(2, f"guilds-code envd: {exc}\n".encode())
        return 2
    asleep.handled()
    service = Service(options.home, Out())
    try:
        serve(service, Requests(options.woken), options, argv)
    finally:
        service.watchers.stop_all()
        service.end_all()
    return 0
