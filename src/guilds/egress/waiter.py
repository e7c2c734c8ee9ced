"""The egress proxy asleep: its process while no connection comes (``daemon``).

A proxy on a Unix socket that served no connection for ``linger_seconds`` execs
this file in its own process (the same pid, its pidfile still right, its lock
still held): ``python -I -S waiter.py CONFIG LISTEN_FD LOCK_FD CLOCK IDLE POLL
PEEK SOCKET PIDFILE``. It holds the listening socket and nothing else: never the
config, so no secret is in its memory. It imports only modules built into the
interpreter (``_socket``, ``_signal``, ``posix``, ``select``, ``time``), nothing
of guilds, so it costs about what a bare interpreter does.

- A connection that sends something (or nothing within PEEK seconds) wakes the
  proxy: the process execs ``python -m guilds.egress CONFIG --listen-fd ...
  --lock-fd ... --conn-fd ...``, which serves that connection first, then every
  other one the socket holds. Connections that come meanwhile wait in the
  socket's backlog: none is lost.
- A connection closed before it sent a byte (the orchestrator's check that a
  proxy answers, ``daemon.is_serving``) is closed, and the proxy sleeps on.
- The idle clock older than IDLE seconds (or gone; CLOCK "" means none), SIGTERM
  or SIGINT: the socket and the pidfile are removed and the process exits 0, as
  the proxy does. Both signals are blocked across each exec, so one sent while
  the next program starts is taken once its handler is in place. A wake that
  cannot exec exits 1 the same way: the socket goes, and the sandbox's
  connections are refused until a call starts the proxy again.
"""

import _signal  # type: ignore[import-not-found]
import _socket
import posix
import select
import sys
import time

STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGINT)
"""Blocked across each exec (the mask outlives it), unblocked once a handler is in place."""


class Stop(Exception):
    """SIGTERM or SIGINT came."""


def _stop(signum, frame):
    raise Stop


def idle(clock, seconds):
    """The idle clock says stop: older than seconds, or gone ("" is no clock)."""
    if not clock:
        return False
    try:
        return time.time() - posix.stat(clock).st_mtime >= seconds
    except FileNotFoundError:
        return True


def sends(conn, peek_seconds):
    """False when conn ended without sending a byte within peek_seconds (a check, not a client)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if not poller.poll(int(peek_seconds * 1000)):
        return True
    try:
        return conn.recv(1, _socket.MSG_PEEK) != b""
    except OSError:
        return False


def wake(config, listen_fd, lock_fd, conn):
    """Exec the proxy with the listening socket, the lock and the connection (never returns)."""
    posix.set_inheritable(conn.fileno(), True)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, STOP_SIGNALS)  # a stop while the proxy starts waits for its handler
    posix.execv(sys.executable, [sys.executable, "-m", "guilds.egress", config, "--listen-fd", str(listen_fd),
                                 "--lock-fd", str(lock_fd), "--conn-fd", str(conn.fileno())])


def wait(config, listen_fd, lock_fd, clock, idle_seconds, poll_seconds, peek_seconds):
    """Sleep until a connection wakes the proxy (exec), or the idle clock says stop (return)."""
    listener = _socket.socket(fileno=listen_fd)
    poller = select.poll()
    poller.register(listen_fd, select.POLLIN)
    while not idle(clock, idle_seconds):
        if not poller.poll(int(poll_seconds * 1000) + 1):
            continue
        try:
            conn = _socket.socket(fileno=listener._accept()[0])
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            continue
        if sends(conn, peek_seconds):
            wake(config, listen_fd, lock_fd, conn)
        conn.close()


def main(argv):
    config, listen_fd, lock_fd, clock, idle_seconds, poll_seconds, peek_seconds, socket_path, pidfile = argv
    for signum in STOP_SIGNALS:
        _signal.signal(signum, _stop)
    status = 0
    try:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked across the exec: handled now
        wait(config, int(listen_fd), int(lock_fd), clock, float(idle_seconds), float(poll_seconds),
             float(peek_seconds))
    except Stop:
        pass
    except OSError as exc:
        posix.write(2, f"guilds egress: the proxy could not wake: {exc}\n".encode())
        status = 1
    for signum in STOP_SIGNALS:
        _signal.signal(signum, _signal.SIG_IGN)
    for path in (socket_path, pidfile):
        try:
            posix.unlink(path)
        except FileNotFoundError:
            pass
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
