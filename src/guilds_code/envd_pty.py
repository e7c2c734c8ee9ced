"""Terminals for ``guilds-code envd`` (envd.py): a command started in a pseudo-terminal.

The command gets the terminal's other side as stdin, stdout and stderr, in a session
of its own whose controlling terminal it is (so Ctrl-C in its input interrupts its
foreground job, and a resize sends it SIGWINCH). Its start goes through this
interpreter (``-c`` below), which takes the terminal as controlling one and then
replaces itself with the command: ``posix_spawn`` cannot.
"""

import fcntl
import os
import struct
import sys
import termios

from . import limits, proc
from .envd_files import Failed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple

TAKE_TERMINAL = "import fcntl,os,sys,termios;fcntl.ioctl(0,termios.TIOCSCTTY,0);os.execv(sys.argv[1],sys.argv[1:])"


def size_of(given: "Any") -> "Tuple[int, int]":
    """(cols, rows) from {cols, rows}, each a whole number from 1 to limits.ENVD_TERMINAL_SIZE_MAX."""
    found = []
    for name in ("cols", "rows"):
        value = given.get(name) if isinstance(given, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limits.ENVD_TERMINAL_SIZE_MAX:
            raise Failed("invalid_argument", f"pty.size.{name}: a whole number from 1 to "
                                             f"{limits.ENVD_TERMINAL_SIZE_MAX} is needed")
        found.append(value)
    return found[0], found[1]


def resize(fd: int, size: "Tuple[int, int]") -> None:
    cols, rows = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn(argv: "List[str]", env: "Dict[str, str]", cwd: str, size: "Tuple[int, int]") -> "Tuple[proc.Child, int]":
    """(the child, the terminal's side the service reads and writes) for argv run in a new terminal."""
    program = argv[0] if "/" in argv[0] else proc.find_program(argv[0], env)
    if program is None:
        raise Failed("invalid_argument", f"cannot start {argv[0]}: No such file or directory")
    terminal, other = os.openpty()
    try:
        os.set_inheritable(terminal, False)
        resize(terminal, size)
        wrapped = [sys.executable, "-I", "-S", "-c", TAKE_TERMINAL, program] + argv[1:]
        child = proc.spawn(wrapped, env, stdin=other, stdout=other, stderr=other, cwd=cwd, session=True)
    except OSError as exc:
        os.close(terminal)
        raise Failed("invalid_argument", f"cannot start {argv[0]}: {exc.strerror}") from None
    finally:
        os.close(other)
    return child, terminal
