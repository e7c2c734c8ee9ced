"""What shaping saved on one call, for its metadata (the app totals them per run).

Beside the helper's own ``bytes_elided`` (a shell output's elided middle):

    secrets_redacted     the [REDACTED] marks in the result as returned: each is
                         one secret value replaced (a count, never a value)
    pointer_bytes_saved  a repeated file_read: the bytes of the earlier result
                         it points to, less the bytes of the pointer

Each key is present only when its value is above 0.
"""

from __future__ import annotations

from guilds_code.redact import MARK


def utf8_len(text: str | None) -> int:
    return len((text or "").encode("utf-8", "surrogateescape"))


def savings_meta(text: str, pointed_bytes: int | None) -> dict[str, int]:
    """The savings keys of a call's metadata (see the module docstring). text: the result
    as returned; pointed_bytes: the size of the earlier result a pointer points to
    (the read ledger's), None for any other call."""
    out: dict[str, int] = {}
    marks = text.count(MARK)
    if marks:
        out["secrets_redacted"] = marks
    if pointed_bytes is not None:
        saved = pointed_bytes - utf8_len(text)
        if saved > 0:
            out["pointer_bytes_saved"] = saved
    return out
