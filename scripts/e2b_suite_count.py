"""The E2B SDK suite's results counted per area, from pytest's JUnit XML (scripts/e2b-suite.sh).

    python scripts/e2b_suite_count.py RESULTS.xml [FLOOR]

Prints each area's passed/total (an area: ``commands``, ``files``, ``pty`` for the
folders of ``sandbox_sync`` and ``sandbox_async``, the module's name for the others,
``api <name>`` for ``api_sync`` and ``api_async``), the total, and every test that
did not pass with the first line of its reason. Exits 1 when fewer than FLOOR passed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def area_of(classname: str) -> str:
    """The area of a test, from its JUnit classname (``tests.sync.sandbox_sync.files.test_read``)."""
    parts = classname.split(".")
    for kind in ("sandbox_sync", "sandbox_async", "api_sync", "api_async"):
        if kind in parts:
            rest = parts[parts.index(kind) + 1:]
            name = rest[0] if len(rest) > 1 else rest[0].removeprefix("test_").removeprefix("sbx_")
            return f"api {name}" if kind.startswith("api") else name
    return parts[-1]


def outcome(case: ET.Element) -> tuple[str, str]:
    """("passed" | "failed" | "skipped", the first line of the reason)."""
    for tag in ("failure", "error", "skipped"):
        found = case.find(tag)
        if found is not None:
            reason = (found.get("message") or found.text or "").strip().splitlines()
            return ("skipped" if tag == "skipped" else "failed"), (reason[0][:200] if reason else tag)
    return "passed", ""


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: e2b_suite_count.py RESULTS.xml [FLOOR]\n")
        return 2
    passed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    not_passed: list[str] = []
    report = ET.parse(argv[1])  # noqa: S314 (pytest's own report of this run)
    for case in report.getroot().iter("testcase"):
        area = area_of(case.get("classname", ""))
        total[area] += 1
        state, reason = outcome(case)
        if state == "passed":
            passed[area] += 1
        else:
            not_passed.append(f"{state:7} {case.get('classname')}::{case.get('name')}: {reason}")
    lines = [f"{area:28} {passed[area]:4} / {total[area]}" for area in sorted(total)]
    count, whole = sum(passed.values()), sum(total.values())
    sys.stdout.write("\n".join([*lines, f"{'all':28} {count:4} / {whole}", *not_passed]) + "\n")
    floor = int(argv[2]) if len(argv) == 3 else 0
    if count < floor:
        sys.stderr.write(f"e2b suite: {count} passed, under the floor of {floor}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
