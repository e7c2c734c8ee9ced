"""`guilds mcp`'s stdio: the opening requests answered at once, the rest by the MCP SDK once loaded.

    serve(wired)                    `guilds mcp` (wired: guilds.fronts.wiring.resolve)
    relay = Relay.start(answers)    before the SDK is imported; relay.finish() after it served

The relay takes the process's stdin and stdout (the wire) for itself and gives
the SDK a pipe in place of each (fd 0 and fd 1), so the SDK's own stdio runner
serves unchanged:

- a thread reads the wire line by line; each line goes to ``QuickAnswers``
  (``guilds.fronts.mcp_quick``) first, whose response, if any, is written to
  the wire at once; then the line goes on, in order, into the SDK's stdin pipe,
  where the SDK reads it when it is ready (so it sees the whole stream, the
  ``initialize`` it already got an answer to included);
- a thread copies the SDK's stdout pipe to the wire, dropping the SDK's
  response to a request already answered (the first with that id), after
  comparing it: a difference is one line on stderr (``EARLY_ANSWER_DIFFERS``).

The wire's descriptors are close-on-exec: no command the server runs inherits
them. ``finish`` (after the SDK returned, or on a signal before the process
ends) waits until everything the SDK wrote has reached the wire, for at most
``FINISH_WAIT_SECONDS``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, BinaryIO

from ..limits import STDIO_STOP_WAIT_SECONDS
from .mcp_quick import QuickAnswers

if TYPE_CHECKING:
    from .wiring import Wired

log = logging.getLogger(__name__)

END_OF_SDK_OUTPUT = b"\0guilds: end of the server's output\0\n"
"""Written by ``finish`` into the SDK's stdout pipe after the SDK returned: once the
copier reaches it, everything before it is on the wire. No JSON line holds a NUL."""
FINISH_WAIT_SECONDS = STDIO_STOP_WAIT_SECONDS
"""The longest ``finish`` waits for the SDK's output to reach the wire (a client that stopped reading)."""
EARLY_ANSWER_DIFFERS = "guilds mcp: the early answer to request %s differs from the server's: %s"


def _private_copy(fd: int) -> int:
    """A close-on-exec duplicate of fd above the standard descriptors."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class Relay:
    """The wire between the client and the SDK's stdio; see the module docstring."""

    def __init__(self, answers: QuickAnswers, wire_in: BinaryIO, wire_out: int, to_sdk: int, from_sdk: BinaryIO,
                 sdk_out: int = -1):
        self.answers = answers
        self.wire_in, self.wire_out = wire_in, wire_out
        self.to_sdk, self.from_sdk = to_sdk, from_sdk
        self.sdk_out = sdk_out
        """The relay's own copy of the SDK's stdout pipe's write end (fd 1 may point elsewhere by then)."""
        self.lock = threading.Lock()
        self.answered: dict[str, deque[bytes]] = {}
        """Request id (as JSON) -> the early answers sent for it, oldest first."""
        self.inbound = threading.Thread(target=self._read_wire, name="mcp-wire-in", daemon=True)
        self.outbound = threading.Thread(target=self._copy_sdk, name="mcp-wire-out", daemon=True)

    @classmethod
    def start(cls, answers: QuickAnswers) -> Relay:
        """Take fd 0 and fd 1 for the wire, put the SDK's pipes in their place, start both threads."""
        wire_in, wire_out = _private_copy(0), _private_copy(1)
        sdk_in, to_sdk = os.pipe()
        from_sdk, sdk_out = os.pipe()
        for fd in (to_sdk, from_sdk):
            os.set_inheritable(fd, False)
        os.dup2(sdk_in, 0)
        os.dup2(sdk_out, 1)
        os.close(sdk_in)
        os.set_inheritable(sdk_out, False)
        relay = cls(answers, os.fdopen(wire_in, "rb"), wire_out, to_sdk, os.fdopen(from_sdk, "rb"), sdk_out)
        relay.inbound.start()
        relay.outbound.start()
        return relay

    def finish(self) -> None:
        """After the SDK returned (or stopped on a signal): let the copier forward all it wrote, then stop."""
        _write_all(self.sdk_out, END_OF_SDK_OUTPUT)
        self.outbound.join(FINISH_WAIT_SECONDS)

    def _send(self, data: bytes) -> None:
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.wire_out, view):]

    def _read_wire(self) -> None:
        try:
            for line in self.wire_in:  # each line as soon as it has ended
                early = self.answers.answer(line)
                if early is not None:
                    with self.lock:
                        self.answered.setdefault(_id_of(early), deque()).append(early)
                    self._send(early)
                _write_all(self.to_sdk, line if line.endswith(b"\n") else line + b"\n")
        except OSError:
            pass  # the SDK's side closed: it has stopped reading
        finally:
            os.close(self.to_sdk)

    def _copy_sdk(self) -> None:
        for line in self.from_sdk:
            if line == END_OF_SDK_OUTPUT:
                return
            if not self._answered_early(line):
                self._send(line)

    def _answered_early(self, line: bytes) -> bool:
        """True for the SDK's response to a request answered early (reported on stderr when it differs)."""
        with self.lock:
            if not self.answered:
                return False
        try:
            key = _id_of(line)
        except (ValueError, KeyError, TypeError):
            return False
        with self.lock:
            sent = self.answered.get(key)
            if not sent:
                return False
            early = sent.popleft()
            if not sent:
                del self.answered[key]
        if early != line:
            log.warning(EARLY_ANSWER_DIFFERS, key, line.decode(errors="replace").rstrip())
        return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _id_of(line: bytes) -> str:
    """A response's id, as JSON (1 and "1" differ)."""
    message = json.loads(line)
    if "result" not in message and "error" not in message:
        raise KeyError("id")
    return json.dumps(message["id"])


def serve(wired: Wired) -> None:
    """`guilds mcp`: the relay first, then the SDK's server over it until the client closes stdin."""
    relay = Relay.start(QuickAnswers(wired.coding))
    # The tool registry next, while the relay answers the opening request: tools/list's
    # early answer needs it, and loading it beside the SDK would slow both.
    import guilds.toolbox.tools  # noqa: F401

    from .mcp_server import run_stdio

    try:
        run_stdio(wired, before_exit=relay.finish)
    finally:
        relay.finish()


def main(argv: list[str] | None = None) -> None:
    """``python -m guilds.fronts.mcp_stdio SETTINGS_FILE DATA_DIR``: `guilds mcp --config FILE`
    without the CLI (the tests and the benchmarks launch it so)."""
    from .wiring import resolve

    settings_file, data = sys.argv[1:] if argv is None else argv
    serve(resolve(settings_file, data_dir=data))


if __name__ == "__main__":
    main()
