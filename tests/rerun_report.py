"""The first failure of each test that was run again (``--reruns``, pyproject's addopts).

A test that fails and then passes is reported only as "rerun" in the summary: what
went wrong the first time would be lost. This plugin keeps each such failure (from
every xdist worker: the controller sees their reports) and prints its last lines
at the end of the run, so a failure that comes only under load can be read.
"""

from __future__ import annotations

import pytest

SHOWN_LINES = 30
"""The last lines of each first failure printed: the assertion and the frames near it."""


class FirstFailures:
    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.outcome == "rerun":
            self.failures.append((report.nodeid, report.longreprtext))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for nodeid, text in self.failures:
            terminalreporter.write_sep("-", f"first failure of {nodeid}, run again")
            for line in text.splitlines()[-SHOWN_LINES:]:
                terminalreporter.write_line(line)
