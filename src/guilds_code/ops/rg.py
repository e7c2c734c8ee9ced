"""Running ripgrep: its path, its whole command line, the run with a timeout, its errors.

The command line (rg_argv) is built so that no pattern or glob can be read as
an option; what the search respects and skips is code_search's contract (see
its docstring). run_rg feeds rg's standard output to a sink as it comes.
"""

from __future__ import annotations

import os
import select
import time

from .. import limits, proc, protocol

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Tuple

EXCLUDED = ("!.git", "!.runs")
"""Globs added after the model's: later globs win, so these always apply."""
_READ_SIZE = 256 * 1024


def rg_program() -> str:
    """rg's absolute path, found on PATH."""
    program = proc.find_program("rg", os.environ)
    if program is None:
        raise protocol.OpError("code_search: rg (ripgrep) is not installed in the sandbox")
    return program


def rg_argv(program: str, args: Dict[str, Any], root: str) -> List[str]:
    """The whole rg command line: no pattern or glob can be read as an option."""
    argv = [program, "--no-config", "--no-require-git", "--hidden", "--no-messages"]
    argv += ["--color=never", "--null", "--with-filename"]
    if args["mode"] == "files":
        argv.append("--count-matches")
    else:
        argv += ["--line-number", "--no-heading", "--stats"]
        argv += [f"--max-count={limits.SEARCH_MATCHES_PER_FILE}", f"--context={args['context']}"]
    if args["fixed"]:
        argv.append("--fixed-strings")
    if args["ignore_case"]:
        argv.append("--ignore-case")
    if args["glob"] is not None:
        argv.append(f"--glob={args['glob']}")
    argv += [f"--glob={glob}" for glob in EXCLUDED]
    return argv + [f"--regexp={args['pattern']}", "--", root]


def run_rg(
    argv: List[str], stdin: Optional[int], timeout: float, sink: Callable[[bytes], None]
) -> Tuple[int, bytes, bool]:
    """Run argv, feeding its stdout to sink as it comes; (exit code, stderr start, timed out).

    stdin is a descriptor to read from, or None for /dev/null. Runs in the
    helper's working directory, without RIPGREP_CONFIG_PATH in its environment.
    Past timeout seconds the process is killed (exit code -9). At most
    limits.SEARCH_STDERR_MAX_BYTES of stderr are kept.
    """
    env = {k: v for k, v in os.environ.items() if k != "RIPGREP_CONFIG_PATH"}
    try:
        child = proc.spawn(argv, env, stdin=stdin, stderr=proc.PIPE)
    except OSError as exc:
        raise protocol.OpError(f"code_search: cannot run {argv[0]}: {exc.strerror}") from None
    out_fd, err_fd = proc.read_end(child.stdout), proc.read_end(child.stderr)
    try:
        err, timed_out = _collect(child, time.monotonic() + timeout, sink)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    return child.wait(), err, timed_out


def _collect(child: proc.Child, deadline: float, sink: Callable[[bytes], None]) -> Tuple[bytes, bool]:
    """Read the child's stdout into sink and keep its stderr's start, until both
    end or the deadline (then SIGKILL); (stderr start, timed out)."""
    err = bytearray()
    poller = select.poll()
    open_fds = {proc.read_end(child.stdout), proc.read_end(child.stderr)}
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(child.pid, proc.signals.SIGKILL)
            return bytes(err), True
        got = 0
        for fd, _ in poller.poll(left * 1000):
            data = os.read(fd, _READ_SIZE)
            got += len(data)
            if not data:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif fd == child.stdout:
                sink(data)
            else:
                err += data[: limits.SEARCH_STDERR_MAX_BYTES - len(err)]
        if 0 < got < limits.SEARCH_COALESCE_BELOW_BYTES:
            time.sleep(min(limits.SEARCH_COALESCE_SECONDS, left))
    return bytes(err), False


def rg_error(stderr: bytes) -> str:
    """rg's error as one line: 'regex parse error: unclosed group', 'error parsing glob ...'."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return "code_search: rg failed"
    first = lines[0].removeprefix("rg: ")
    detail = [line for line in lines[1:] if line.startswith("error: ")]
    if first.endswith(":") and detail:
        first = f"{first} {detail[-1][len('error: '):]}"
    return f"code_search: {first}"
