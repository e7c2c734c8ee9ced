"""The one-line notes a shell result may end with, besides the exit code.

- A command stopped at its timeout whose output ends in a line left without a
  newline that reads like a question (PROMPT_ENDINGS, or a yes/no choice) gets
  ``[it seemed to wait for input: "<the prompt>"; stdin is closed]``.
- A command that leaves the working directory elsewhere than where it started
  gets ``[working directory now: <dir>]``: ``~`` or ``~/<path>`` inside the
  home, the absolute path outside it.
"""

from __future__ import annotations

import os

from . import limits, shaping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

PROMPT_ENDINGS = (":", "?", ">", "]", ")")
"""The last visible character of a prompt: `Password:`, `Continue?`, `[y/N]`, `(yes/no)?`."""
YES_NO = ("y/n", "yes/no")
"""A line holding one of these (any case) is a question wherever it ends."""


def waiting_prompt(capture: shaping.Capture) -> Optional[str]:
    """The output's last line when it was left without a newline and reads like a prompt."""
    tail = capture.tail(limits.PROMPT_MAX_CHARS * 4).decode("utf-8", "replace")
    if not tail or tail.endswith("\n"):
        return None
    line = tail.rsplit("\n", 1)[-1].strip()
    lowered = line.lower()
    if not line or not (line.endswith(PROMPT_ENDINGS) or any(word in lowered for word in YES_NO)):
        return None
    return shaping.clip_line(line, limits.PROMPT_MAX_CHARS)


def prompt_note(prompt: str) -> str:
    return f'[it seemed to wait for input: "{prompt}"; stdin is closed]'


def shown_dir(path: str, home: str) -> str:
    """path as ~, ~/<below the home>, or itself when outside the home."""
    home = os.path.realpath(home)
    try:
        inside = os.path.commonpath([home, path]) == home
    except ValueError:
        inside = False
    if not inside:
        return path
    rest = os.path.relpath(path, home)
    return "~" if rest == "." else f"~/{rest}"


def cwd_note(home: str, before: str, after: str) -> Optional[str]:
    """The working-directory line when the command moved it, else None."""
    if before == after or os.path.realpath(before) == os.path.realpath(after):
        return None
    return f"[working directory now: {shown_dir(os.path.realpath(after), home)}]"


def after_run(capture: shaping.Capture, timed_out: bool, home: str, before: str, after: str) -> List[str]:
    """The notes of one foreground command, in the order they are shown."""
    lines = []
    prompt = waiting_prompt(capture) if timed_out else None
    if prompt is not None:
        lines.append(prompt_note(prompt))
    moved = cwd_note(home, before, after)
    if moved is not None:
        lines.append(moved)
    return lines
