"""scripts/e2b_suite_count.py: the E2B suite's JUnit report counted per area, held to a floor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "e2b_suite_count.py"
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.sync.sandbox_sync.files.test_read" name="test_read_file"/>
<testcase classname="tests.async.sandbox_async.files.test_watch" name="test_watch">
  <failure message="SandboxException: 501: not served&#10;second line">trace</failure></testcase>
<testcase classname="tests.sync.sandbox_sync.test_connect" name="test_connect"/>
<testcase classname="tests.async.api_async.test_sbx_list" name="test_list">
  <skipped message="needs the internet"/></testcase>
</testsuite></testsuites>
"""


def _count(tmp_path: Path, *floor: str) -> subprocess.CompletedProcess:
    report = tmp_path / "results.xml"
    report.write_text(REPORT)
    return subprocess.run([sys.executable, str(SCRIPT), str(report), *floor], capture_output=True, text=True,
                          timeout=60, check=False)


def test_each_area_is_counted_and_each_miss_named_with_its_reason(tmp_path):
    done = _count(tmp_path, "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split() for line in lines[:4]] == [
        ["api", "list", "0", "/", "1"], ["connect", "1", "/", "1"], ["files", "1", "/", "2"], ["all", "2", "/", "4"]]
    assert "failed  tests.async.sandbox_async.files.test_watch::test_watch: SandboxException: 501: not served" in lines
    assert "skipped tests.async.api_async.test_sbx_list::test_list: needs the internet" in lines


def test_a_count_under_the_floor_fails(tmp_path):
    done = _count(tmp_path, "3")
    assert done.returncode == 1
    assert done.stderr == "e2b suite: 2 passed, under the floor of 3\n"
    assert _count(tmp_path, "x", "y").returncode == 2
