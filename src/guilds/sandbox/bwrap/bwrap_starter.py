"""A bwrap sandbox's helpers forked warm by a starter (``guilds_code.starter``), not started anew.

Opening a helper through ``nsenter`` starts ``sh`` (the limits), ``nsenter``, two
``setpriv`` and a Python interpreter that imports the helper: tens of ms of CPU,
paid by every sandbox's first call. A root orchestrator instead keeps one
``guilds-code starter`` per helper file (started at its first open, on the host,
outside every sandbox): it has imported the helper once, and each open is a fork
of it that enters the sandbox's namespaces and drops to the agent's uid as
nsenter and setpriv would (``guilds_code.starter`` says what, step by step).

Only for a helper (``python -I <helper> ...``), with an orchestrator that is root
(not in a user namespace of its own). A starter that cannot be started, or that
fails other than by finding the sandbox's init gone, is left for the rest of this
process: the open goes through nsenter, with one warning line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
from typing import Any

from guilds_code.starter import COMMAND_LINE_ROOM

from ...errors import SandboxError
from ...limits import BWRAP_START_SECONDS
from .._spawn import read_until
from ..process_channel import StartedProcess

log = logging.getLogger(__name__)

START_MESSAGE = b"s"
GONE = "gone: "
"""The answer's start when the sandbox's init is not the one named any more."""


def _writable_by_agent(stdout: int, request: dict[str, Any]) -> None:
    """The helper's stdout pipe made the agent's, to write only (mode 0200): the resident
    helper's workers, which run as the agent's uid, then open it through ``/proc`` and write
    their answers themselves, with no hop through the server (docs/helper.md). The agent's
    commands could write there too, as on the other backends ("What a command inside the
    sandbox can do to the channel"), and can read nothing from it; stdin stays root's. A
    failure leaves the pipe root's: the server then writes every answer."""
    with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
        os.fchown(stdout, int(request["uid"]), int(request["gid"]))
        os.fchmod(stdout, 0o200)


class StarterFailed(Exception):
    """The starter could not start a helper for a reason of its own (not the sandbox's)."""


class Starter:
    """One ``guilds-code starter`` process (started at the first ``start``) and its socket."""

    def __init__(self, python: str, helper_file: str):
        self.python, self.helper_file = python, helper_file
        self.broken: str | None = None
        """Why this process no longer uses it; None while it does."""
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    def start(self, request: dict[str, Any]) -> StartedProcess:
        """A helper forked into the sandbox the request names (``guilds_code.starter``'s
        request), its pipes held here. SandboxError when the sandbox's init is gone;
        StarterFailed for any failure of the starter's own."""
        body = os.memfd_create("guilds-start", os.MFD_CLOEXEC)
        pipes = [os.pipe() for _ in range(4)]  # stdin, stdout, stderr, the answer
        (in_r, in_w), (out_r, out_w), (err_r, err_w), (ans_r, ans_w) = pipes
        theirs, ours = [body, in_r, out_w, err_w, ans_w], [in_w, out_r, err_r]
        _writable_by_agent(out_w, request)
        try:
            os.write(body, json.dumps(request).encode())
            self._send(theirs)
        except BaseException:
            _close(ours)
            raise
        finally:
            _close(theirs)
        try:
            answer = read_until(ans_r, timeout=BWRAP_START_SECONDS, stop=b"\n").decode(errors="replace").strip()
        finally:
            os.close(ans_r)
        if answer.isdigit():
            return StartedProcess(int(answer), os.fdopen(in_w, "wb", 0), os.fdopen(out_r, "rb", 0),
                                  os.fdopen(err_r, "rb", 0))
        _close(ours)
        if answer.startswith(GONE):
            raise SandboxError(answer[len(GONE):])
        raise StarterFailed(answer.removeprefix("error: ") or "the starter did not answer")

    def _send(self, fds: list[int]) -> None:
        with self._lock:
            for attempt in (1, 2):  # a starter that died (killed) is started again, once
                sock = self._running()
                try:
                    socket.send_fds(sock, [START_MESSAGE], fds)
                    return
                except OSError as exc:
                    self._stop()
                    if attempt == 2:
                        raise StarterFailed(f"the starter is gone ({exc.strerror or exc})") from exc

    def _running(self) -> socket.socket:
        if self._proc is not None and self._sock is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        helper = -1
        try:
            helper = os.open(self.helper_file, os.O_RDONLY)
            self._proc = subprocess.Popen(
                [self.python, "-I", "-S", f"/dev/fd/{helper}", "starter", " " * COMMAND_LINE_ROOM],
                stdin=theirs.fileno(), pass_fds=(helper,),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                cwd="/", start_new_session=True)
        except OSError as exc:
            ours.close()
            raise StarterFailed(f"cannot run the starter: {exc.strerror or exc}") from exc
        finally:
            theirs.close()
            if helper >= 0:
                os.close(helper)
        self._sock = ours
        return ours

    def _stop(self) -> None:
        """The socket closed (the starter then ends) and the process waited for."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            proc, self._proc = self._proc, None
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        with self._lock:
            self._stop()


_starters: dict[tuple[str, str], Starter] = {}
_starters_lock = threading.Lock()


def starter_for(python: str, helper_file: str) -> Starter:
    """This process's starter of helper_file under python (made once; started at its first use,
    ended when this process exits: its helpers live on)."""
    with _starters_lock:
        key = (python, helper_file)
        if key not in _starters:
            if not _starters:
                atexit.register(_close_all)
            _starters[key] = Starter(python, helper_file)
        return _starters[key]


def _close_all() -> None:
    for starter in list(_starters.values()):
        starter.close()


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
