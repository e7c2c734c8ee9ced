"""Row texts: the product page's "Row reads" table, one case a line."""

from __future__ import annotations

import pytest

from guilds.record.rows import ROW_MAX_CHARS, row_text

CASES = [
    # tool, args, meta, is_error, row
    ("shell", {"command": "make test"}, {"exit_code": 0, "timed_out": False}, False, "Run make test"),
    ("shell", {"command": "make test"}, {"exit_code": 2, "timed_out": False}, False, "Run make test · exit 2"),
    ("shell", {"command": "sleep 9"}, {"exit_code": 124, "timed_out": True}, False, "Run sleep 9 · timed out"),
    ("shell", {"command": "\n  cd web\nnpm test"}, {"exit_code": 0}, False, "Run cd web"),
    ("shell", {"command": "npm run dev", "background": True}, {"background_id": "b1"}, False, "Start npm run dev"),
    ("shell", {}, {}, True, "Run · error"),
    ("shell_status", {}, {}, False, "List background commands"),
    ("shell_status", {"id": "b1"}, {"state": "running"}, False, "Check b1"),
    ("shell_status", {"id": "b1", "stop": True}, {"state": "stopping"}, False, "Stop b1"),
    ("file_read", {"path": "src/app.py"}, {"range": [1, 200]}, False, "Read src/app.py"),
    ("file_read", {"path": "src/app.py", "offset": 1}, {}, False, "Read src/app.py"),
    ("file_read", {"path": "src/app.py", "offset": 201}, {}, False, "Read src/app.py from line 201"),
    ("file_read", {"path": "a.py"}, {"repeat_of": 3}, False, "Read a.py · unchanged since step 3"),
    ("file_read", {"path": "missing.py"}, {}, True, "Read missing.py · error"),
    ("code_search", {"pattern": "TODO"}, {"matches": 3, "files": 2}, False, "Search files"),
    ("code_search", {"pattern": "TODO", "mode": "content"}, {}, False, "Search lines"),
    ("code_search", {"pattern": "TODO", "path": "src"}, {}, False, "Search files in src"),
    ("code_search", {"pattern": "x", "mode": "content", "path": "lib"}, {}, False, "Search lines in lib"),
    ("code_task", {"brief": "fix it"}, {}, True, "Code task · error"),
]


@pytest.mark.parametrize(("tool", "args", "meta", "is_error", "row"), CASES)
def test_row_reads(tool, args, meta, is_error, row):
    assert row_text(tool, args, meta, is_error) == row


def test_a_long_first_line_is_clipped():
    row = row_text("shell", {"command": "echo " + "x" * 500}, {"exit_code": 0}, False)
    assert row.startswith("Run echo xxx") and row.endswith("…")
    assert len(row) == len("Run ") + ROW_MAX_CHARS


def test_arguments_of_the_wrong_type_still_give_a_row():
    assert row_text("shell", {"command": 3}, {}, True) == "Run · error"
    assert row_text("file_read", {"path": None, "offset": True}, {}, True) == "Read · error"
    assert row_text("shell_status", {"id": 5}, {}, True) == "List background commands · error"
    assert row_text("nope", [], {}, True) == "nope · error"
