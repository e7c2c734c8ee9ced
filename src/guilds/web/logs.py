"""The Full output log of a call, read back through redaction, bounded.

A shell call's full output is kept unredacted in the agent's home, at
``<home>/.runs/<run id>/<call id>.log`` (a background command's log is there
too, under the run that started it). The app opens it through the same
redaction as any result (``guilds_code.redact`` with the agent's secret
values, after the helper's own shaping: ANSI escapes removed, carriage-return
redraws kept at their last state) and shows at most ``LOG_HEAD_BYTES`` of its
start and ``LOG_TAIL_BYTES`` of its end.

No secret can pass a cut:

- the start goes through a stream redactor that is never flushed: it holds
  back whatever could be the start of a secret; so does the end of a log whose
  last line is not finished (a command may be writing it);
- the end starts just after a newline. No encoded form of a secret holds a
  newline, so none spans the cut; a secret value that holds newlines (a PEM
  key) is also redacted line by line, so a part of one beginning at the cut
  is caught too.

``HostLogReader`` serves the backends whose home is a folder on this machine
at the same path (local, bwrap). It opens the log one component at a time
beneath the home, refusing links: the agent may replace ``.runs`` or a log by
a link to anywhere.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import os
import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from guilds_code.limits import RUNS_KEPT
from guilds_code.redact import MIN_SECRET_CHARS, Redactor
from guilds_code.shaping import redraw, strip_ansi

from .._checks import is_safe_name

LOG_HEAD_BYTES = 64 * 1024
"""The start of a log shown: where a command says what it is doing."""
LOG_TAIL_BYTES = 64 * 1024
"""The end of a log shown: where build and test errors are."""
GONE = f"The log is no longer kept (logs are kept for the agent's {RUNS_KEPT} most recent runs)."


class LogUnavailable(Exception):
    """The log cannot be shown; the message says why, in a sentence."""


@dataclass(frozen=True)
class LogExcerpt:
    path: str
    size: int
    """Bytes of the log when it was read."""
    head: str
    tail: str = ""
    """Empty when ``head`` holds the whole log."""
    omitted: int = 0
    """Bytes of the log between head and tail, not shown."""


class LogReader(Protocol):
    async def read(self, agent_id: str, path: str) -> LogExcerpt:
        """The log at ``path`` (as the agent's sandbox sees it), redacted; LogUnavailable if not."""
        ...


def secret_lines(values: Iterable[str]) -> list[str]:
    """The lines of every secret value that holds newlines, long enough to redact."""
    return [line.strip("\r") for value in values if "\n" in value
            for line in value.split("\n") if len(line.strip("\r")) >= MIN_SECRET_CHARS]


def log_parts(home: str, path: str) -> tuple[str, str, str]:
    """(".runs", run id, file name) of a log path under home; LogUnavailable otherwise."""
    norm = posixpath.normpath(path)
    parts = posixpath.relpath(norm, home).split("/") if norm.startswith("/") else []
    if (len(parts) != 3 or parts[0] != ".runs" or not is_safe_name(parts[1])
            or not is_safe_name(parts[2]) or not parts[2].endswith(".log")):
        raise LogUnavailable(f"{path} is not a log of this agent's runs.")
    return parts[0], parts[1], parts[2]


def open_beneath(root: str, parts: Iterable[str]) -> int:
    """A read-only handle on root/parts..., walked one component at a time, no link followed."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        *folders, name = parts
        for folder in folders:
            fd, parent = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 dir_fd=fd), fd
            os.close(parent)
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise LogUnavailable("The log is not a regular file.")
    return file_fd


def shape(data: bytes, redactor: Redactor, *, final: bool) -> str:
    """The helper's shaping (UTF-8, ANSI escapes removed, redraws at their last state), then
    redaction. Not final: what could be the start of a secret at the end is held back."""
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=final)
    shaped = redraw(strip_ansi(text)).encode("utf-8", "surrogateescape")
    out = redactor.redact_bytes(shaped) if final else redactor.stream().feed(shaped)
    return out.decode("utf-8", "replace")


def excerpt(fd: int, path: str, redactor: Redactor) -> LogExcerpt:
    """The redacted start and end of an open log (see the module docstring).

    The end is final only at a line end: a command may be writing the log
    right now, and its last bytes may be the first half of a secret.
    """
    size = os.fstat(fd).st_size
    if size <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
        data = os.pread(fd, size, 0)
        return LogExcerpt(path, size, shape(data, redactor, final=data.endswith(b"\n")))
    head = shape(os.pread(fd, LOG_HEAD_BYTES, 0), redactor, final=False)
    window = os.pread(fd, LOG_TAIL_BYTES, size - LOG_TAIL_BYTES)
    cut = window.find(b"\n") + 1
    tail = shape(window[cut:], redactor, final=window.endswith(b"\n")) if cut else ""
    omitted = size - LOG_HEAD_BYTES - (len(window) - cut if cut else 0)
    return LogExcerpt(path, size, head, tail, omitted)


class HostLogReader:
    """Logs of agents whose home is a host folder seen at the same path (local, bwrap)."""

    def __init__(self, homes: Mapping[str, str], secret_values: Iterable[str]):
        values = list(secret_values)
        self._homes = dict(homes)
        self._redactor = Redactor([*values, *secret_lines(values)])

    async def read(self, agent_id: str, path: str) -> LogExcerpt:
        home = self._homes.get(agent_id)
        if home is None:
            raise LogUnavailable(f"The logs of agent {agent_id} are not served here.")
        return await asyncio.to_thread(self._read, home, path)

    def _read(self, home: str, path: str) -> LogExcerpt:
        try:
            fd = open_beneath(home, log_parts(home, path))
        except FileNotFoundError:
            raise LogUnavailable(GONE) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise LogUnavailable("The log's path holds a link: refused.") from None
            raise LogUnavailable(f"The log cannot be read: {exc.strerror}.") from None
        try:
            return excerpt(fd, path, self._redactor)
        finally:
            os.close(fd)
