"""``guilds-code serve --direct 1``: the channel offered over TCP, for an orchestrator
that reaches the sandbox's address (a pod's IP) and would rather not carry each frame
through the streams of the exec that started the server (the API server and the
kubelet, on kubernetes).

The server listens on every address of the sandbox, on a port the kernel picks, and
says which in its hello (``"direct": PORT``). The orchestrator sends a token frame on
stdin, ``{"v": 1, "direct": TOKEN}`` (TOKEN: 32 to 128 hex digits, never in an argv or
an environment), connects to that port and sends ``TOKEN\\n``. The first connection
that names it becomes the channel: the server's stdin and stdout are that socket from
then on (the exec's streams are closed), the listener is closed, and the server says
hello again on the socket. A connection that names anything else within
DIRECT_TOKEN_SECONDS is closed; after DIRECT_REFUSALS_MAX of them, at
DIRECT_OFFER_SECONDS after the hello, or at the first request frame on stdin (the
orchestrator kept the exec's streams), the listener is closed and the exec's streams
stay the channel. The socket's end is stdin's end, as the exec's would be.
"""

from __future__ import annotations

import hmac
import socket
import time

from . import limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

TOKEN_HEX_BOUNDS = (32, 128)


def token_of(frame: object) -> Optional[bytes]:
    """The token a ``{"v": 1, "direct": TOKEN}`` frame names; None for any other frame."""
    if not isinstance(frame, dict) or set(frame) != {"v", "direct"}:
        return None
    token = frame["direct"]
    low, high = TOKEN_HEX_BOUNDS
    if not isinstance(token, str) or not low <= len(token) <= high:
        return None
    if any(c not in "0123456789abcdef" for c in token):
        return None
    return token.encode("ascii")


class Offer:
    """The listener while the channel is offered over TCP."""

    def __init__(self) -> None:
        self.sock = _listener()
        self.port = int(self.sock.getsockname()[1])
        self.token: Optional[bytes] = None
        self.until = time.monotonic() + limits.DIRECT_OFFER_SECONDS
        self.refused = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def over(self) -> bool:
        """Past its time, or refused too often: to be closed."""
        return self.refused >= limits.DIRECT_REFUSALS_MAX or time.monotonic() >= self.until

    def take(self) -> Optional[int]:
        """The descriptor of a connection that named the token (blocking, close-on-exec);
        None when the one waiting did not (it is closed)."""
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return None
        try:
            conn.settimeout(limits.DIRECT_TOKEN_SECONDS)
            line = _line(conn, TOKEN_HEX_BOUNDS[1] + 1)
        except OSError:
            line = b""
        if self.token is not None and line and hmac.compare_digest(line, self.token):
            conn.settimeout(None)
            _no_delay(conn)
            return conn.detach()
        conn.close()
        self.refused += 1
        return None

    def close(self) -> None:
        self.sock.close()


def _listener() -> socket.socket:
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True, backlog=4)
        except OSError:  # no IPv6 in this sandbox
            pass
    return socket.create_server(("0.0.0.0", 0), backlog=4)  # noqa: S104 - every address: the pod's IP


def _line(conn: socket.socket, most: int) -> bytes:
    """The first line conn sends (without its newline), read up to most bytes; b"" when
    none comes whole."""
    got = b""
    while b"\n" not in got and len(got) <= most:
        part = conn.recv(most + 1 - len(got))
        if not part:
            return b""
        got += part
    line, newline, _ = got.partition(b"\n")
    return line if newline else b""


def _no_delay(conn: socket.socket) -> None:
    """Each frame sent at once (TCP_NODELAY): a frame is one write, and one that follows
    another unanswered (a second call's answer, a cancel) would otherwise wait for the
    first's acknowledgement."""
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
