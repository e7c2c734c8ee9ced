"""shell_status wait and until: sleep until a background command ends, a new
line of its log matches, or the wait passes.

The helper sleeps in ``poll`` on a pidfd of each command's wrapper (the
process that leads its group and writes its exit status): the kernel wakes it
when the wrapper exits, and nothing runs meanwhile. With ``until`` it also
looks at the log's size between sleeps (limits.WAIT_POLL_MIN_SECONDS doubling
to WAIT_POLL_MAX_SECONDS, back to the first when the log grew) and matches the
lines written since the call began: a complete line at a time (a line with no
newline yet waits for it, or for the command's end), shaped as output is (ANSI
removed, redraws applied, secrets redacted) before the pattern sees it. Without
a pidfd (an old kernel or Python) the end is seen at the next look.

A call told to stop (the orchestrator cancelling it) ends at once: the wait
holds nothing to clean up.

What ended the wait, as the first line of the result:
    ended                       the command is no longer running
    matched: <line>             a new line matched until (clipped)
    still running after Ns      the wait passed
Without an id: ``ended: b2`` (the first command seen ending), ``still running
after Ns``, or ``no command is running`` at once.
"""

from __future__ import annotations

import os
import select
import time

from .. import limits, protocol, runstate, shaping
from .background import leader, list_ids, load_record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from typing import Any, Dict, List, Optional, Tuple

    from ..redact import Redactor


class Waited:
    """What ended a wait: its line, the matched line (or None), its length in ms."""

    __slots__ = ("line", "matched", "waited_ms")

    def __init__(self, line: str, matched: Optional[str], waited_ms: int):
        self.line, self.matched, self.waited_ms = line, matched, waited_ms


def seconds(args: Dict[str, Any]) -> int:
    """The wait asked for: args.wait, else the until default."""
    return args["wait"] if args["wait"] is not None else limits.STATUS_UNTIL_WAIT_DEFAULT


def wait_one(request: protocol.Request, record: Dict[str, Any], running: bool) -> Waited:
    """Wait on one command (running: its state was running or stopping)."""
    began = time.monotonic()
    limit = seconds(request.args)
    if not running:
        return Waited("ended", None, 0)
    follower = None
    if request.args["until"] is not None:
        import re  # only for an until

        follower = _Follower(str(record.get("log_path", "")), re.compile(request.args["until"]),
                             runstate.redactor_for(request))
    watch = _Watch([record])
    try:
        matched = _sleep(watch, follower, began + limit)
    finally:
        watch.close()
        if follower is not None:
            follower.close()
    waited_ms = round((time.monotonic() - began) * 1000)
    if matched is not None:
        return Waited(f"matched: {matched}", matched, waited_ms)
    if watch.ended:
        return Waited("ended", None, waited_ms)
    return Waited(f"still running after {limit}s", None, waited_ms)


def wait_any(request: protocol.Request, folder: str, running: List[Tuple[str, Dict[str, Any]]]) -> Waited:
    """Wait until any of the running commands ends."""
    began = time.monotonic()
    limit = seconds(request.args)
    if not running:
        return Waited("no command is running", None, 0)
    watch = _Watch([record for _, record in running])
    try:
        _sleep(watch, None, began + limit)
    finally:
        watch.close()
    waited_ms = round((time.monotonic() - began) * 1000)
    if watch.ended:
        bid = running[watch.ended_index][0]
        return Waited(f"ended: {bid}", None, waited_ms)
    return Waited(f"still running after {limit}s", None, waited_ms)


def _sleep(watch: _Watch, follower: Optional[_Follower], deadline: float) -> Optional[str]:
    """Sleep until the watch sees an end, the follower a match, or the deadline;
    the matched line or None."""
    interval = limits.WAIT_POLL_MIN_SECONDS
    while True:
        if follower is not None:
            grew, matched = follower.look()
            if matched is not None:
                return matched
            interval = limits.WAIT_POLL_MIN_SECONDS if grew else min(interval * 2, limits.WAIT_POLL_MAX_SECONDS)
        now = time.monotonic()
        if watch.ended or now >= deadline:
            break
        nap = deadline - now
        if follower is not None or not watch.has_pidfds:
            nap = min(nap, interval)
        watch.sleep(nap)
        if not watch.has_pidfds:
            interval = min(interval * 2, limits.WAIT_POLL_MAX_SECONDS)
    if follower is not None and watch.ended:
        return follower.finish()
    return None


class _Watch:
    """The wrappers of some commands: pidfds in a poll, or /proc looks without them."""

    def __init__(self, records: List[Dict[str, Any]]):
        self.records = records
        self.ended = False
        self.ended_index = 0
        self.poller = select.poll()
        self.fds: Dict[int, int] = {}
        for index, record in enumerate(records):
            fd = _pidfd(record)
            if fd is None and not _alive(record):
                self._end(index)
            elif fd is not None:
                self.fds[fd] = index
                self.poller.register(fd, select.POLLIN)
        self.has_pidfds = len(self.fds) == len(records)

    def _end(self, index: int) -> None:
        if not self.ended:
            self.ended, self.ended_index = True, index

    def sleep(self, seconds: float) -> None:
        for fd, _ in self.poller.poll(max(0, int(seconds * 1000)) + 1):
            self._end(self.fds[fd])
        if not self.has_pidfds:
            for index, record in enumerate(self.records):
                if index not in self.fds.values() and not _alive(record):
                    self._end(index)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _pidfd(record: Dict[str, Any]) -> Optional[int]:
    """A pidfd of the record's wrapper, once it is sure to be that process; None
    when pidfds are missing or the process is gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd = opener(record["pid"])
    except OSError:
        return None
    if not _alive(record):  # checked after opening: the fd cannot name a later process
        os.close(fd)
        return None
    return fd


def _alive(record: Dict[str, Any]) -> bool:
    """The record's wrapper still runs (background.leader: this sandbox's, same start time; not a zombie)."""
    info = leader(record)
    return info is not None and info.state not in "ZX"


class _Follower:
    """The lines a log gains after the wait began, matched against a pattern."""

    def __init__(self, path: str, pattern: re.Pattern, redactor: Redactor):
        self.pattern, self.redactor = pattern, redactor
        self.fd = runstate.open_regular(path)
        self.offset = os.fstat(self.fd).st_size if self.fd is not None else 0
        self.carry = b""

    def look(self) -> Tuple[bool, Optional[str]]:
        """(whether the log grew, the first new complete line that matched)."""
        if self.fd is None:
            return False, None
        size = os.fstat(self.fd).st_size
        if size <= self.offset:
            return False, None
        while self.offset < size:
            chunk = os.pread(self.fd, min(limits.READ_CHUNK, size - self.offset), self.offset)
            if not chunk:
                break
            self.offset += len(chunk)
            matched = self._feed(chunk)
            if matched is not None:
                return True, matched
        return True, None

    def _feed(self, chunk: bytes) -> Optional[str]:
        data = self.carry + chunk
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) > limits.UNTIL_LINE_SCAN_BYTES:
            end = len(data)
        self.carry = data[end:]
        return self._match(data[:end])

    def _match(self, block: bytes) -> Optional[str]:
        if not block:
            return None
        text = shaping.shape_bytes(block, self.redactor).decode("utf-8", "replace")
        for line in text.split("\n"):
            if line and self.pattern.search(line[: limits.UNTIL_MATCH_MAX_CHARS]):
                return shaping.clip_line(line.strip(), limits.UNTIL_LINE_MAX_CHARS)
        return None

    def finish(self) -> Optional[str]:
        """After the command ended: the rest of the log, its last line too."""
        _, matched = self.look()
        if matched is None:
            matched, self.carry = self._match(self.carry), b""
        return matched

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def running_records(folder: str, states) -> List[Tuple[str, Dict[str, Any]]]:
    """(id, record) of the commands whose state (from states(bid, record)) is running or stopping."""
    out = []
    for n in list_ids(folder):
        bid = f"{limits.BACKGROUND_ID_PREFIX}{n}"
        record = load_record(folder, bid)
        if record is not None and states(bid, record) in ("running", "stopping"):
            out.append((bid, record))
    return out
