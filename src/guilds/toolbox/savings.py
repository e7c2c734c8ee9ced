"""What shaping saved on one call, for its metadata (the app totals them per run).

Beside the helper's own ``bytes_elided`` (a shell output's elided middle):

    secrets_redacted     the [REDACTED] marks in the result as returned: each is
                         one secret value replaced (a count, never a value)
    pointer_bytes_saved  a repeated file_read: the bytes of the earlier result
                         it points to, less the bytes of the pointer

Each key is present only when its value is above 0.
"""

from __future__ import annotations

from typing import Any, Mapping

from guilds_code.redact import MARK

from ..store import Store


def utf8_len(text: str | None) -> int:
    return len((text or "").encode("utf-8", "surrogateescape"))


async def savings_meta(store: Store, run_id: str, tool: str, meta: Mapping[str, Any], text: str) -> dict[str, int]:
    """The savings keys of a call's metadata (see the module docstring)."""
    out: dict[str, int] = {}
    marks = text.count(MARK)
    if marks:
        out["secrets_redacted"] = marks
    earlier = meta.get("repeat_of") if tool == "file_read" else None
    if isinstance(earlier, int) and not isinstance(earlier, bool):
        record = await store.call(run_id, earlier)
        saved = utf8_len(record.text if record else None) - utf8_len(text)
        if saved > 0:
            out["pointer_bytes_saved"] = saved
    return out
