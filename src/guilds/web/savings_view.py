"""What shaping saved, as the app shows it: per call (its row and its Metadata)
and per run (totals and a bar of bytes produced against bytes returned).

Pure functions of the recorded calls and runs, table-tested. A call's bytes
(``values.call_savings``; a run's totals are the sum, kept on the run's row):

    returned   its result text as the model got it (trailer included)
    produced   returned + bytes_elided + pointer_bytes_saved: what the model
               would have got without the elision and the pointer
    saved      produced - returned

Tokens are an estimate, bytes ÷ TOKEN_BYTES, and always said to be one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..record.values import CallRecord, RunRecord, Savings, call_savings
from ..record.values import count as _count

TOKEN_BYTES = 4
"""Bytes per token for the estimate: about right for English text and code."""
BAR_WIDTH = 200
"""The run bar's width in pixels (an SVG: no inline style under the page's CSP)."""


def size(n: int) -> str:
    """950 B, 8.1 KB, 12 MB (1 KB = 1024 B)."""
    if n < 1024:
        return f"{n} B"
    for unit in ("KB", "MB"):
        n_unit = n / 1024 if unit == "KB" else n / 1024 / 1024
        if unit == "MB" or n_unit < 1024:
            return f"{n_unit:.1f} {unit}" if n_unit < 10 else f"{round(n_unit)} {unit}"
    raise AssertionError("unreachable")


def tokens(n_bytes: int) -> str:
    return f"≈ {round(n_bytes / TOKEN_BYTES):,} tokens (estimate: bytes ÷ {TOKEN_BYTES})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def row_savings(meta: Mapping[str, Any] | None) -> str:
    """The short note on a call's row: '8.1 KB elided · 2 secrets redacted', or ''."""
    parts = []
    if _count(meta, "bytes_elided"):
        parts.append(f"{size(_count(meta, 'bytes_elided'))} elided")
    if _count(meta, "pointer_bytes_saved"):
        parts.append(f"{size(_count(meta, 'pointer_bytes_saved'))} saved by a pointer")
    if _count(meta, "secrets_redacted"):
        parts.append(f"{_plural(_count(meta, 'secrets_redacted'), 'secret')} redacted")
    return " · ".join(parts)


def metadata_rows(meta: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) rows for the Metadata view."""
    rows = []
    if _count(meta, "bytes_elided"):
        rows.append(("Bytes elided", f"{_count(meta, 'bytes_elided'):,}"))
    error_lines = (meta or {}).get("error_lines")
    if isinstance(error_lines, list) and error_lines:
        lines = [str(n) for n in error_lines if isinstance(n, int)]
        rows.append(("Error lines in the log", ", ".join(lines)))
    if _count(meta, "pointer_bytes_saved"):
        rows.append(("Bytes saved by the pointer", f"{_count(meta, 'pointer_bytes_saved'):,}"))
    if _count(meta, "secrets_redacted"):
        rows.append(("Secrets redacted", str(_count(meta, "secrets_redacted"))))
    return rows


@dataclass(frozen=True)
class RunSavings:
    """A run's totals, and the bar's widths."""

    produced: int
    returned: int
    elided: int
    pointer_saved: int
    secrets: int

    @property
    def saved(self) -> int:
        return self.produced - self.returned

    @property
    def tokens(self) -> str:
        return tokens(self.saved)

    @property
    def bar_width(self) -> int:
        return BAR_WIDTH

    @property
    def returned_width(self) -> int:
        """The returned part of the bar, in pixels (the whole bar is what was produced)."""
        if self.produced <= 0:
            return BAR_WIDTH
        return max(1, round(BAR_WIDTH * self.returned / self.produced)) if self.returned else 0

    @property
    def parts(self) -> str:
        """'9.8 KB elided · 2.0 KB saved by pointers · 1 secret redacted' (the parts above 0)."""
        parts = []
        if self.elided:
            parts.append(f"{size(self.elided)} elided")
        if self.pointer_saved:
            parts.append(f"{size(self.pointer_saved)} saved by pointers")
        if self.secrets:
            parts.append(f"{_plural(self.secrets, 'secret')} redacted")
        return " · ".join(parts)

    @property
    def sizes(self) -> dict[str, str]:
        return {"produced": size(self.produced), "returned": size(self.returned),
                "elided": size(self.elided), "pointer_saved": size(self.pointer_saved), "saved": size(self.saved)}


def run_savings(calls: Iterable[CallRecord]) -> RunSavings:
    """The totals of these finished calls."""
    return totals(sum((call_savings(call.text, call.meta) for call in calls), Savings()))


def totals(amounts: Savings) -> RunSavings:
    """The RunSavings of amounts returned and saved."""
    return RunSavings(amounts.returned + amounts.elided + amounts.pointer_saved, amounts.returned,
                      amounts.elided, amounts.pointer_saved, amounts.secrets)


def run_savings_of(run: RunRecord) -> RunSavings:
    """The run's totals, as its record keeps them: no call is read."""
    return totals(run.savings)
