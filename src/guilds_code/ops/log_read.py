"""log_read: a call's Full output log, as the app shows it (not a tool of the model).

The log ``<home>/.runs/<run id>/<name>.log`` (``args.path``, absolute, as the
sandbox sees it) is opened one component at a time beneath the home, no link
followed (the agent may replace ``.runs`` or a log by a link to anywhere), and
must be a regular file. Its first ``LOG_HEAD_BYTES`` and last
``LOG_TAIL_BYTES`` are shaped as shell output is (UTF-8, ANSI escapes removed,
carriage-return redraws at their last state) and redacted with the run's
secrets. The reply's text says what was read; its metadata carries the parts:
``path``, ``size`` (bytes when read), ``head``, ``tail`` ("" when ``head``
holds the whole log) and ``omitted`` (bytes between them).

No secret can pass a cut:

- the start goes through a stream redactor that is never flushed: it holds
  back whatever could be the start of a secret; so does the end of a log whose
  last line is not finished (a command may be writing it);
- the end starts just after a newline. No encoded form of a secret holds a
  newline, so none spans the cut; a secret value that holds newlines (a PEM
  key) is also redacted line by line, so a part of one beginning at the cut
  is caught too.

A missing log says it is no longer kept (``GONE``); a link, a folder or
another kind of file is refused by a sentence that says so.
"""

from __future__ import annotations

import codecs
import errno
import os
import posixpath
import stat

from .. import limits, protocol, reach, redact, runstate
from ..shaping import redraw, strip_ansi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Tuple

GONE = f"The log is no longer kept (logs are kept for the agent's {limits.RUNS_KEPT} most recent runs)."
LINKED = "The log's path holds a link: refused."
NOT_REGULAR = "The log is not a regular file."


def run(request: protocol.Request) -> protocol.Reply:
    path = request.args["path"]
    fd = _open(request.home, log_parts(request.home, path))
    try:
        size, head, tail, omitted = excerpt(fd, _redactor(request))
    finally:
        os.close(fd)
    meta = {"path": path, "size": size, "head": head, "tail": tail, "omitted": omitted}
    return protocol.Reply(f"{path}: {size} bytes", meta)


def secret_lines(values: Iterable[str]) -> List[str]:
    """The lines of every secret value that holds newlines, long enough to redact."""
    return [line.strip("\r") for value in values if "\n" in value
            for line in value.split("\n") if len(line.strip("\r")) >= redact.MIN_SECRET_CHARS]


def _redactor(request: protocol.Request) -> redact.Redactor:
    values = [os.environ.get(name, "") for name in request.redact_env]
    values.extend(runstate.load_repo_tokens(request).values())
    return redact.Redactor([*values, *secret_lines(values)])


def log_parts(home: str, path: str) -> Tuple[str, str, str]:
    """(".runs", run id, file name) of a log path under home; OpError otherwise."""
    norm = posixpath.normpath(path)
    parts = posixpath.relpath(norm, home).split("/") if norm.startswith("/") else []
    if (len(parts) != 3 or parts[0] != ".runs" or not protocol.is_safe_name(parts[1])
            or not protocol.is_safe_name(parts[2]) or not parts[2].endswith(".log")):
        raise protocol.OpError(f"{path} is not a log of this agent's runs.")
    return parts[0], parts[1], parts[2]


def _open(home: str, parts: Tuple[str, str, str]) -> int:
    try:
        return open_beneath(home, parts)
    except FileNotFoundError:
        raise protocol.OpError(GONE) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise protocol.OpError(LINKED) from None
        raise protocol.OpError(f"The log cannot be read: {reach.why(exc, os.path.join(home, *parts), home)}.") from None


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
        raise protocol.OpError(NOT_REGULAR)
    return file_fd


def shape(data: bytes, redactor: redact.Redactor, *, final: bool) -> str:
    """The shell output's shaping, then redaction. Not final: what could be the
    start of a secret at the end is held back."""
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=final)
    shaped = redraw(strip_ansi(text)).encode("utf-8", "surrogateescape")
    out = redactor.redact_bytes(shaped) if final else redactor.stream().feed(shaped)
    return out.decode("utf-8", "replace")


def excerpt(fd: int, redactor: redact.Redactor) -> Tuple[int, str, str, int]:
    """(size, head, tail, omitted) of an open log (see the module docstring).

    The end is final only at a line end: a command may be writing the log
    right now, and its last bytes may be the first half of a secret.
    """
    size = os.fstat(fd).st_size
    if size <= limits.LOG_HEAD_BYTES + limits.LOG_TAIL_BYTES:
        data = os.pread(fd, size, 0)
        return size, shape(data, redactor, final=data.endswith(b"\n")), "", 0
    head = shape(os.pread(fd, limits.LOG_HEAD_BYTES, 0), redactor, final=False)
    window = os.pread(fd, limits.LOG_TAIL_BYTES, size - limits.LOG_TAIL_BYTES)
    cut = window.find(b"\n") + 1
    tail = shape(window[cut:], redactor, final=window.endswith(b"\n")) if cut else ""
    omitted = size - limits.LOG_HEAD_BYTES - (len(window) - cut if cut else 0)
    return size, head, tail, omitted
