"""A finished code_task as the model reads it (text) and the app shows it (meta).

Text, shaped to the request's max_bytes (the final message gives way first):

    status: completed · claude-code · 3 turns · $0.0123
    session: <id> (pass it as session_id to resume)
    error: <one line, when the status is not completed>
    diffstat:
     src/app.py | 4 +++-
     1 file changed, 3 insertions(+), 1 deletion(-)
    final message:
    <the harness's last message, head and tail kept when long>
    log: <home>/.runs/<run id>/<call id>.log

Metadata (snake_case, absent where they do not apply): status, harness, repo,
cwd, session_id, diffstat, files_changed, insertions, deletions,
final_message, log_path, exit_code, timed_out, lingered (stopped for not
exiting after its final event), signal, error, cost_usd, num_turns,
input_tokens, output_tokens.
"""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

from guilds_code import shaping
from guilds_code.protocol import Reply
from guilds_code.redact import Redactor

from . import limits
from .diffstat import Stat, Unavailable, describe
from .harnesses.contract import Outcome
from .process import Exit

MIN_MESSAGE_BYTES = 200
"""Below this much room the final message is only pointed to in the log."""


@dataclass
class Report:
    status: str
    harness: str
    repo: str
    cwd: str
    log_path: str
    session_id: Optional[str] = None
    error: Optional[str] = None
    outcome: Outcome = field(default_factory=Outcome)
    exit: Optional[Exit] = None
    stat: Optional[Union[Stat, Unavailable]] = None


def _status_line(report: Report) -> str:
    parts = [f"status: {report.status}", report.harness]
    out = report.outcome
    if out.num_turns is not None:
        parts.append(f"{out.num_turns} turn" + ("" if out.num_turns == 1 else "s"))
    if out.cost_usd is not None:
        parts.append(f"${out.cost_usd:.4f}")
    ex = report.exit
    if ex and ex.lingered:
        parts.append("stopped: it did not exit after its final event")
    elif ex and ex.exit_code and not ex.timed_out:
        parts.append(f"exit {ex.exit_code}")
    return " · ".join(parts)


def _clip_stat(text: str, budget: int) -> str:
    """Keep the first lines and the summary line within budget bytes."""
    if shaping.utf8_len(text) <= budget:
        return text
    lines = text.split("\n")
    summary, kept, used = lines[-1], [], shaping.utf8_len(lines[-1]) + 40
    for line in lines[:-1]:
        used += shaping.utf8_len(line) + 1
        if used > budget:
            break
        kept.append(line)
    kept.append(f" … {len(lines) - 1 - len(kept)} more files")
    return "\n".join(kept + [shaping.cap_text(summary, max(budget // 2, 0))])


def _message(text: Optional[str], budget: int, log_path: str) -> str:
    if not text or not text.strip():
        return "(none)"
    if budget < MIN_MESSAGE_BYTES:
        return f"[… {shaping.utf8_len(text)} bytes; in the log …]"
    capture = shaping.Capture(start_max=budget)
    capture.add(text.rstrip("\n").encode("utf-8", "surrogateescape"))
    return shaping.render(capture, budget, log_path, [])[0]


def render(report: Report, max_bytes: int, redactor: Redactor) -> Reply:
    """The Reply: text under max_bytes, and the call's metadata."""
    stat_text = redactor.redact(describe(report.stat))
    message = redactor.redact(report.outcome.final_message or "")
    error = redactor.redact(report.error or "")
    head = [_status_line(report)]
    if report.session_id:
        head.append(f"session: {report.session_id} (pass it as session_id to resume)")
    if error:
        head.append("error: " + shaping.clip_line(" ".join(error.split()), limits.ERROR_MAX_CHARS))
    head.append("diffstat:")
    head.append(_clip_stat(stat_text, max_bytes // 3))
    head.append("final message:")
    tail = f"log: {report.log_path}"
    room = max_bytes - shaping.utf8_len("\n".join(head) + "\n\n" + tail)
    shown = _message(message, room, report.log_path)
    text = shaping.cap_text("\n".join(head + [shown, tail]), max_bytes)
    return Reply(text=text, meta=_meta(report, stat_text, shown if message else None, error))


def _meta(report: Report, stat_text: str, message: Optional[str], error: str) -> Dict[str, Any]:
    out, ex = report.outcome, report.exit
    meta: Dict[str, Any] = {
        "status": report.status,
        "harness": report.harness,
        "repo": report.repo,
        "cwd": report.cwd,
        "session_id": report.session_id,
        "final_message": message,
        "log_path": report.log_path,
        "error": error or None,
        "cost_usd": out.cost_usd,
        "num_turns": out.num_turns,
        "input_tokens": out.input_tokens,
        "output_tokens": out.output_tokens,
    }
    if isinstance(report.stat, Stat):
        meta.update(
            diffstat=stat_text if report.stat.text else "",
            files_changed=report.stat.files_changed,
            insertions=report.stat.insertions,
            deletions=report.stat.deletions,
        )
    if ex is not None:
        meta.update(exit_code=ex.exit_code, timed_out=ex.timed_out)
        if ex.lingered:
            meta["lingered"] = True
        if ex.signal:
            meta["signal"] = signal_name(ex.signal)
    return {k: v for k, v in meta.items() if v is not None}


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"
