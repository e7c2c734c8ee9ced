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
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import hmac
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO

from ..limits import EGRESS_HEAD_MAX_BYTES, EGRESS_HEAD_READ_SECONDS, EGRESS_IDLE_POLL_SECONDS
from .decisions import DecisionLog
from .proxy import EgressProxy
from .proxy_config import CREDENTIAL_PREFIX, ConfigError, ProxyConfig, load_config

EXIT_CONFIG = 2
"""The config could not be read or is wrong."""
EXIT_RUNNING = 3
"""Another proxy holds this sandbox's lock: it serves already."""


def is_serving(socket_path: str | os.PathLike[str]) -> bool:
    """Does a proxy answer on socket_path? (The orchestrator's check before a call: a dead
    proxy leaves its socket behind, and is started again.)"""
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(os.fspath(socket_path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def is_listening(address: str, port: int) -> bool:
    """Does a proxy listen at address:port? (The TCP form of ``is_serving``.)"""
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


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


async def _bind(proxy: EgressProxy, config: ProxyConfig) -> asyncio.Server:
    if config.listen is None or config.credential is None:
        path = str(config.socket)
        server = await asyncio.start_unix_server(proxy.handle, path=path, limit=EGRESS_HEAD_MAX_BYTES)
        os.chmod(path, 0o666)  # noqa: S103 (the sandbox's uid connects; the socket is its only way out)
        return server
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


def _pid_line(server: asyncio.Server, config: ProxyConfig) -> str:
    """The pidfile's line: the pid, and on TCP the port listened on."""
    if config.listen is None:
        return f"{os.getpid()}\n"
    return f"{os.getpid()} {server.sockets[0].getsockname()[1]}\n"


async def serve(config: ProxyConfig) -> None:
    """Serve config's socket until a stop signal or the idle clock says stop."""
    ca = None
    if config.secrets and config.ca_dir:  # only then: the authority's library costs memory
        from .ca import CertificateAuthority

        ca = CertificateAuthority.open(config.ca_dir)
    log = DecisionLog(config.decisions)
    proxy = EgressProxy(config, log, ca)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await _bind(proxy, config)
    try:
        if config.pidfile is not None:
            config.pidfile.write_text(_pid_line(server, config))
        poll = min(config.idle_seconds / 4, EGRESS_IDLE_POLL_SECONDS)
        while not _idle(config):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
            if stop.is_set():
                break
    finally:
        server.close()
        await proxy.close()
        if config.socket is not None:
            with contextlib.suppress(FileNotFoundError):
                config.socket.unlink()
        if config.pidfile is not None:
            with contextlib.suppress(FileNotFoundError):
                config.pidfile.unlink()
        log.close()


def main(argv: list[str] | None = None) -> int:
    """The program: ``python -m guilds.egress CONFIG.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m guilds.egress CONFIG.json", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(args[0])
    except ConfigError as bad:
        print(bad, file=sys.stderr)
        return EXIT_CONFIG
    lock = _take_lock(config)
    if config.socket is not None:
        _clear_socket(config.socket)
    try:
        asyncio.run(serve(config))
    finally:
        if lock is not None:
            lock.close()
    return 0
