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
  command's name its call: ``command.name_call_in_proxy``); cwd confined to the home
  (default: the home). stdin a pipe when asked, else /dev/null. With timeout_ms
  the group gets SIGTERM at the deadline and SIGKILL limits.ENVD_KILL_GRACE_SECONDS
  later. Reply {pid}; then data events and one end event.
- ``input`` {pid, b64}, ``close_stdin`` {pid}, ``signal`` {pid, signal}: the
  signal goes to the command's whole group. ``list``: the running commands.
  ``stop_all``: every command's group stopped (SIGTERM, then SIGKILL), then the reply.
- ``stat`` / ``list_dir`` {path, depth} / ``make_dir`` / ``remove`` / ``move``
  {source, destination} / ``read`` {path, offset, size} / ``write`` {path, b64,
  append}: confined to the home (envd_files.py).

End of stdin ends the service: every command's group gets SIGTERM, then SIGKILL.
"""

import base64
import json
import os
import sys
import threading
import time

from . import command, limits, proc, protocol
from .envd_files import Failed, Files, b64, text

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


class Command:
    """One started command: its child, its stdin's write end, its deadline."""

    def __init__(self, child: proc.Child, config: "Dict[str, Any]", tag: "Optional[str]", stdin_fd: "Optional[int]"):
        self.child, self.config, self.tag, self.stdin_fd = child, config, tag, stdin_fd
        self.timed_out = False
        self.ended = threading.Event()

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
        self.commands = {}  # type: Dict[int, Command]

    # --- processes ---------------------------------------------------------
    def start(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        argv = [text(req.get("cmd"), "cmd")] + [text(a, "args") for a in req.get("args") or []]
        cwd = self.files.folder_path(req.get("cwd") or "~")
        env = dict(os.environ)
        env.update(command.COMMAND_ENV)
        env.update(_strings(req.get("base_env")))
        env.update(_strings(req.get("envs")))
        run_id, call_id = req.get("run_id"), req.get("call_id")
        if env.get(command.EGRESS_PROXY_ENV) and protocol.is_safe_name(run_id) and protocol.is_safe_name(call_id):
            command.name_call_in_proxy(env, str(run_id), str(call_id))
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
        config = {"cmd": argv[0], "args": argv[1:], "envs": _strings(req.get("envs")), "cwd": cwd}
        cmd = Command(child, config, req.get("tag"), stdin_fd)
        self.commands[child.pid] = cmd
        readers = [self._reader(cmd, child.stdout, "stdout"), self._reader(cmd, child.stderr, "stderr")]
        threading.Thread(target=self._waiter, args=(cmd, readers), daemon=True).start()
        timeout_ms = req.get("timeout_ms")
        if isinstance(timeout_ms, int) and timeout_ms > 0:
            threading.Thread(target=self._deadline, args=(cmd, timeout_ms / 1000.0), daemon=True).start()
        return {"pid": child.pid}

    def _reader(self, cmd: Command, fd: "Optional[int]", name: str) -> threading.Thread:
        def read() -> None:
            read_fd = proc.read_end(fd)
            while True:
                data = os.read(read_fd, limits.ENVD_READ_BYTES)
                if not data:
                    break
                self.out.send({"ev": "data", "pid": cmd.child.pid, "fd": name, "b64": b64(data)})
            os.close(read_fd)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread

    def _waiter(self, cmd: Command, readers: "List[threading.Thread]") -> None:
        code = cmd.child.wait()
        for reader in readers:  # a grandchild left holding the pipes does not hold the end back
            reader.join(limits.ENVD_DRAIN_SECONDS)
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
        self.command(req).close_stdin()
        return {}

    def signal(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        cmd = self.command(req)
        sig = SIGNALS.get(req.get("signal"))
        if sig is None:
            raise Failed("invalid_argument", f"signal {req.get('signal')!r}: only SIGTERM and SIGKILL")
        proc.signal_group(cmd.child.pid, sig)
        return {}

    def list(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        return {"processes": [{"pid": pid, "tag": c.tag, "config": c.config} for pid, c in self.commands.items()]}

    def stop_all(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        self.end_all()
        return {}

    def end_all(self) -> None:
        for cmd in list(self.commands.values()):
            threading.Thread(target=cmd.stop_group, daemon=True).start()
        deadline = time.monotonic() + limits.ENVD_KILL_GRACE_SECONDS + 1
        while self.commands and time.monotonic() < deadline:
            time.sleep(limits.ENVD_POLL_SECONDS)


def _strings(value: "Any") -> "Dict[str, str]":
    """An environment from a JSON object: names without '=' and no NUL anywhere."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if "=" not in str(k) and "\0" not in str(k) + str(v)}


PROCESS_OPS = ("start", "stop_all", "input", "close_stdin", "signal", "list")
FILE_OPS = ("stat", "list_dir", "make_dir", "remove", "move", "read", "write")


def handle(service: Service, line: bytes) -> "Dict[str, Any]":
    try:
        req = json.loads(line)
    except ValueError:
        return {"id": None, "error": {"code": "invalid_argument", "message": "not a JSON line"}}
    ident = req.get("id") if isinstance(req, dict) else None
    op = req.get("op") if isinstance(req, dict) else None
    if op not in PROCESS_OPS and op not in FILE_OPS:
        return {"id": ident, "error": {"code": "unimplemented", "message": f"no op {op!r}"}}
    try:
        return {"id": ident, "ok": getattr(service if op in PROCESS_OPS else service.files, op)(req)}
    except Failed as exc:
        return {"id": ident, "error": {"code": exc.code, "message": str(exc)}}
    except OSError as exc:
        return {"id": ident, "error": {"code": "internal", "message": f"{op}: {exc.strerror or exc}"}}


def main(argv: "List[str]") -> int:
    """guilds-code envd HOME: serve requests from stdin until it ends."""
    home = argv[0] if argv else os.environ.get("HOME", "/")
    out = Out()
    service = Service(home, out)
    stdin = sys.stdin.buffer
    try:
        for line in stdin:
            out.send(handle(service, line))
    finally:
        service.end_all()
    return 0
