"""``guilds-code serve``: the helper resident, answering framed requests (``frames``).

One process reads request frames from stdin and writes answer frames to
stdout. Each request runs in a worker forked from the server, which has every
op imported already: the worker runs its op exactly as the one-shot helper
would and writes the envelope line to a pipe. So requests run at once and a
slow one delays no other. A worker that answered waits for the next request
on a pipe of its own (up to SERVE_IDLE_WORKERS_MAX of them wait), so a request
mostly finds a warm worker and pays no fork: a fresh fork's first run touches
its pages again (copy on write), which costs more than a short op. A worker
answers at most SERVE_WORKER_REQUESTS_MAX requests and then exits, so what requests
leave in its memory stays bounded; a cancelled one is never reused.

- At most ``--max-in-flight`` requests run at once (MAX_IN_FLIGHT_DEFAULT);
  the next is answered at once with an error, and not run.
- A cancel frame sends the request's worker SIGTERM: the op stops its
  command's group as it does when the one-shot helper is cancelled (SIGTERM,
  SIGKILL CANCEL_KILL_GRACE_SECONDS later). The worker itself gets SIGKILL
  SERVE_WORKER_KILL_SECONDS after that if still there. The request is answered
  CANCELLED, unless its answer was complete first.
- A frame that cannot be read gets an error envelope; reading goes on.
- stdout carries frames only: workers have stdin and stdout on /dev/null.
- One watchdog for all workers (``watchdog``): a worker's command group is
  SIGKILLed when the worker dies before it is done, as the one-shot helper's
  own watchdog does, with no process started per call.
- Each request refreshes the sandbox's idle clock: the state root's mtime and
  ``<state root>/.active``'s if that file exists.
- stdin at its end (the orchestrator is gone), SIGTERM, SIGHUP or SIGINT:
  every running request is cancelled and answered, then the server exits 0.
  With ``--idle-exit S`` it also exits after S seconds with nothing running
  and no frame, so a container's idle stop is not held off by it.
"""

from __future__ import annotations

import gc
import json
import os
import select
import time

from . import codec, frames, limits, protocol, watchdog
from .proc import signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Set

READ_BYTES = 64 * 1024
CANCELLED = "cancelled: the call was stopped before it finished"
STOP_SIGNALS = (signals.SIGTERM, signals.SIGHUP, signals.SIGINT)
WARM_MODULES = (
    "guilds_code.ops.shell", "guilds_code.ops.shell_status", "guilds_code.ops.file_read",
    "guilds_code.ops.code_search", "guilds_code.ops.background", "guilds_code.ops.rg_output",
    "guilds_code.redact", "guilds_code.shaping", "guilds_code.runstate",
    "json", "re", "math", "hashlib", "shutil", "base64", "urllib.parse",
)
"""Imported by the server before its first fork, so that no worker imports them
again: what the ops import (some only on some paths) and their lazy imports."""


class Worker:
    """A forked worker: its pid, the read end of its answer pipe, the write end of its
    request pipe; and the request it runs, if any."""

    __slots__ = ("pid", "fd", "requests", "served", "frame_id", "answer", "kill_at", "cancelled", "reaped")

    def __init__(self, pid: int, fd: int, requests: int):
        self.pid, self.fd, self.requests = pid, fd, requests
        self.served = 0
        self.frame_id = ""
        self.answer = b""
        self.kill_at: Optional[float] = None
        self.cancelled = self.reaped = False

    def assign(self, frame_id: str) -> None:
        self.frame_id, self.answer = frame_id, b""
        self.served += 1

    def complete(self) -> bool:
        return self.answer.endswith(b"\n")


class Server:
    """The loop: frames in, workers forked, answers out (see the module docstring)."""

    def __init__(self, answer: Callable[[object], bytes], max_in_flight: int, idle_exit: Optional[float]):
        self.answer = answer
        self.max_in_flight = max_in_flight
        self.idle_exit = idle_exit
        self.max_frame = frames.max_frame_bytes(limits.REQUEST_FILE_MAX)
        self.workers: Dict[int, Worker] = {}  # running a request, by answer pipe
        self.idle: Dict[int, Worker] = {}  # waiting for one, by answer pipe
        self.by_id: Dict[str, Worker] = {}
        self.unreaped: Set[int] = set()  # answered workers whose exit was not seen yet
        self.inbox = bytearray()
        self.skipping = False  # inside an oversized frame, until its newline
        self.stdin_open = True
        self.stopping = False
        self.stdout_open = True
        self.last_frame = time.monotonic()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    # --- output -----------------------------------------------------------
    def write(self, data: bytes) -> None:
        """data to stdout, all of it; once the orchestrator stopped reading, nothing
        more is written and every request is cancelled."""
        view = memoryview(data)
        try:
            while view and self.stdout_open:
                view = view[os.write(1, view):]
        except OSError:  # BrokenPipeError, mostly
            self.stdout_open = self.stdin_open = False
            self.cancel_all()

    def reply(self, frame_id: Optional[str], envelope_line: bytes) -> None:
        self.write(frames.answer_frame(frame_id, envelope_line))

    def refuse(self, frame_id: Optional[str], message: str) -> None:
        self.reply(frame_id, protocol.error_envelope(message))

    # --- the loop ---------------------------------------------------------
    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signals.signal(sig, self._on_stop)
        self.write(frames.hello_frame(self.max_in_flight, self.max_frame, os.getpid()))
        while self.stdin_open or self.workers:
            if self.stopping and self.stdin_open:
                self.stdin_open = False
                self.cancel_all()
            if self.stopping or not self.stdin_open:
                self.retire_idle()
            self.step()
            if self._idle_too_long():
                break
        self.retire_idle()
        for pid in self.unreaped:
            _reap(pid, 0)
        return 0

    def step(self) -> None:
        poller = select.poll()  # not select(): worker pipes may number past FD_SETSIZE
        for fd in [self.wake_r, *self.workers, *self.idle] + ([0] if self.stdin_open else []):
            poller.register(fd, select.POLLIN)
        ready = [fd for fd, _ in poller.poll(int(self._sleep() * 1000) + 1)]
        for fd in ready:
            if fd == 0:
                self.read_stdin()
            elif fd == self.wake_r:
                os.read(fd, 64)
            elif fd in self.workers or fd in self.idle:
                self.read_worker(self.workers.get(fd) or self.idle[fd])
        self.reap()
        self.kill_late()

    def _sleep(self) -> float:
        wait = limits.SERVE_REAP_TICK_SECONDS if self.unreaped else limits.SERVE_TICK_SECONDS
        now = time.monotonic()
        for worker in self.workers.values():
            if worker.kill_at is not None:
                wait = min(wait, max(0.0, worker.kill_at - now))
        if self.idle_exit is not None and not self.workers:
            wait = min(wait, max(0.0, self.last_frame + self.idle_exit - now))
        return wait

    def _idle_too_long(self) -> bool:
        return (self.idle_exit is not None and not self.workers
                and time.monotonic() - self.last_frame >= self.idle_exit)

    def _on_stop(self, signum, frame) -> None:
        self.stopping = True
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    # --- frames in ----------------------------------------------------------
    def read_stdin(self) -> None:
        data = os.read(0, READ_BYTES)
        if not data:
            self.stdin_open = False
            self.cancel_all()
            return
        self.last_frame = time.monotonic()
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._collect(data[start:])
                return
            self._collect(data[start:end])
            line, self.inbox = bytes(self.inbox), bytearray()
            if self.skipping:
                self.skipping = False
                self.refuse(_usable_id(frames.leading_id(line)),
                            f"frame: longer than {self.max_frame} bytes; not read")
            elif line.strip():
                self.on_frame(line)
            start = end + 1

    def _collect(self, part: bytes) -> None:
        """Add part to the frame being read; past max_frame keep only its start (for the id)."""
        if self.skipping:
            return
        self.inbox += part
        if len(self.inbox) > self.max_frame:
            del self.inbox[200:]
            self.skipping = True

    def on_frame(self, line: bytes) -> None:
        fallback = _usable_id(frames.leading_id(line))
        try:
            frame = protocol.parse_json(line, "frame")
        except protocol.RequestError as exc:
            self.refuse(fallback, str(exc))
            return
        problem, frame_id = _check_frame(frame)
        if problem:
            self.refuse(frame_id or fallback, problem)
        elif "cancel" in frame:
            self.cancel(frame_id)
        elif frame_id in self.by_id:
            self.refuse(None, f"frame: id {frame_id} is already in flight")
        elif len(self.workers) >= self.max_in_flight:
            self.refuse(frame_id, f"too many requests in flight: at most {self.max_in_flight} "
                                  "at once; this one was not run")
        else:
            self.start(frame_id, frame["request"])

    # --- workers ------------------------------------------------------------
    def start(self, frame_id: str, request: object) -> None:
        _touch_idle_clock()
        try:
            worker = self._waiting_worker(request) or self._fork(request)
        except OSError as exc:  # no process slot (the sandbox's limit), or no memory
            from .pidlimit import why_not_started

            self.refuse(frame_id, f"cannot start a worker for the call: {why_not_started(exc)}")
            return
        worker.assign(frame_id)
        self.workers[worker.fd] = worker
        self.by_id[frame_id] = worker

    def _waiting_worker(self, request: object) -> Optional[Worker]:
        """A waiting worker, handed the request; None when none is left."""
        line = json.dumps(request).encode("ascii") + b"\n"  # ASCII: lone surrogates survive
        while self.idle:
            worker = self.idle.pop(next(iter(self.idle)))
            if _hand(worker.requests, line):
                return worker
            _signal(worker.pid, signals.SIGKILL)  # stopped, or gone: a fresh fork takes the request
            self.retire(worker)
        return None

    def _fork(self, request: object) -> Worker:
        answers_r, answers_w = os.pipe()
        requests_r, requests_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (answers_r, answers_w, requests_r, requests_w):
                os.close(fd)
            raise
        if pid == 0:
            os.close(answers_r)
            os.close(requests_w)
            self._in_worker(answers_w, requests_r, request)
        os.close(answers_w)
        os.close(requests_r)
        os.set_blocking(requests_w, False)
        return Worker(pid, answers_r, requests_w)

    def _in_worker(self, answers: int, requests: int, request: object) -> None:
        """The forked worker: answer the request, then each one its pipe brings, up to
        SERVE_WORKER_REQUESTS_MAX; exit at the pipe's end (never returns)."""
        try:
            for sig in STOP_SIGNALS:
                signals.signal(sig, signals.SIG_DFL)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            for worker in [*self.workers.values(), *self.idle.values()]:
                os.close(worker.fd)
                os.close(worker.requests)
            os.close(self.wake_r)
            os.close(self.wake_w)
            for served in range(1, limits.SERVE_WORKER_REQUESTS_MAX + 1):
                _write_all(answers, self.answer(request))
                _reap_children()  # background wrappers that ended: never the next op's
                line = _read_line(requests) if served < limits.SERVE_WORKER_REQUESTS_MAX else b""
                if not line:
                    break
                request = json.loads(line)
        finally:
            os._exit(0)

    def read_worker(self, worker: Worker) -> None:
        """Its answer is sent as soon as its line is whole."""
        data = os.read(worker.fd, READ_BYTES)
        if worker.fd in self.idle:  # a waiting worker's pipe ended: it exited
            del self.idle[worker.fd]
            self.retire(worker)
            return
        worker.answer += data
        if not data or worker.complete():
            self.finish(worker)

    def finish(self, worker: Worker) -> None:
        """Answer the request once (its line is whole, or its worker ended), then keep
        the worker waiting for the next request or retire it."""
        if worker.fd not in self.workers:
            return
        del self.workers[worker.fd]
        del self.by_id[worker.frame_id]
        if worker.cancelled:
            self.refuse(worker.frame_id, CANCELLED)
        elif worker.complete():
            self.reply(worker.frame_id, worker.answer)
        else:
            self.refuse(worker.frame_id, "internal error: the request's worker ended without an answer")
        if self._keeps(worker):
            worker.frame_id, worker.answer = "", b""
            self.idle[worker.fd] = worker
        else:
            self.retire(worker)

    def _keeps(self, worker: Worker) -> bool:
        return (worker.complete() and not worker.cancelled and not worker.reaped and not self.stopping
                and self.stdin_open and worker.served < limits.SERVE_WORKER_REQUESTS_MAX
                and len(self.idle) < limits.SERVE_IDLE_WORKERS_MAX)

    def retire(self, worker: Worker) -> None:
        """Close its pipes (a waiting worker exits at its request pipe's end); reap it."""
        os.close(worker.fd)
        os.close(worker.requests)
        if not worker.reaped and not _reap(worker.pid, os.WNOHANG):
            self.unreaped.add(worker.pid)

    def retire_idle(self) -> None:
        while self.idle:
            self.retire(self.idle.pop(next(iter(self.idle))))

    def reap(self) -> None:
        """Reap the workers that exited; answer those whose pipe is left open
        by something they started."""
        for pid in list(self.unreaped):
            if _reap(pid, os.WNOHANG):
                self.unreaped.discard(pid)
        for worker in list(self.workers.values()):
            if not worker.reaped and _reap(worker.pid, os.WNOHANG):
                worker.reaped = True
                _drain(worker)
                self.finish(worker)

    def cancel(self, frame_id: str) -> None:
        """SIGTERM to the request's worker; an unknown id (already answered) is ignored."""
        worker = self.by_id.get(frame_id)
        if worker is None or worker.cancelled or worker.complete():
            return
        worker.cancelled = True
        worker.kill_at = time.monotonic() + limits.SERVE_WORKER_KILL_SECONDS
        _signal(worker.pid, signals.SIGTERM)

    def cancel_all(self) -> None:
        for frame_id in list(self.by_id):
            self.cancel(frame_id)

    def kill_late(self) -> None:
        now = time.monotonic()
        for worker in self.workers.values():
            if worker.kill_at is not None and now >= worker.kill_at:
                worker.kill_at = None
                _signal(worker.pid, signals.SIGKILL)


def _usable_id(value: Optional[str]) -> Optional[str]:
    return value if protocol.is_safe_name(value) else None


def _check_frame(frame: object):
    """(problem or None, the frame's id or None) for a decoded frame."""
    if not isinstance(frame, dict):
        return "frame: must be a JSON object", None
    frame_id = frame.get("id")
    frame_id = frame_id if protocol.is_safe_name(frame_id) else None
    version = frame.get("v")
    if version != frames.VERSION:
        return (f"frame: protocol version {protocol.show(version)}, this helper speaks "
                f"{frames.VERSION}"), frame_id
    if frame_id is None:
        return f"frame: id must be letters, digits, '.', '_' or '-', got {protocol.show(frame.get('id'))}", None
    if "cancel" in frame:
        return (None if frame["cancel"] is True else "frame: cancel must be true"), frame_id
    if "request" not in frame:
        return "frame: needs a request or a cancel", frame_id
    return None, frame_id


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _reap(pid: int, options: int) -> bool:
    """True when pid has exited (and is reaped now)."""
    try:
        return os.waitpid(pid, options)[0] != 0
    except ChildProcessError:
        return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _hand(fd: int, line: bytes) -> bool:
    """line into a waiting worker's request pipe (non-blocking); False when the worker
    is gone or has not taken it all within SERVE_HAND_SECONDS (it was stopped)."""
    view, deadline = memoryview(line), time.monotonic() + limits.SERVE_HAND_SECONDS
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                return False
        except OSError:  # BrokenPipeError: it died while waiting
            return False
    return True


def _read_line(fd: int) -> bytes:
    """One line from a pipe that carries one at a time; b"" at its end."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, READ_BYTES)
        if not chunk:
            return b""
        data += chunk
    return data


def _reap_children() -> None:
    """Reap every exited child (between requests, so no op's own)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _drain(worker: Worker) -> None:
    """What the exited worker wrote and is still in its pipe."""
    os.set_blocking(worker.fd, False)
    try:
        while True:
            data = os.read(worker.fd, READ_BYTES)
            if not data:
                return
            worker.answer += data
    except BlockingIOError:
        return


def _touch_idle_clock() -> None:
    root = protocol.state_root()
    for path in (root, os.path.join(root, ".active")):
        try:
            os.utime(path)
        except OSError:
            pass


def _options(argv: List[str]):
    """(max_in_flight, idle_exit or None) from ``[--max-in-flight N] [--idle-exit S]``."""
    max_in_flight, idle_exit = frames.MAX_IN_FLIGHT_DEFAULT, None
    pairs = list(zip(argv[::2], argv[1::2]))
    if len(argv) % 2:
        raise protocol.RequestError(f"serve: {argv[-1]} needs a value")
    for name, value in pairs:
        if name == "--max-in-flight":
            max_in_flight = protocol.check_int(name, _number(name, value), (1, 4096))
        elif name == "--idle-exit":
            idle_exit = protocol.check_int(name, _number(name, value), (1, 7 * 24 * 3600))
        else:
            raise protocol.RequestError(f"serve: unknown option {name}")
    return max_in_flight, idle_exit


def _number(name: str, value: str) -> int:
    if not value.isdigit():
        raise protocol.RequestError(f"{name}: must be an integer, got {value!r}")
    return int(value)


def main(argv: List[str], answer: Callable[[object], bytes]) -> int:
    """Run the server until stdin ends; 2 (and one line on stderr) for bad options."""
    try:
        max_in_flight, idle_exit = _options(argv)
    except protocol.RequestError as exc:
        os.write(2, f"guilds-code serve: {exc}\n".encode())
        return 2
    watchdog.start()  # first, while this process is small: it forks
    for name in WARM_MODULES:
        __import__(name)
    codec.dumps({})  # warm what the first request needs
    gc.freeze()  # the workers share these pages with the server: collections skip them
    return Server(answer, max_in_flight, idle_exit).run()
