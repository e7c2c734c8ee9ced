"""A local stand-in for the API server's pods/exec: the real websocket handshake
(RFC 6455) and the real channel framing, with a real process behind it.

Framing, as the API server speaks it: every binary message starts with a
channel byte, 0 stdin (client to server), 1 stdout, 2 stderr, 3 the final
``Status`` JSON; at the start one empty message per output channel. In
``v5.channel.k8s.io`` a client message ``[255, 0]`` closes the process's stdin
while the connection stays; in ``v4.channel.k8s.io`` stdin ends with the
connection. ``run_as`` maps the command the orchestrator sends to what runs
here (its helper path is the pod's).
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import subprocess
import threading
from typing import Callable, Sequence
from urllib.parse import parse_qs, urlparse

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class ExecServer:
    """Serves pods/exec on 127.0.0.1 (one thread per connection)."""

    def __init__(self, protocols: Sequence[str], run_as: Callable[[list[str]], list[str]],
                 objects: dict[str, dict] | None = None):
        """objects: plain GETs answered by path (a pod, as the API server returns it)."""
        self.protocols, self.run_as = list(protocols), run_as
        self.objects = objects if objects is not None else {}
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.seen: list[dict] = []
        self.procs: list[subprocess.Popen] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                pipe.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = _read_head(conn)
            lines = request.split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            if headers.get("upgrade", "").lower() != "websocket":
                self._get(conn, urlparse(path).path)
                return
            offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
            chosen = next((p for p in offered if p in self.protocols), None)
            query = parse_qs(urlparse(path).query)
            self.seen.append({"path": urlparse(path).path, "query": query, "protocol": chosen,
                              "authorization": headers.get("authorization")})
            if chosen is None:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            key = headers["sec-websocket-key"].encode() + GUID
            accept = base64.b64encode(hashlib.sha1(key).digest())  # noqa: S324 - RFC 6455 says SHA-1
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: "
                         + chosen.encode() + b"\r\n\r\n")
            self._pump(conn, chosen, self.run_as(query["command"]))

    def _get(self, conn: socket.socket, path: str) -> None:
        found = self.objects.get(path)
        body = json.dumps(found if found is not None else {
            "kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}).encode()
        status = b"200 OK" if found is not None else b"404 Not Found"
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    def _pump(self, conn: socket.socket, protocol: str, argv: list[str]) -> None:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                bufsize=0)
        self.procs.append(proc)
        send_lock = threading.Lock()

        def send(channel: int, data: bytes) -> None:
            with send_lock:
                conn.sendall(_frame(0x2, bytes([channel]) + data))

        for channel in (1, 2):
            send(channel, b"")
        outs = [threading.Thread(target=_copy, args=(pipe, channel, send), daemon=True)
                for pipe, channel in ((proc.stdout, 1), (proc.stderr, 2))]
        for thread in outs:
            thread.start()
        threading.Thread(target=self._stdin, args=(conn, proc, protocol), daemon=True).start()
        for thread in outs:
            thread.join()
        code = proc.wait()
        status = {"metadata": {}, "status": "Success"} if code == 0 else {
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        try:
            send(3, json.dumps(status).encode())
            with send_lock:
                conn.sendall(_frame(0x8, struct.pack("!H", 1000)))
        except OSError:
            pass

    def _stdin(self, conn: socket.socket, proc: subprocess.Popen, protocol: str) -> None:
        try:
            while True:
                opcode, payload = _read_frame(conn)
                if opcode == 0x8:
                    break
                if payload[:1] == b"\x00":
                    proc.stdin.write(payload[1:])
                elif payload == b"\xff\x00" and protocol.startswith("v5"):
                    proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            proc.stdin.close()
        except OSError:
            pass


def _copy(pipe, channel: int, send: Callable[[int, bytes], None]) -> None:
    while chunk := pipe.read(65536):
        try:
            send(channel, chunk)
        except OSError:
            return


def _read_head(conn: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("latin-1")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ValueError("connection closed")
        data += chunk
    return data


def _read_frame(conn: socket.socket) -> tuple[int, bytes]:
    """One client frame (masked, as clients must send them), unmasked."""
    first, second = _recv_exact(conn, 2)
    size = second & 0x7F
    if size == 126:
        size = struct.unpack("!H", _recv_exact(conn, 2))[0]
    elif size == 127:
        size = struct.unpack("!Q", _recv_exact(conn, 8))[0]
    mask = _recv_exact(conn, 4) if second & 0x80 else b"\0\0\0\0"
    payload = _recv_exact(conn, size)
    return first & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _frame(opcode: int, payload: bytes) -> bytes:
    """One server frame (unmasked, final)."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return head + payload
