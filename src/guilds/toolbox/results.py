"""What a tool call gives back: ``CallResult`` (the toolbox's, the fronts')."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CallResult:
    text: str
    is_error: bool
    meta: dict[str, Any] = field(default_factory=dict)
