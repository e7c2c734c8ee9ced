"""``guilds-code envd``: the E2B front's process and filesystem service inside a sandbox.

One long-lived process per E2B sandbox (``Sandbox.open_process``), speaking JSON
lines: requests on stdin, replies and events on stdout, one line each.

    request  {"id": N, "op": OP, ...}
    reply    {"id": N, "ok": {...}}  or  {"id": N, "error": {"code": CODE, "message": LINE}}
    event    {"ev": "data", "pid": P, "fd": "stdout"|"stderr", "b64": ...}
             {"ev": "end", "pid": P, "exit_code": N, "signal": S|null, "timed_out": bool}

CODE is a Connect error code (not_found, invalid_argument, permission_denied,
already_exists, internal). Ops:

- ``start`` {cmd, args, envs, cwd, tag, stdin, timeout_ms, base_env}: argv
  [cmd, *args] through the helper's spawn path (``proc.spawn``), in a session of
  its own, with the environment a ``shell`` command gets (``command.COMMAND_ENV``)
  plus base_env (the sandbox's) and envs (the request's); cwd confined to the home
  (default: the home). stdin a pipe when asked, else /dev/null. With timeout_ms
  the group gets SIGTERM at the deadline and SIGKILL limits.ENVD_KILL_GRACE_SECONDS
  later. Reply {pid}; then data events and one end event.
- ``input`` {pid, b64}, ``close_stdin`` {pid}, ``signal`` {pid, signal}: the
  signal goes to the command's whole group. ``list``: the running commands.
  ``stop_all``: every command's group stopped (SIGTERM, then SIGKILL), then the reply.
- ``stat`` / ``list_dir`` {path, depth} / ``make_dir`` / ``remove`` / ``move``
  {source, destination} / ``read`` {path, offset, size} / ``write`` {path, b64,
  append}: paths resolved as ``file_read`` resolves them (``paths``): ``~`` and
  relative paths from the home, absolute ones only inside it, links followed only
  inside it.

End of stdin ends the service: every command's group gets SIGTERM, then SIGKILL.
"""

import base64
import grp
import json
import os
import pwd
import shutil
import stat
import sys
import threading
import time

from . import command, limits, paths, proc, protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

SIGNALS = {"SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9, 15: 15, 9: 9}
FILE_TYPES = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "link": "FILE_TYPE_SYMLINK"}


class Failed(Exception):
    """A request's error: a Connect code and one line."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


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
        self.home, self.out = home, out
        self.commands = {}  # type: Dict[int, Command]

    # --- processes ---------------------------------------------------------
    def start(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        argv = [_text(req.get("cmd"), "cmd")] + [_text(a, "args") for a in req.get("args") or []]
        cwd = self.folder(req.get("cwd") or "~")
        env = dict(os.environ)
        env.update(command.COMMAND_ENV)
        env.update(_strings(req.get("base_env")))
        env.update(_strings(req.get("envs")))
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
                self.out.send({"ev": "data", "pid": cmd.child.pid, "fd": name, "b64": _b64(data)})
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

    # --- filesystem --------------------------------------------------------
    def resolve(self, given: "Any") -> paths.Resolved:
        try:
            return paths.resolve(self.home, self.home, _text(given, "path"))
        except protocol.OpError as exc:
            raise _path_failure(str(exc)) from None

    def folder(self, given: "Any") -> str:
        with self.resolve(given) as found:
            if found.kind != "directory":
                raise Failed("invalid_argument", f"path: {given} is not a directory")
            return found.path

    def parent(self, given: "Any", create: bool) -> "tuple":
        """(the resolved folder that will hold given, its last name)."""
        text = _text(given, "path").rstrip("/")
        head, name = os.path.split(paths.absolute(self.home, self.home, text))
        if not name or name in (".", ".."):
            raise Failed("invalid_argument", f"path: {given} names no file")
        if create:
            self.make_folders(head)
        return self.folder(head), name

    def make_folders(self, path: str) -> None:
        missing = []  # type: List[str]
        while True:
            try:
                self.folder(path)
                break
            except Failed as exc:
                if exc.code != "not_found":
                    raise
                path, name = os.path.split(path)
                missing.append(name)
        for name in reversed(missing):
            made = os.path.join(self.folder(path), name)
            try:
                os.mkdir(made, 0o755)
            except FileExistsError:
                pass
            path = made

    def stat(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        with self.resolve(req.get("path")) as found:
            return {"entry": entry(found.path, found.st)}

    def list_dir(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        depth = req.get("depth") or 1
        root = self.folder(req.get("path"))
        entries = []  # type: List[Dict[str, Any]]
        self._walk(root, depth if isinstance(depth, int) else 1, entries)
        return {"entries": entries}

    def _walk(self, folder: str, depth: int, entries: "List[Dict[str, Any]]") -> None:
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            raise Failed("permission_denied", f"path: {folder}: {exc.strerror}") from None
        for name in names[: limits.ENVD_LIST_MAX_ENTRIES]:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            entries.append(entry(path, st))
            if depth > 1 and stat.S_ISDIR(st.st_mode):
                self._walk(path, depth - 1, entries)

    def make_dir(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        folder, name = self.parent(req.get("path"), create=True)
        path = os.path.join(folder, name)
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            raise Failed("already_exists", f"path: {req.get('path')} already exists") from None
        return {"entry": entry(path, os.lstat(path))}

    def remove(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        folder, name = self.parent(req.get("path"), create=False)
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise Failed("not_found", f"path: {req.get('path')} not found") from None
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return {}

    def move(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        with self.resolve(req.get("source")) as found:
            source = found.path
        folder, name = self.parent(req.get("destination"), create=True)
        destination = os.path.join(folder, name)
        os.rename(source, destination)
        return {"entry": entry(destination, os.lstat(destination))}

    def read(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        size = min(int(req.get("size") or limits.ENVD_CHUNK_BYTES), limits.ENVD_CHUNK_BYTES)
        with self.resolve(req.get("path")) as found:
            try:
                fd = found.open_regular(_text(req.get("path"), "path"))
            except protocol.OpError as exc:
                raise _path_failure(str(exc)) from None
            try:
                data = os.pread(fd, size, int(req.get("offset") or 0))
            finally:
                os.close(fd)
        return {"b64": _b64(data), "eof": len(data) < size, "size": found.st.st_size}

    def target(self, given: "Any") -> str:
        """Where a write of given goes: the file it names (a link followed only inside the
        home), or a new name in its folder (folders made)."""
        try:
            with self.resolve(given) as found:
                return found.path
        except Failed as exc:
            if exc.code != "not_found":
                raise
        folder, name = self.parent(given, create=True)
        return os.path.join(folder, name)

    def write(self, req: "Dict[str, Any]") -> "Dict[str, Any]":
        path = self.target(req.get("path"))
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_APPEND if req.get("append") else os.O_TRUNC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise Failed("invalid_argument", f"path: {req.get('path')} cannot be written: {exc.strerror}") from None
        try:
            data = base64.b64decode(req.get("b64") or "", validate=True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return {"entry": entry(path, os.lstat(path))}


def entry(path: str, st: os.stat_result) -> "Dict[str, Any]":
    """A filesystem.EntryInfo, as its JSON names it."""
    info = {
        "name": os.path.basename(path), "type": FILE_TYPES.get(paths.kind(st), "FILE_TYPE_UNSPECIFIED"),
        "path": path, "size": str(st.st_size), "mode": stat.S_IMODE(st.st_mode),
        "permissions": stat.filemode(st.st_mode), "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
        "modifiedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
    }  # type: Dict[str, Any]
    if stat.S_ISLNK(st.st_mode):
        info["isSymlink"] = True
        try:
            info["symlinkTarget"] = os.readlink(path)
        except OSError:
            pass
    return info


def _name(lookup: "Any", ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _path_failure(message: str) -> Failed:
    if message.endswith("not found"):
        return Failed("not_found", message)
    if "outside the home" in message:
        return Failed("permission_denied", message)
    return Failed("invalid_argument", message)


def _text(value: "Any", name: str) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise Failed("invalid_argument", f"{name}: a string without NUL characters is needed")
    return value


def _strings(value: "Any") -> "Dict[str, str]":
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if "=" not in str(k) and "\0" not in str(k) + str(v)}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


OPS = ("start", "stop_all", "input", "close_stdin", "signal", "list", "stat", "list_dir", "make_dir", "remove", "move",
       "read", "write")


def handle(service: Service, line: bytes) -> "Dict[str, Any]":
    try:
        req = json.loads(line)
    except ValueError:
        return {"id": None, "error": {"code": "invalid_argument", "message": "not a JSON line"}}
    ident = req.get("id") if isinstance(req, dict) else None
    op = req.get("op") if isinstance(req, dict) else None
    if op not in OPS:
        return {"id": ident, "error": {"code": "unimplemented", "message": f"no op {op!r}"}}
    try:
        return {"id": ident, "ok": getattr(service, op)(req)}
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
