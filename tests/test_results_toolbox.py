"""The new shell lines through Toolbox.call (the local sandbox, the built helper, real bash, SQLite):
the prompt line at a timeout, the working-directory line, error lines through elision, the
no-prompt environment, and a status view listing earlier errors."""

from __future__ import annotations

import re

from guilds_code.shaping import ERRORS_HEADER
from toolbox_kit import local_toolbox

TRAILER = re.compile(r"\nremaining_tool_calls: \d+$")


def body(text: str) -> str:
    return TRAILER.sub("", text)


async def test_prompt_and_directory_lines(tmp_path):
    (tmp_path / "home/app").mkdir(parents=True)
    async with local_toolbox(tmp_path) as tb:
        waited = await tb.call("r", "shell", {"command": "cd app; printf 'Proceed (y/n)? '; sleep 30",
                                              "timeout_seconds": 1})
        assert body(waited.text) == (
            "Proceed (y/n)? \n[timed out after 1s; the command was stopped]\n"
            '[it seemed to wait for input: "Proceed (y/n)?"; stdin is closed]\n'
            "[working directory now: ~/app]\nexit_code: 124")
        assert waited.meta["timed_out"] is True and waited.meta["row"].endswith("· timed out")
        same = await tb.call("r", "shell", {"command": "echo $EDITOR $GIT_ASKPASS"})
        assert body(same.text) == "true echo"  # still in app: no line


async def test_error_lines_and_their_metadata(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        command = ("seq 1 1000; echo 'Traceback (most recent call last)'; echo 'KeyError: 7'; "
                   "seq 1 2000; exit 1")
        result = await tb.call("r", "shell", {"command": command})
        lines = body(result.text).split("\n")
        at = lines.index(ERRORS_HEADER)
        assert lines[at + 1: at + 3] == ["1001: Traceback (most recent call last)", "1002: KeyError: 7"]
        assert result.meta["error_lines"] == [1001, 1002] and result.meta["bytes_elided"] > 0
        log = result.meta["log_path"]
        opened = await tb.call("r", "file_read", {"path": log, "offset": 1001, "limit": 2})
        assert "1001  Traceback (most recent call last)\n1002  KeyError: 7" in opened.text


async def test_a_status_view_lists_earlier_errors(tmp_path):
    async with local_toolbox(tmp_path) as tb:
        started = await tb.call("r", "shell", {"command": "echo 'fatal: bad object'; seq 1 100",
                                               "background": True})
        bid = started.meta["background_id"]
        checked = await tb.call("r", "shell_status", {"id": bid, "wait": 10})
        assert checked.text.startswith("ended\n")
        assert (
            "[error lines before the last 40 lines, by line number in the log:]\n1: fatal: bad object" in checked.text
        )
        assert checked.meta["error_lines"] == [1]
