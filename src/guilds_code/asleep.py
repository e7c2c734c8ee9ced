"""The resident server asleep: its process while no request comes (``resident``).

A server with no request for ``--sleep-idle`` seconds (limits.SERVE_SLEEP_IDLE_SECONDS),
nothing running, no worker left, no frame half read and no background command of
the sandbox running (``ops.background.any_running``) execs ``bash -p -c WAITER`` in
its own process: the same pid, so the orchestrator's pipes and the pid of its hello
stay right. bash holds stdin, stdout and stderr and nothing else; it costs a tenth
of the server's memory (docs/benchmarks.md, "Idle agents' memory").

- The first byte on stdin wakes it: bash reads that one byte (a pipe is read one
  byte at a time, so nothing after it is taken) and execs the server again, the
  same command line with ``--woken BYTE`` (the byte's value, 0 to 255). The woken
  server writes no hello (the orchestrator had it), takes the byte as the start of
  its first frame and reads on. What the orchestrator sends meanwhile waits in the
  pipe: nothing is lost, and the orchestrator never knows the server slept.
- stdin at its end, SIGTERM, SIGHUP or SIGINT: exit 0, as the server does with
  nothing running. With ``--idle-exit S`` the waiter exits 0 once S seconds have
  passed since the last frame, as the server would; with ``--orphan-exit S``, once
  nothing at all came for S seconds. A keepalive (a bare newline) wakes nothing: the
  waiter takes it and waits on.
- The stop signals are blocked across each exec (the mask outlives it): one sent
  while the next program starts is taken once its handler is in place.
- bash's ``read`` drops NUL bytes, so a NUL before the first frame is lost; the
  orchestrator's frames are ASCII JSON and hold none.

Where no bash is on PATH, or the interpreter cannot name itself
(``sys.orig_argv``, ``sys.executable``), the server does not sleep.
"""

from __future__ import annotations

import os
import sys

from . import proc
from .proc import signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Sequence

WOKEN = "--woken"
WAITER = (
    "trap 'exit 0' TERM HUP INT\n"
    "t=$1 o=$2 end=; shift 2\n"
    "ms() { n=${EPOCHREALTIME/[.,]/}; n=$((10#$n / 1000)); }\n"
    'if [ -n "$t" ]; then ms; end=$((n + 10#${t%.*} * 1000 + 10#${t#*.})); fi\n'
    "while :; do\n"
    " w=3600000\n"
    ' if [ -n "$end" ]; then ms; w=$((end - n)); fi\n'
    ' if [ -n "$o" ] && [ $((o * 1000)) -lt "$w" ]; then w=$((o * 1000)); fi\n'
    ' [ "$w" -gt 0 ] || exit 0\n'
    ' LC_ALL=C IFS= read -r -N 1 -t "$((w / 1000)).$((w % 1000 / 100))$((w % 100 / 10))$((w % 10))" byte && {\n'
    "  [ \"$byte\" = $'\\n' ] && continue\n"
    "  break\n"
    " }\n"
    ' [ $? -gt 128 ] && [ -z "$t$o" ] || exit 0\n'
    "done\n"
    "LC_ALL=C printf -v code %d \"'$byte\"\n"
    'exec "$@" "$code"\n'
)
"""bash: $1 the seconds to wait ("" for ever, else with three decimals), $2 the orphan
seconds ("" none: a keepalive is then taken as it waits, not needed), then the server's
command line but its last argument, which is the first byte's value (see the module
docstring). A keepalive (a bare newline) is taken and the wait goes on, the idle
deadline kept; nothing for $2 seconds ends it, as the server would end. Always with a
timeout: only then does a trapped signal end bash's ``read`` at once."""
STOP_SIGNALS = (signals.SIGTERM, signals.SIGHUP, signals.SIGINT)


def waking_argv(options: Sequence[str]) -> Optional[List[str]]:
    """The command line that wakes this server, but the byte's value after its ``--woken``;
    None when it cannot be named. options: what followed ``serve`` on its own command line."""
    original = getattr(sys, "orig_argv", None)  # Python 3.10+
    if not sys.executable or not original or list(original[len(original) - len(options):]) != list(options):
        return None
    kept = list(options)
    if WOKEN in kept:
        at = kept.index(WOKEN)
        del kept[at:at + 2]
    return [sys.executable, *original[1:len(original) - len(options)], *kept, WOKEN]


def waiter_argv(options: Sequence[str], idle_left: Optional[float],
                orphan_exit: Optional[int] = None) -> Optional[List[str]]:
    """``bash -p -c WAITER`` with its arguments; None when bash or the server cannot be named.
    idle_left: seconds until the idle exit, None for none; orphan_exit: ``--orphan-exit``'s."""
    bash = proc.find_program("bash", os.environ)
    waking = waking_argv(options)
    if bash is None or waking is None:
        return None
    wait = "" if idle_left is None else f"{max(idle_left, 0.001):.3f}"
    orphan = "" if orphan_exit is None else str(orphan_exit)
    return [bash, "-p", "-c", WAITER, "guilds-code-asleep", wait, orphan, *waking]


def sleep(argv: Sequence[str], still_idle: Callable[[], bool]) -> None:
    """Exec the waiter, unless still_idle() says otherwise once the stop signals are blocked
    (pthread_sigmask runs the handlers of those that came before): then it returns, as it
    does with OSError when the waiter cannot start; the mask is restored either way."""
    signals.pthread_sigmask(signals.SIG_BLOCK, STOP_SIGNALS)
    try:
        if still_idle():
            os.execv(argv[0], list(argv))  # noqa: S606 (the waiter, in this very process)
    finally:
        signals.pthread_sigmask(signals.SIG_UNBLOCK, STOP_SIGNALS)


def handled() -> None:
    """Once the server's own handlers are in place: the stop signals blocked across the
    exec that woke it (if any) are taken from now on."""
    signals.pthread_sigmask(signals.SIG_UNBLOCK, STOP_SIGNALS)
