"""One sandbox's egress proxy as a process: ``python -m guilds.egress CONFIG.json``.

It reads the config (``proxy_config``), takes the lock ``<pidfile>.lock`` (a second
proxy for the same sandbox exits at once with status 3: one is enough), binds the
Unix socket (0666, so the sandbox's uid can connect; its folder is made 0755 when
missing; a socket left by a dead proxy is replaced) or the TCP address (``listen``:
each connection must first send the credential, else it is closed unserved),
writes its pid (and, on TCP, the port it got) into the pidfile once it listens,
and serves until:

- SIGTERM or SIGINT, or
- the idle clock's mtime is older than ``idle_seconds`` (or the clock is gone),
  looked at every ``EGRESS_IDLE_POLL_SECONDS`` at most (a quarter of the idle
  time when shorter), as the sandbox's own init does;

then it removes its socket and pidfile and exits 0. A wrong config exits 2 with one
line on stderr. Connections open at exit are cut.

Asleep: a proxy on a Unix socket whose config has ``linger_seconds`` and that has
served no connection for that long, none open, execs the waiter in its own
process (``waiter``: the same pid, the listening socket and the lock kept, a
bare interpreter's memory, no secret). The next connection that sends a byte
execs the proxy again (``CONFIG --listen-fd N --lock-fd N --conn-fd N``): it
reads its config anew and serves that connection first. Connections never
wait on a proxy that is gone: the socket listens all along, in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import hmac
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Awaitable, Callable, Iterator, NoReturn

from ..limits import (
    EGRESS_HEAD_MAX_BYTES,
    EGRESS_HEAD_READ_SECONDS,
    EGRESS_IDLE_POLL_SECONDS,
    EGRESS_SLEEP_SETTLE_SECONDS,
    EGRESS_WAKE_PEEK_SECONDS,
)
from .decisions import DecisionLog
from .proxy import EgressProxy
from .proxy_config import CREDENTIAL_PREFIX, ConfigError, ProxyConfig, load_config

EXIT_CONFIG = 2
"""The config could not be read or is wrong."""
EXIT_RUNNING = 3
"""Another proxy holds this sandbox's lock: it serves already."""


UNIX_PATH_MAX = 107
"""The longest socket path the kernel binds or connects (sun_path, its NUL aside)."""


@contextlib.contextmanager
def unix_address(path: str | os.PathLike[str]) -> Iterator[str]:
    """path as a socket address the kernel takes: itself, or past UNIX_PATH_MAX bytes (a data
    folder deep in the tree) its folder held open and named through ``/proc/self/fd``."""
    path = os.fspath(path)
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        yield path
        return
    folder = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{os.path.basename(path)}"
    finally:
        os.close(folder)


def connect_unix(path: str | os.PathLike[str]) -> socket.socket:
    """A socket connected to the one at path, however long the path."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        with unix_address(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def is_serving(socket_path: str | os.PathLike[str]) -> bool:
    """Does a proxy answer on socket_path? (The orchestrator's check before a call: a dead
    proxy leaves its socket behind, and is started again.)"""
    try:
        connect_unix(socket_path).close()
    except OSError:
        return False
    return True


def is_listening(address: str, port: int) -> bool:
    """Does a proxy listen at address:port? (The TCP form of ``is_serving``.)"""
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


WAITER = str(Path(__file__).with_name("waiter.py"))
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
BACKLOG = 128


@dataclass
class Handoff:
    """What the proxy keeps across its execs: the listening socket's and the lock's fds,
    and (woken by the waiter) the connection that woke it."""

    listen_fd: int
    lock_fd: int
    conn_fd: int | None = None


def _idle(config: ProxyConfig) -> bool:
    if config.idle_clock is None:
        return False
    try:
        return time.time() - config.idle_clock.stat().st_mtime >= config.idle_seconds
    except FileNotFoundError:
        return True


def _take_lock(config: ProxyConfig) -> IO[str] | None:
    """The held lock file of this sandbox's proxy (None when no pidfile is named); exits if taken."""
    if config.pidfile is None:
        return None
    lock = open(config.pidfile.with_name(config.pidfile.name + ".lock"), "a")  # noqa: SIM115 (held for life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"guilds egress: a proxy already serves {config.socket or config.listen}", file=sys.stderr)
        raise SystemExit(EXIT_RUNNING) from None
    return lock


def _clear_socket(path: Path) -> None:
    """Make the socket's folder (0755) when missing; remove a socket a dead proxy left."""
    if not path.parent.exists():
        path.parent.mkdir(mode=0o755, parents=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _listen_unix(path: Path) -> int:
    """A listening socket bound at path (0666); its fd, inheritable (kept across execs)."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        with unix_address(path) as address:
            sock.bind(address)
        os.chmod(path, 0o666)  # noqa: S103 (the sandbox's uid connects; the socket is its only way out)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()
    os.set_inheritable(fd, True)
    return fd


async def _serve_unix(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                      listen_fd: int) -> asyncio.Server:
    """Serve the listening socket listen_fd through a copy of it: closing the server
    leaves listen_fd listening (and the socket's file in place)."""
    sock = socket.socket(fileno=os.dup(listen_fd))
    if sys.version_info >= (3, 13):  # the file stays: the waiter listens on it next
        return await asyncio.start_unix_server(handler, sock=sock, limit=EGRESS_HEAD_MAX_BYTES, cleanup_socket=False)
    return await asyncio.start_unix_server(handler, sock=sock, limit=EGRESS_HEAD_MAX_BYTES)


async def _accepted(handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
                    sock: socket.socket) -> asyncio.BaseProtocol:
    """Serve sock, a connection accepted elsewhere (the waiter), as the server serves its
    own: the server's side of it, so an intercepted tunnel's TLS is the server's too."""
    reader = asyncio.StreamReader(limit=EGRESS_HEAD_MAX_BYTES)
    protocol = asyncio.StreamReaderProtocol(reader, handler)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, sock=sock)
    return protocol


async def _bind(proxy: EgressProxy, config: ProxyConfig) -> asyncio.Server:
    """The TCP listener (``listen``, with its credential)."""
    if config.listen is None or config.credential is None:
        raise ConfigError("egress config: a Unix socket is served from its fd (_serve_unix)")
    handler = functools.partial(_with_credential, proxy, CREDENTIAL_PREFIX + config.credential.encode() + b"\n")
    address, port = config.listen
    try:
        return await asyncio.start_server(handler, address, port, limit=EGRESS_HEAD_MAX_BYTES)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        return await asyncio.start_server(handler, address, 0, limit=EGRESS_HEAD_MAX_BYTES)


async def _with_credential(proxy: EgressProxy, expected: bytes,
                           reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve a TCP connection that first sends expected (the sandbox's credential); close
    any other unserved, saying so in the log when it sent something (a probe sends nothing)."""
    try:
        got = await asyncio.wait_for(reader.readexactly(len(expected)), EGRESS_HEAD_READ_SECONDS)
    except asyncio.IncompleteReadError as short:
        got = short.partial
    except (TimeoutError, OSError):
        got = b""
    if hmac.compare_digest(got, expected):
        await proxy.handle(reader, writer)
        return
    if got:
        peer = writer.get_extra_info("peername")
        print(f"guilds egress: a connection from {peer[0] if peer else 'unknown'} without this sandbox's "
              "credential was closed", file=sys.stderr, flush=True)
    writer.close()


def _write_whole(path: Path, text: str) -> None:
    """path holds text, whole, at once (renamed into place): a reader never finds it empty or cut."""
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)


def _pid_line(server: asyncio.Server, config: ProxyConfig) -> str:
    """The pidfile's line: the pid, and on TCP the port listened on."""
    if config.listen is None:
        return f"{os.getpid()}\n"
    return f"{os.getpid()} {server.sockets[0].getsockname()[1]}\n"


class Quiet:
    """When the proxy last had a connection open: the handler, timed."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.since = time.monotonic()
        self.woke: asyncio.BaseProtocol | None = None
        """The protocol of the connection that woke the proxy (it holds its handler's task)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.since = time.monotonic()
        try:
            await self.proxy.handle(reader, writer)
        finally:
            self.since = time.monotonic()

    def for_seconds(self) -> float:
        """Seconds without a connection; 0 while one is open or accepted (every
        connection is a task from its accept on: the proxy's only other task is serve's)."""
        if len(asyncio.all_tasks()) > 1:
            return 0.0
        return time.monotonic() - self.since


async def serve(config: ProxyConfig, handoff: Handoff | None = None) -> bool:
    """Serve config's socket until a stop signal or the idle clock says stop (False).
    handoff (a Unix socket: its listening fd, held by the caller): served through a
    copy of it, and, with ``linger_seconds``, until it has been quiet that long (True:
    the caller execs the waiter; the socket and the pidfile stay)."""
    ca = None
    if (config.secrets or config.headers.hosts) and config.ca_dir:  # only then: its library costs memory
        from .ca import CertificateAuthority

        ca = CertificateAuthority.open(config.ca_dir)
    log = DecisionLog(config.decisions)
    proxy = EgressProxy(config, log, ca)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked across a wake's exec: handled now
    quiet = Quiet(proxy)
    server = await (_bind(proxy, config) if handoff is None else _serve_unix(quiet.handle, handoff.listen_fd))
    if handoff is not None and handoff.conn_fd is not None:  # the connection that woke it, first
        quiet.woke = await _accepted(quiet.handle, socket.socket(fileno=handoff.conn_fd))
    sleeps = handoff is not None and math.isfinite(config.linger_seconds)
    asleep = False
    try:
        if config.pidfile is not None:
            _write_whole(config.pidfile, _pid_line(server, config))
        poll = min(config.idle_seconds / 4, EGRESS_IDLE_POLL_SECONDS, config.linger_seconds / 4)
        while not _idle(config):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
            if stop.is_set():
                break
            if sleeps and quiet.for_seconds() >= config.linger_seconds:
                server.close()  # in the same step as the look: nothing is accepted after it
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # from here a stop waits for the waiter
                await asyncio.sleep(EGRESS_SLEEP_SETTLE_SECONDS)  # ...and one caught just before is handled now
                asleep = not stop.is_set()
                break
    finally:
        server.close()
        await proxy.close()
        log.close()
    if not asleep:
        _remove_files(config)
    return asleep


def _remove_files(config: ProxyConfig) -> None:
    """The socket and the pidfile removed (the proxy ends)."""
    for path in (config.socket, config.pidfile):
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _sleep(config_path: str, config: ProxyConfig, handoff: Handoff) -> NoReturn:
    """Exec the waiter in this process, with the listening socket and the lock (``waiter``)."""
    poll = min(config.idle_seconds / 4, EGRESS_IDLE_POLL_SECONDS)
    os.set_inheritable(handoff.lock_fd, True)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # a stop while the waiter starts waits for its handler
    os.execv(sys.executable, [  # noqa: S606 (the waiter, in this very process)
        sys.executable, "-I", "-S", WAITER, config_path, str(handoff.listen_fd), str(handoff.lock_fd),
        str(config.idle_clock or ""), repr(config.idle_seconds), repr(poll), repr(EGRESS_WAKE_PEEK_SECONDS),
        str(config.socket),
        str(config.pidfile or "")])


def _handoff(args: list[str]) -> Handoff | None:
    """``--listen-fd N --lock-fd N [--conn-fd N]`` (from the waiter), or None (none given);
    ValueError when malformed."""
    if not args:
        return None
    fds = dict(zip(args[::2], map(int, args[1::2]), strict=True))
    if set(fds) - {"--listen-fd", "--lock-fd", "--conn-fd"} or not {"--listen-fd", "--lock-fd"} <= set(fds):
        raise ValueError(args)
    return Handoff(fds["--listen-fd"], fds["--lock-fd"], fds.get("--conn-fd"))


def main(argv: list[str] | None = None) -> int:
    """The program: ``python -m guilds.egress CONFIG.json`` (the waiter adds the fds it hands over)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        handoff = _handoff(args[1:])
    except ValueError:
        handoff, args = None, []
    if not args:
        print("usage: python -m guilds.egress CONFIG.json", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(args[0])
    except ConfigError as bad:
        print(bad, file=sys.stderr)
        return EXIT_CONFIG
    if handoff is None:
        lock = _take_lock(config)
        if config.socket is not None:
            _clear_socket(config.socket)
            handoff = Handoff(_listen_unix(config.socket), -1 if lock is None else lock.fileno())
    if handoff is not None and (config.socket is None or handoff.lock_fd < 0):
        config = replace(config, linger_seconds=math.inf)  # sleeps only on a socket, with its lock
    if asyncio.run(serve(config, handoff)) and handoff is not None:
        _sleep(args[0], config, handoff)
    return 0
