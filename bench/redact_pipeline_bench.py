"""The result pipeline's cost on one full-size result: redaction, the 64 KiB cap, the trailer.

Run: .venv/bin/python bench/redact_pipeline_bench.py [--rounds 201]

Times are CPU time of this process (time.process_time): on a machine shared
with other jobs, wall time mostly measures the others.

Two results of just under 64 KiB, each holding four secrets of an agent:
shell-like output (lines of ~60 bytes), the secrets a few times in the forms
redaction looks for (raw, URL-quoted, JSON-escaped, base64 at an offset); and
JSON dense with escapes (quotes, backslashes, newlines, ``\\/``, ``%20``). Printed: the median time of
``run_pipeline`` on it (the redactor built once, as the toolbox builds it), and
the median time to build the redactor, its patterns compiled afresh (the
helper builds one per call, in a new process).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from guilds.toolbox.pipeline import run_pipeline  # noqa: E402
from guilds_code.limits import PLATFORM_CAP_BYTES  # noqa: E402
from guilds_code.redact import Redactor  # noqa: E402

SECRETS = ["dk_7Qm2Xv9Lp4Rt8Wz1Nb6Hc3Jy5Fs0Gd", "ghp_Tk9Lm2Qw8Er4Ty6Ui1Op3As5Df7Gh0",
           "p@ss/w0rd+x", "sk-live-0123456789abcdef"]


def result_text() -> str:
    """Just under PLATFORM_CAP_BYTES of output, the secrets in their forms every 100 lines."""
    forms = [lambda s: s, lambda s: quote(s, safe=""), lambda s: json.dumps(s)[1:-1],
             lambda s: base64.b64encode(b"u:" + s.encode()).decode()]
    lines, size, n = [], 0, 0
    while size < PLATFORM_CAP_BYTES - 200:
        n += 1
        line = f"{n} compiling module_{n}.o from src/module_{n}.c -O2 -Wall ok"
        if n % 100 == 0:
            line += " " + forms[n // 100 % 4](SECRETS[n // 400 % 4])
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def json_text() -> str:
    """Just under PLATFORM_CAP_BYTES of JSON dense with escapes (quotes, backslashes, newlines,
    %20), a secret JSON-escaped with \\/ every 50 records."""
    rows, size, n = [], 2, 0
    while True:
        n += 1
        row = {"path": f"/src/pkg/m{n}.py", "msg": f'line {n}: "quoted" and a\\path\n', "url": f"https://h/x?q=a%20b&i={n}"}
        if n % 50 == 0:
            row["key"] = SECRETS[n // 50 % 4]
        line = json.dumps(row).replace("/", "\\/")
        if size + len(line) + 2 > PLATFORM_CAP_BYTES - 200:
            return "[" + ", ".join(rows) + "]"
        rows.append(line)
        size += len(line) + 2


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.process_time()
        fn()
        times.append(time.process_time() - began)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=201)
    args = parser.parse_args()
    redactor = Redactor(SECRETS)
    for name, text in (("build output", result_text()), ("JSON", json_text())):
        assert "[REDACTED]" in run_pipeline(redactor, text, 1).text
        run = median_ms(lambda: run_pipeline(redactor, text, 1), args.rounds)  # noqa: B023 - called at once
        print(f"| run_pipeline, {len(text.encode()) // 1024} KiB of {name}, {len(SECRETS)} secrets | {run:.2f} ms |")
    build = median_ms(lambda: (re.purge(), Redactor(SECRETS)), args.rounds)  # compiled afresh, as in a new helper
    print(f"| Redactor({len(SECRETS)} secrets) built | {build:.2f} ms |")


if __name__ == "__main__":
    main()
