"""file_read: numbered lines of a file in the home, with the read ledger (``..ledger``):
an unchanged range read again is answered with a pointer to the earlier result."""

from __future__ import annotations

from typing import Any

from guilds_code import limits
from guilds_code.protocol import ARG_SPECS

from ..ledger import read_ledger
from .tool import CallSite, Extra, Hints, Tool, arg_schema

DESCRIPTION = (
    "Read numbered lines of a text file inside the agent's home. path is relative to the "
    f"working directory (~ is the home). Returns up to limit lines (default "
    f"{limits.READ_LIMIT_DEFAULT}, at most {limits.READ_LIMIT_MAX}) from offset (first line, "
    "1-based) under a 'lines a–b of n' header; a cut range says which offset continues it. "
    f"Lines over {limits.READ_LINE_MAX_CHARS} characters are clipped. Reading the same "
    "unchanged lines again returns a pointer to the earlier result instead of the text."
)
ARGS = {
    "path": "The file, relative to the working directory, absolute inside the home, or ~/...",
    "offset": "The first line to return, 1-based.",
    "limit": "How many lines to return.",
}


class ReadTool(Tool):
    """Reads only (rerunnable); its request carries the run's read ledger."""

    def rerunnable(self, args: Any) -> bool:
        return True

    async def extra_fields(self, site: CallSite) -> Extra:
        """``reads``: the earlier reads the helper may point to; a pointer's savings from their sizes."""
        ledger = await read_ledger(site.store, site.run_id, site.seq)
        return Extra({"reads": ledger.entries}, lambda meta: ledger.size_of(meta.get("repeat_of")))


FILE_READ = ReadTool("file_read", DESCRIPTION, arg_schema(ARG_SPECS["file_read"], ARGS),
                     Hints("Read lines of a file", True, False, True, False))
