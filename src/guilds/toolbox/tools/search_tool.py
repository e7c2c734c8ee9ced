"""code_search: ripgrep over the agent's code."""

from __future__ import annotations

from typing import Any

from guilds_code import limits
from guilds_code.protocol import ARG_SPECS

from .tool import Hints, Tool, arg_schema

DESCRIPTION = (
    "Search the code with ripgrep (respects .gitignore). mode 'files' (default) lists "
    f"matching paths with match counts, at most {limits.SEARCH_FILES_MAX}; mode 'content' "
    f"shows path:line: text, at most {limits.SEARCH_LINES_MAX} lines and "
    f"{limits.SEARCH_MATCHES_PER_FILE} matches per file, with context lines. pattern is a "
    "regular expression unless fixed. Search files first, then lines. Paths in the result "
    "are relative to the working directory and can be passed to file_read."
)
ARGS = {
    "pattern": "A regular expression (a literal string with fixed).",
    "path": "A folder or file to search, relative to the working directory. Default: it.",
    "glob": "Only files whose path matches this glob, like '*.py' or 'src/**'.",
    "mode": "'files': matching paths with counts; 'content': matching lines.",
    "fixed": "Match pattern as a literal string.",
    "ignore_case": "Match regardless of case.",
    "context": "Lines of context around each match (content mode).",
    "limit": (
        f"Lower the maximum of files ({limits.SEARCH_FILES_MAX}) or lines "
        f"({limits.SEARCH_LINES_MAX}) returned."
    ),
}


class SearchTool(Tool):
    """Reads only (rerunnable)."""

    def rerunnable(self, args: Any) -> bool:
        return True


CODE_SEARCH = SearchTool("code_search", DESCRIPTION, arg_schema(ARG_SPECS["code_search"], ARGS),
                         Hints("Search the code", True, False, True, False))
