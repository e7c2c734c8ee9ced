"""Redaction of structured values (a call's tool name, arguments and metadata).

Text goes through ``guilds_code.redact.Redactor``; this walks the JSON-like
values a record keeps and redacts every string in them, keys included.
"""

from __future__ import annotations

from typing import Any

from guilds_code.redact import Redactor


def redact_meta(redactor: Redactor, value: Any) -> Any:
    """The metadata (or recorded arguments) with every string redacted, keys too:
    a secret used as an argument's name is a secret all the same."""
    if not redactor:
        return value
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, dict):
        return {redact_meta(redactor, k): redact_meta(redactor, v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_meta(redactor, v) for v in value]
    return value
