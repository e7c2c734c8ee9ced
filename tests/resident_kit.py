"""A test's end of ``guilds-code serve``: the built helper under ``python3 -I -S``,
frames written and read by hand (blocking, with timeouts)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any, Mapping

from guilds_code.protocol import decode_envelope


class ResidentServer:
    """One running ``guilds-code serve`` and the frames it wrote that no one read yet."""

    def __init__(self, python: str, helper: str, env: Mapping[str, str], *extra: str, pass_fds: tuple = ()):
        self.proc = subprocess.Popen([python, "-I", "-S", helper, "serve", *extra], env=dict(env),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0, pass_fds=pass_fds)
        self.env = dict(env)
        self._buffer = b""
        self._ids = 0
        self.hello = self.read_frame(30)

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)

    def request(self, req: dict[str, Any], frame_id: str | None = None) -> str:
        self._ids += 1
        frame_id = frame_id or f"t{self._ids}"
        self.send(json.dumps({"v": 1, "id": frame_id, "request": req}).encode() + b"\n")
        return frame_id

    def cancel(self, frame_id: str) -> None:
        self.send(json.dumps({"v": 1, "id": frame_id, "cancel": True}).encode() + b"\n")

    def read_line(self, timeout: float) -> bytes:
        """The next line of stdout (b"" at its end); AssertionError past timeout."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "no frame in time"
            if not select.select([self.proc.stdout], [], [], left)[0]:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line + b"\n"

    def ready(self) -> bool:
        """Is a frame (or stdout's end) waiting to be read now?"""
        return b"\n" in self._buffer or bool(select.select([self.proc.stdout], [], [], 0)[0])

    def read_frame(self, timeout: float = 60) -> dict[str, Any]:
        line = self.read_line(timeout)
        assert line.endswith(b"\n"), f"stdout ended: {line[:200]!r}"
        return json.loads(line)

    def answers(self, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        """The next count answer frames, each with its envelope decoded, in arrival order."""
        out = []
        for _ in range(count):
            frame = self.read_frame(timeout)
            frame["envelope"] = decode_envelope(frame["envelope"].encode())
            out.append(frame)
        return out

    def call(self, req: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        frame_id = self.request(req)
        (answer,) = self.answers(1, timeout)
        assert answer["id"] == frame_id, answer
        return answer["envelope"]

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))

    def close(self, timeout: float = 10) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code
