"""``guilds-code serve``: the helper resident, answering framed requests (``frames``).

One process reads request frames from stdin and writes answer frames to
stdout. Each request runs in a worker forked from the server, which imports
every op once it has been idle a moment (``warm``; a request before that runs
on a worker that imports its own op), or before its hello with ``--warm-first
1``: the worker runs its op exactly as the one-shot helper would and writes the
answer frame to stdout itself, then SENT
into a pipe of its own, so the answer reaches the orchestrator with no hop
through the server. One frame at a time goes to stdout, the server's or a
worker's: each writer holds a POSIX lock on a memfd the server made (the frames
lock) while it writes one. Where no memfd can be made, the worker writes the
envelope line into its pipe and the server answers. So requests run at once and
a slow one delays no other. A worker that answered waits for the next request
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
  CANCELLED, unless its answer was complete first: the server, holding the
  frames lock, reads the worker's pipe, and when no answer is there marks the
  request cancelled (CANCEL_MARK into the worker's request pipe); a worker
  whose request is marked when it holds the lock leaves the answer to the server.
- A frame that cannot be read gets an error envelope; reading goes on.
- stdout carries frames only: workers have stdin and stdout on /dev/null, and
  a worker opens the server's stdout anew for each answer (through /proc, while
  the server is its parent) and holds it only while it writes, so no command
  inherits it and the channel ends with the server.
- One watchdog for all workers (``watchdog``): a worker's command group is
  SIGKILLed when the worker dies before it is done, as the one-shot helper's
  own watchdog does, with no process started per call.
- The server, its watchdog and a waiting worker stand in ``/``: none of them holds
  the folder it was started in (the agent's home), so that home can be unmounted
  and another mounted in its place (a warm pool's agent given a fork's home)
  while the server runs; each op works in the request's ``cwd``.
- Each request refreshes the sandbox's idle clock: the state root's mtime and
  ``<state root>/.active``'s if that file exists.
- After ``--workers-idle`` seconds (SERVE_WORKERS_IDLE_SECONDS) with no request and none running, the waiting
  workers exit and the watchdog is ended (``watchdog.stop``): an idle agent holds
  the server alone; the next request starts the watchdog again and forks.
- After ``--sleep-idle`` seconds (SERVE_SLEEP_IDLE_SECONDS) with no request, none
  running and no background command of the sandbox running, the server sleeps: it
  execs a bash waiter in its own process, which execs the server again, with
  ``--woken BYTE``, at the first byte on stdin (``asleep``). A woken server writes
  no hello and takes BYTE as the start of its first frame.
- stdin at its end (the orchestrator is gone), SIGTERM, SIGHUP or SIGINT:
  every running request is cancelled and answered, then the server exits 0.
  With ``--idle-exit S`` it also exits after S seconds with nothing running
  and no frame, so a container's idle stop is not held off by it.
- With nothing running, a waiting worker reads the next request off stdin itself (the
  reader, ``reader``): one whole request frame it runs at once, with no hop through the
  server; anything else it hands to the server, which reads as before.
- ``--direct 1``: the channel is also offered over TCP (``direct``); once a connection
  naming the token takes it, stdin and stdout are that socket. A worker cannot open a
  socket through /proc, so on it the server writes every answer (the worker hands it
  over its pipe, as where there is no frames lock).
- ``--orphan-exit S``: nothing at all on stdin for S seconds, not even a keepalive
  (KEEPALIVE, a bare newline the orchestrator sends while it lives and the channel
  is quiet), counts as stdin's end: where the orchestrator's end does not reach
  stdin (a pods/exec stream whose client died), its server does not outlive it.
  A keepalive is no frame: it moves neither the idle clock nor the workers', and
  wakes no sleeping server (the waiter takes it and waits on).
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import select
import stat
import time

from . import asleep, codec, frames, limits, proc, protocol, reader, watchdog
from .proc import signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Sequence, Set

    from .direct import Offer

READ_BYTES = reader.READ_BYTES
KEEPALIVE = frames.KEEPALIVE
SENT = b"-\n"
"""What a worker writes into its answer pipe once it has written its answer frame to
stdout itself (never an envelope line: base64 has no '-')."""
WORKER_LOST = "internal error: the request's worker ended without an answer"
CANCEL_MARK = b"c"
"""What the server writes into a running worker's request pipe when it cancels its
request: the worker then leaves the answer to the server."""
CANCELLED = "cancelled: the call was stopped before it finished"
STOP_SIGNALS = (signals.SIGTERM, signals.SIGHUP, signals.SIGINT)
WARM_MODULES = (
    "guilds_code.ops.shell", "guilds_code.ops.shell_status", "guilds_code.ops.file_read",
    "guilds_code.ops.code_search", "guilds_code.ops.background", "guilds_code.ops.rg_output",
    "guilds_code.redact", "guilds_code.shaping", "guilds_code.runstate",
    "json", "re", "math", "hashlib", "shutil", "base64", "urllib.parse",
)
"""Imported by the server once it has been idle limits.SERVE_WARM_IDLE_SECONDS (after its
hello, or after its first requests), so that the workers forked after that import none
of them again: what the ops import (some only on some paths) and their lazy imports.
Not before the hello: a server opened for one call (``guilds call``) answers it without
importing what other ops need, on the CPU a pod's limit leaves it."""


class Worker:
    """A forked worker: its pid, the read end of its answer pipe, the write end of its
    request pipe; and the request it runs, if any."""

    __slots__ = ("pid", "fd", "requests", "slot", "served", "frame_id", "answer", "kill_at", "cancelled",
                 "reaped")

    def __init__(self, pid: int, fd: int, requests: int, slot: int = -1):
        self.pid, self.fd, self.requests, self.slot = pid, fd, requests, slot
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

    def __init__(self, answer: Callable[[object], bytes], options: Options, argv: Sequence[str] = ()):
        self.answer = answer
        self.max_in_flight = options.max_in_flight
        self.idle_exit = options.idle_exit
        self.orphan_exit = options.orphan_exit
        self.workers_idle = options.workers_idle
        self.sleep_idle = options.sleep_idle
        self.woken = options.woken
        self.reader_tell = options.reader_tell_ms / 1000
        self.argv = list(argv)  # what followed "serve": the command line that wakes it again
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
        self.last_heard = self.last_frame  # any byte on stdin, a keepalive's too: the orphan clock
        self.warmed = False
        self.last_busy = self.last_frame  # the last frame or answer: the waiting workers' clock
        self.sleep_check = self.last_frame  # not before then: a look for background commands, or a waiter
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.frames_lock = _frames_lock()
        self.ledger = reader.Ledger(self.frames_lock) if self.frames_lock is not None else None
        """What each reader took and has not told yet (``reader.Ledger``); None without a memfd."""
        self.offer = _offer() if options.direct and self.woken is None else None
        """``--direct 1``: the channel offered over TCP until taken or given up (``direct``)."""
        self.reader: Optional[Worker] = None
        """The waiting worker that reads stdin in the server's place (``reader``), if one does."""
        self.unread_since: Optional[float] = None
        """When stdin was first seen holding bytes its reader had not taken."""
        self.workers_read = True
        """Workers may read stdin in the server's place (False once one could not: ``reader``)."""

    # --- output -----------------------------------------------------------
    def write(self, data: bytes) -> None:
        """data to stdout, all of it; once the orchestrator stopped reading, nothing
        more is written and every request is cancelled."""
        view = memoryview(data)
        try:
            with _Held(self.frames_lock):
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
        asleep.handled()
        if self.woken is None:
            self.write(self._hello())
        else:
            self.last_frame = self.last_busy = time.monotonic()
            self.take(bytes((self.woken,)))
        while self.stdin_open or self.workers:
            if self._orphaned():
                self.stdin_open = False  # as at stdin's end: what runs is cancelled, nothing more is read
                self.cancel_all()
            if self.stopping and self.stdin_open:
                self.stdin_open = False
                self.cancel_all()
            if self.stopping or not self.stdin_open:
                self.retire_idle()
            self.step()
            if self.offer is not None and self.offer.over():
                self.end_offer()
            if not self.workers and time.monotonic() - self.last_busy >= min(self.workers_idle, self.sleep_idle):
                self.retire_idle()
                watchdog.stop()
            self.sleep_when_idle()
            if self._idle_too_long():
                break
            if self._idle_long_enough_to_warm():
                warm()
                self.warmed = True
        self.retire_idle()
        for pid in self.unreaped:
            _reap(pid, 0)
        return 0

    def _hello(self) -> bytes:
        offered = {} if self.offer is None else {"direct": self.offer.port}
        return frames.hello_frame(self.max_in_flight, self.max_frame, os.getpid(), **offered)

    def step(self) -> None:
        poller = select.poll()  # not select(): worker pipes may number past FD_SETSIZE
        # a connection waits in the backlog until the token has come on stdin (it may come later)
        offer = [self.offer.fileno()] if self.offer is not None and self.offer.token is not None else []
        reading = self.stdin_open and self.reader is None
        for fd in [self.wake_r, *self.workers, *self.idle, *offer] + ([0] if reading else []):
            poller.register(fd, select.POLLIN)
        ready = [fd for fd, _ in poller.poll(int(self._sleep() * 1000) + 1)]
        for fd in ready:
            if fd == 0:
                self.read_stdin()
            elif offer and fd == offer[0]:
                self.take_offer()
            elif fd == self.wake_r:
                os.read(fd, 64)
            elif fd in self.workers or fd in self.idle:
                worker = self.workers.get(fd) or self.idle.get(fd)
                if worker is not None:  # not retired by an earlier fd's handling in this turn
                    self.read_worker(worker)
        self.reap()
        self.kill_late()
        self.watch_reader()
        self.name_reader()

    def take_offer(self) -> None:
        """A connection to the offered port: the channel from now on when it names the
        token (stdin and stdout that socket, a hello on it); the offer ends then, or
        once it is over."""
        if self.offer is None:
            return
        if not self.stdin_open:  # the orchestrator is gone: nothing more to offer
            self.end_offer()
            return
        fd = self.offer.take()
        if fd is not None:
            os.dup2(fd, 0)
            os.dup2(fd, 1)
            os.close(fd)
            self.retire_idle()  # forked before: they hold the exec's stdin, no longer the channel
            self.inbox, self.skipping = bytearray(), False
            self.end_offer()
            self.write(self._hello())
        elif self.offer.over():
            self.end_offer()

    def end_offer(self) -> None:
        if self.offer is not None:
            self.offer.close()
            self.offer = None

    def _sleep(self) -> float:
        wait = limits.SERVE_REAP_TICK_SECONDS if self.unreaped else limits.SERVE_TICK_SECONDS
        now = time.monotonic()
        if self.offer is not None:
            wait = min(wait, max(0.0, self.offer.until - now))
        if not self.warmed and not self.workers:
            wait = min(wait, max(0.0, self.last_frame + limits.SERVE_WARM_IDLE_SECONDS - now))
        for worker in self.workers.values():
            if worker.kill_at is not None:
                wait = min(wait, max(0.0, worker.kill_at - now))
        if self.idle_exit is not None and not self.workers:
            wait = min(wait, max(0.0, self.last_frame + self.idle_exit - now))
        if self.orphan_exit is not None and self.stdin_open:
            wait = min(wait, max(0.0, self.last_heard + self.orphan_exit - now))
        if self.reader is not None:
            wait = min(wait, limits.SERVE_READER_CHECK_SECONDS)
        return wait

    def _orphaned(self) -> bool:
        """``--orphan-exit S``: nothing came on stdin, not even a keepalive, for S seconds (the
        orchestrator is gone, and its end did not reach stdin)."""
        return (self.orphan_exit is not None and self.stdin_open
                and time.monotonic() - self.last_heard >= self.orphan_exit)

    def _idle_long_enough_to_warm(self) -> bool:
        return (not self.warmed and self.stdin_open and not self.stopping and not self.workers
                and time.monotonic() - self.last_frame >= limits.SERVE_WARM_IDLE_SECONDS)

    def _idle_too_long(self) -> bool:
        return (self.idle_exit is not None and not self.workers
                and time.monotonic() - self.last_frame >= self.idle_exit)

    def sleep_when_idle(self) -> None:
        """Exec the waiter (``asleep``) once sleep_idle has passed with nothing held; a
        background command running, or a waiter that cannot start, is looked at again
        sleep_idle later."""
        now = time.monotonic()
        if (self.workers or self.idle or self.unreaped or self.inbox or self.skipping or self.stopping
                or not self.stdin_open or now - self.last_busy < self.sleep_idle or now < self.sleep_check):
            return
        self.sleep_check = now + self.sleep_idle
        from .ops import background

        idle_left = None if self.idle_exit is None else self.last_frame + self.idle_exit - now
        argv = asleep.waiter_argv(self.argv, idle_left, self.orphan_exit)
        if argv is None or background.any_running():
            return
        os.set_blocking(0, True)  # bash reads it
        try:
            asleep.sleep(argv, lambda: not self.stopping)
        except OSError:
            return

    def _on_stop(self, signum, frame) -> None:
        self.stopping = True
        try:
            os.write(self.wake_w, b"x")
        except OSError:
            pass

    # --- frames in ----------------------------------------------------------
    def read_stdin(self) -> None:
        self.heard(os.read(0, READ_BYTES))

    def heard(self, data: bytes) -> None:
        """Bytes read from stdin, by the server or its reader (b"": stdin's end)."""
        if not data:
            self.stdin_open = False
            self.cancel_all()
            return
        self.last_heard = time.monotonic()
        if not self.inbox and not data.strip(KEEPALIVE):
            return  # keepalives only: no frame, so neither the idle clock nor the workers' moves
        self.last_frame = self.last_busy = self.last_heard
        self.take(data)

    def take(self, data: bytes) -> None:
        """Bytes read from stdin: each frame they end is handled, the rest kept."""
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
        try:
            frame = protocol.parse_json(line, "frame")
        except protocol.RequestError as exc:
            self.refuse(_usable_id(frames.leading_id(line)), str(exc))
            return
        if self.offer is not None:
            from .direct import token_of

            token = token_of(frame)
            if token is not None and self.offer.token is None:
                self.offer.token = token
                return
            self.end_offer()  # a request on stdin: the exec's streams stay the channel
        problem, frame_id = _check_frame(frame)
        if problem:  # the id as the frame opens, read by a pattern only for a frame gone wrong
            self.refuse(frame_id or _usable_id(frames.leading_id(line)), problem)
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
    def one_request(self, data: bytes) -> Optional[reader.Taken]:
        """(id, request) when data, read by a reader, is one whole frame that this server,
        with nothing running, would run as it is (``on_frame``); None for anything else."""
        if data.find(b"\n") != len(data) - 1 or len(data) > self.max_frame:
            return None
        try:
            frame = protocol.parse_json(data, "frame")
        except protocol.RequestError:
            return None
        problem, frame_id = _check_frame(frame)
        if problem or frame_id is None or "cancel" in frame:
            return None
        return frame_id, frame["request"]

    def start(self, frame_id: str, request: object) -> None:
        try:
            worker = (self._waiting_worker(frame_id, request) or self._freed_worker(frame_id, request)
                      or self._fork(frame_id, request))
        except OSError as exc:  # no process slot (the sandbox's limit), or no memory
            from .pidlimit import why_not_started

            self.refuse(frame_id, f"cannot start a worker for the call: {why_not_started(exc)}")
            return
        self.running(worker, frame_id)

    def running(self, worker: Worker, frame_id: str) -> None:
        """worker runs request frame_id now (handed over, or taken as the reader)."""
        worker.assign(frame_id)
        self.workers[worker.fd] = worker
        self.by_id[frame_id] = worker
        _touch_idle_clock()  # after the hand-over: the worker runs meanwhile

    def _waiting_worker(self, frame_id: str, request: object) -> Optional[Worker]:
        """A waiting worker, handed the request; None when none is left."""
        body = json.dumps(request).encode("ascii")  # ASCII: lone surrogates survive
        line = b"%s %s\n" % (frame_id.encode("ascii"), body)
        while self.idle:
            worker = self.idle.pop(next(iter(self.idle)))
            if _hand(worker.requests, line):
                return worker
            _signal(worker.pid, signals.SIGKILL)  # stopped, or gone: a fresh fork takes the request
            self.retire(worker)
        return None

    def _freed_worker(self, frame_id: str, request: object) -> Optional[Worker]:
        """A worker that has answered by now, its SENT not yet read (the next request
        came in the same turn), handed the request; None when there is none."""
        for worker in list(self.workers.values()):
            _drain(worker)
            if worker.complete():
                self.finish(worker)
        return self._waiting_worker(frame_id, request)

    def _fork(self, frame_id: str, request: object) -> Worker:
        watchdog.resume()
        answers_r, answers_w = os.pipe()
        requests_r, requests_w = os.pipe()
        slot = self.ledger.take_slot() if self.ledger is not None else -1
        try:
            pid = os.fork()
        except OSError:
            for fd in (answers_r, answers_w, requests_r, requests_w):
                os.close(fd)
            if self.ledger is not None:
                self.ledger.free(slot)
            raise
        if pid == 0:
            os.close(answers_r)
            os.close(requests_w)
            self._in_worker(answers_w, requests_r, slot, frame_id, request)
        os.close(answers_w)
        os.close(requests_r)
        os.set_blocking(requests_w, False)
        os.set_blocking(answers_r, False)
        return Worker(pid, answers_r, requests_w, slot)

    def _in_worker(self, answers: int, requests: int, slot: int, frame_id: str, request: object) -> None:
        """The forked worker: answer the request, then each one its pipe brings, up to
        SERVE_WORKER_REQUESTS_MAX; exit at the pipe's end (never returns)."""
        try:
            for sig in STOP_SIGNALS:
                signals.signal(sig, signals.SIG_DFL)
            server = os.getppid()
            channel = _kept_stdin()
            channel_socket = _socket_stdout(server, channel)
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            for worker in [*self.workers.values(), *self.idle.values()]:
                os.close(worker.fd)
                os.close(worker.requests)
            os.close(self.wake_r)
            os.close(self.wake_w)
            if self.offer is not None:
                self.offer.close()
            pipe = reader.RequestPipe(requests, channel, None if self.ledger is None else (self.ledger, slot),
                                      self.reader_tell)
            for served in range(1, limits.SERVE_WORKER_REQUESTS_MAX + 1):
                envelope = self.answer(request)
                told = pipe.untold()  # a request it read itself, the server not told yet: with the answer
                if not _answer(self.frames_lock, server, requests, answers, frame_id, envelope, told,
                               channel_socket):
                    reader.write_all(answers, told + envelope)
                _reap_children()  # background wrappers that ended: never the next op's
                os.chdir("/")  # an op may have entered a folder: a waiting worker holds none
                taken = pipe.next_request(server, answers, self.one_request) \
                    if served < limits.SERVE_WORKER_REQUESTS_MAX else None
                if taken is None:
                    break
                frame_id, request = taken
        finally:
            os._exit(0)

    # --- the reader (``reader``) -------------------------------------------
    def name_reader(self) -> None:
        """With nothing running and nothing half read, a waiting worker reads stdin from now on."""
        if (self.reader is not None or not self.idle or self.workers or not self.stdin_open or self.stopping
                or not self.workers_read or self.offer is not None or self.inbox or self.skipping):
            return
        worker = self.idle[next(iter(self.idle))]
        if self.ledger is not None:
            self.ledger.clear(worker.slot)
        if _hand(worker.requests, reader.READ):
            self.reader, self.unread_since = worker, None
        else:
            self.kill_waiting(worker)

    def watch_reader(self) -> None:
        """stdin holding bytes its reader has not taken for SERVE_READER_CHECK_SECONDS (the
        reader was stopped): taken back."""
        if self.reader is None or not _readable(0):
            self.unread_since = None
            return
        now = time.monotonic()
        if self.unread_since is None:
            self.unread_since = now
        elif now - self.unread_since >= limits.SERVE_READER_CHECK_SECONDS:
            self.take_back()

    def take_back(self) -> None:
        """The server reads stdin again: its reader told so (UNDO) and its reply read. A reader
        that has not replied within SERVE_READER_UNDO_SECONDS is killed when it is stopped, or
        when it still has not SERVE_WORKER_KILL_SECONDS after (a slow one on a busy machine is
        waited for: what it read would be lost with it)."""
        worker = self.reader
        if worker is None:
            return
        began = time.monotonic()
        if _hand(worker.requests, reader.UNDO):
            while self.reader is worker:
                if _readable(worker.fd, limits.SERVE_READER_UNDO_SECONDS):
                    self.read_worker(worker)
                elif _stopped(worker.pid) or time.monotonic() - began >= limits.SERVE_WORKER_KILL_SECONDS:
                    break
        if self.reader is worker:
            self.kill_waiting(worker)

    def kill_waiting(self, worker: Worker) -> None:
        """A waiting worker (the reader or not) no longer to be trusted: killed and retired. A
        request the reader took and had not told (``reader.Ledger``) is answered with the error."""
        _signal(worker.pid, signals.SIGKILL)  # first: what the ledger holds then is final
        lost = None
        if worker is self.reader:
            self.reader = None
            lost = self.ledger.taken(worker.slot) if self.ledger is not None else None
        self.idle.pop(worker.fd, None)
        self.retire(worker)
        if lost is not None:
            self.refuse(lost, WORKER_LOST)

    def from_reader(self, worker: Worker, data: bytes) -> None:
        """The reader's reply (``reader``): a request it took and runs, bytes it gave back, or
        stdin's end; its pipe's end (it died) or anything else retires it."""
        worker.answer += data
        try:
            reply, broken = reader.parse(worker.answer), not data
        except (ValueError, UnicodeDecodeError):
            reply, broken = None, True
        if reply is None:
            if broken:
                self.kill_waiting(worker)
            return
        self.reader, worker.answer = None, b""
        if reply.frame_id is not None:
            del self.idle[worker.fd]
            self.last_frame = self.last_busy = self.last_heard = time.monotonic()
            self.running(worker, reply.frame_id)
            worker.answer = reply.rest
            if worker.complete():
                self.finish(worker)
        elif reply.unable:
            self.workers_read = False
        elif reply.ended:
            self.heard(b"")
        elif reply.data:
            self.heard(reply.data)

    def read_worker(self, worker: Worker) -> None:
        """Its answer is sent as soon as its line is whole."""
        try:
            data = os.read(worker.fd, READ_BYTES)
        except BlockingIOError:  # read already (a cancel looked for its answer)
            return
        if worker is self.reader:
            self.from_reader(worker, data)
            return
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
        self.last_busy = time.monotonic()
        del self.workers[worker.fd]
        del self.by_id[worker.frame_id]
        if worker.cancelled:
            self.refuse(worker.frame_id, CANCELLED)
        elif worker.answer == SENT:  # the worker wrote its answer frame itself
            pass
        elif worker.complete():
            self.reply(worker.frame_id, worker.answer)
        else:
            self.refuse(worker.frame_id, WORKER_LOST)
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
        if self.ledger is not None:
            self.ledger.free(worker.slot)
        if not worker.reaped and not _reap(worker.pid, os.WNOHANG):
            self.unreaped.add(worker.pid)

    def retire_idle(self) -> None:
        self.take_back()
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
        """SIGTERM to the request's worker; an unknown id (already answered) is ignored,
        and so is one whose worker has answered (see the module docstring)."""
        worker = self.by_id.get(frame_id)
        if worker is None or worker.cancelled or worker.complete():
            return
        with _Held(self.frames_lock):
            _drain(worker)
            if not worker.complete():
                worker.cancelled = True
                _mark_cancelled(worker.requests)
        if not worker.cancelled:
            self.finish(worker)
            return
        worker.kill_at = time.monotonic() + limits.SERVE_WORKER_KILL_SECONDS
        _signal(worker.pid, signals.SIGTERM)

    def cancel_all(self) -> None:
        self.take_back()
        for frame_id in list(self.by_id):
            self.cancel(frame_id)

    def kill_late(self) -> None:
        now = time.monotonic()
        for worker in self.workers.values():
            if worker.kill_at is not None and now >= worker.kill_at:
                worker.kill_at = None
                _signal(worker.pid, signals.SIGKILL)


class _Held:
    """The frames lock held for a ``with`` block (nothing without one); a POSIX record
    lock, so the server and its forked workers exclude each other."""

    __slots__ = ("fd",)

    def __init__(self, fd: Optional[int]):
        self.fd = fd

    def __enter__(self) -> None:
        if self.fd is not None:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)


def _frames_lock() -> Optional[int]:
    """The frames lock's descriptor: a memfd; None where none can be made (the
    workers then leave every answer to the server)."""
    try:
        return os.memfd_create("guilds-frames", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None


def _answer(lock: Optional[int], server: int, requests: int, answers: int, frame_id: str,
            envelope: bytes, told: bytes = b"", channel_socket: Optional[int] = None) -> bool:
    """SENT into a worker's answer pipe and its answer frame written to the server's stdout
    by the worker, holding the frames lock; False, with nothing written, when there is no
    frames lock, the server is gone, or the request was cancelled first (the server answers
    it). SENT goes first, so the server, which reads stdin while a request it handed over
    runs, knows this worker free before the next request can come. ``told``: ``T <id>`` of a
    request the worker read itself and has not told (``reader``): the server reads no stdin
    until it reads that, so the frame goes first, then ``told`` and SENT in one write, which
    wakes the server once and after the answer is on its way. ``channel_socket``: see
    ``_stdout_of``."""
    out = _stdout_of(server, channel_socket) if lock is not None else None
    if out is None:
        return False
    frame = frames.answer_frame(frame_id, envelope)
    try:
        with _Held(lock):
            if _readable(requests):  # a cancel's mark, or the pipe's end
                return False
            if not told:
                reader.write_all(answers, SENT)
            try:
                reader.write_all(out, frame)
            except OSError:  # the orchestrator stopped reading: the server sees it too
                pass
            if told:
                reader.write_all(answers, told + SENT)
        return True
    finally:
        os.close(out)


def _stdout_of(server: int, channel_socket: Optional[int] = None) -> Optional[int]:
    """The server's stdout opened anew, for one answer: a worker holds no descriptor
    of the channel while its op runs, so the channel ends with the server; None
    when the server is gone (no longer this worker's parent) or it cannot be opened.
    On the direct channel (``channel_socket``, ``_socket_stdout``) stdout is the
    socket the worker holds already to read requests, which no /proc path opens:
    a duplicate of it."""
    if os.getppid() != server:
        return None
    if channel_socket is not None:
        try:
            return os.dup(channel_socket)
        except OSError:
            return None
    try:  # not blocking in the open: a pipe with no reader left would wait there
        fd = os.open(f"/proc/{server}/fd/1", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    os.set_blocking(fd, True)
    return fd


def _socket_stdout(server: int, channel: Optional[int]) -> Optional[int]:
    """channel (a worker's own descriptor of stdin) when it is a socket and the server's
    stdout is that same socket: the direct channel, one connection both ways
    (``direct``), whose answers the worker then writes itself as on a pipe; else None."""
    if channel is None:
        return None
    try:
        mine = os.fstat(channel)
        if not stat.S_ISSOCK(mine.st_mode):
            return None
        theirs = os.stat(f"/proc/{server}/fd/1")
    except OSError:
        return None
    return channel if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino) else None


def _mark_cancelled(requests: int) -> None:
    try:
        os.write(requests, CANCEL_MARK)
    except OSError:  # it has exited: it answers nothing itself then
        pass


def _offer() -> Optional[Offer]:
    """A listener for ``--direct 1``; None where none can be made (no network: the exec's
    streams are the channel). Imported only then: socket and hmac cost every other server's start."""
    from .direct import Offer

    try:
        return Offer()
    except OSError:
        return None


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


def _readable(fd: int, timeout: float = 0.0) -> bool:
    """Is fd readable (or at its end) now, or within timeout seconds?"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def _stopped(pid: int) -> bool:
    """Is pid stopped (SIGSTOP, or a tracer's stop), or gone?"""
    stat = proc.proc_stat(pid)
    return stat is None or stat.state in "TtZX"


def _kept_stdin() -> Optional[int]:
    """In a worker just forked: the channel's stdin on a descriptor of its own, close-on-exec
    (``reader``); None where it cannot be had."""
    try:
        return os.dup(0)  # Python makes it non-inheritable
    except OSError:
        return None


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


class Options:
    """``serve [--max-in-flight N] [--idle-exit S] [--workers-idle S] [--sleep-idle S]
    [--warm-first 0|1] [--direct 0|1] [--reader-tell-ms MS] [--woken BYTE]`` (``--woken``: the
    waiter's, ``asleep``; ``--warm-first 1``: ``warm`` before the hello, for a server opened ahead
    of its calls, whose first workers then fork warm; ``--direct 1``: the channel offered over
    TCP, ``direct``; ``--reader-tell-ms``: when a reader tells of a request it took, at the
    latest, SERVE_READER_TELL_SECONDS by default, ``reader``)."""

    __slots__ = ("max_in_flight", "idle_exit", "orphan_exit", "workers_idle", "sleep_idle", "warm_first", "woken",
                 "direct", "reader_tell_ms")

    def __init__(self) -> None:
        self.max_in_flight = frames.MAX_IN_FLIGHT_DEFAULT
        self.idle_exit: Optional[int] = None
        self.orphan_exit: Optional[int] = None
        self.workers_idle: float = limits.SERVE_WORKERS_IDLE_SECONDS
        self.sleep_idle: float = limits.SERVE_SLEEP_IDLE_SECONDS
        self.warm_first = 0
        self.woken: Optional[int] = None
        self.direct = 0
        self.reader_tell_ms = round(limits.SERVE_READER_TELL_SECONDS * 1000)


_DURATION_BOUNDS = (1, 7 * 24 * 3600)
_OPTIONS = {"--max-in-flight": ("max_in_flight", (1, 4096)), "--idle-exit": ("idle_exit", _DURATION_BOUNDS),
            "--orphan-exit": ("orphan_exit", _DURATION_BOUNDS),
            "--workers-idle": ("workers_idle", _DURATION_BOUNDS), "--sleep-idle": ("sleep_idle", _DURATION_BOUNDS),
            "--warm-first": ("warm_first", (0, 1)), "--direct": ("direct", (0, 1)),
            "--reader-tell-ms": ("reader_tell_ms", (1, 1000 * _DURATION_BOUNDS[1])),
            asleep.WOKEN: ("woken", (0, 255))}


def _options(argv: List[str]) -> Options:
    """The Options argv names; RequestError naming what is wrong."""
    options = Options()
    if len(argv) % 2:
        raise protocol.RequestError(f"serve: {argv[-1]} needs a value")
    for name, value in zip(argv[::2], argv[1::2]):
        if name not in _OPTIONS:
            raise protocol.RequestError(f"serve: unknown option {name}")
        field, bounds = _OPTIONS[name]
        setattr(options, field, protocol.check_int(name, _number(name, value), bounds))
    return options


def _number(name: str, value: str) -> int:
    if not value.isdigit():
        raise protocol.RequestError(f"{name}: must be an integer, got {value!r}")
    return int(value)


def main(argv: List[str], answer: Callable[[object], bytes]) -> int:
    """Run the server until stdin ends; 2 (and one line on stderr) for bad options."""
    try:
        options = _options(argv)
    except protocol.RequestError as exc:
        os.write(2, f"guilds-code serve: {exc}\n".encode())
        return 2
    gc.freeze()  # the watchdog's collections then never touch (copy) the pages it shares
    os.chdir("/")
    if options.woken is None:
        watchdog.start()  # first, while this process is small: it forks
    else:
        watchdog.start_later()  # a request is waiting: its fork starts it, once the stop signals are handled
    codec.dumps({})  # warm what the first request needs
    server = Server(answer, options, argv)
    if options.warm_first and options.woken is None:
        warm()
        server.warmed = True
    return server.run()


def warm() -> None:
    """Import WARM_MODULES and open the files each shell call's end reads (``escaped.keep_open``),
    then freeze what is loaded out of the garbage collector: the workers forked from now on
    share these pages and descriptors with the server, and collections skip them."""
    for name in WARM_MODULES:
        __import__(name)
    from . import escaped

    escaped.keep_open()
    gc.freeze()
