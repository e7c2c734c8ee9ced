"""Stream redaction's throughput against a floor measured in the same run.

Run: .venv/bin/python bench/redact_bench.py [--mib 64] [--rounds 5]

The text is shell-like output (lines of ~60 bytes) with the two secrets of a
typical agent (a deploy key and a repository token) once every 4,000 lines,
half of them base64-encoded at an offset. It is fed in 64 KiB chunks, as the
helper reads a command's pipe, through:

- guilds: ``Redactor(secrets).stream()`` (every form: raw, URL, JSON, base64 at
  each alignment; overlapping matches merged);
- floor: one compiled alternation of the raw values alone, ``sub`` on each
  chunk (no chunk carry, no encodings): the least a redactor can do.

The two take turns, round by round; the medians are printed as MiB/s and their
ratio (guilds / floor).
"""

from __future__ import annotations

import argparse
import base64
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from guilds_code.limits import READ_CHUNK  # noqa: E402
from guilds_code.redact import Redactor  # noqa: E402

SECRETS = ["dk_7Qm2Xv9Lp4Rt8Wz1Nb6Hc3Jy5Fs0Gd", "ghp_Tk9Lm2Qw8Er4Ty6Ui1Op3As5Df7Gh0"]


def sample(mib: int) -> bytes:
    lines, n, size = [], 0, 0
    while size < mib << 20:
        n += 1
        line = b"%d compiling module_%d.o from src/module_%d.c -O2 -Wall ok\n" % (n, n, n)
        if n % 4000 == 0:
            secret = SECRETS[n // 4000 % 2].encode()
            line += secret + b"\n" if n % 8000 else base64.b64encode(b"u:" + secret) + b"\n"
        lines.append(line)
        size += len(line)
    return b"".join(lines)


def guilds(data: bytes) -> bytes:
    stream = Redactor(SECRETS).stream()
    out = [stream.feed(data[i:i + READ_CHUNK]) for i in range(0, len(data), READ_CHUNK)]
    return b"".join(out) + stream.flush()


def floor(data: bytes) -> bytes:
    pattern = re.compile(b"|".join(re.escape(s.encode()) for s in SECRETS))
    return b"".join(pattern.sub(b"[REDACTED]", data[i:i + READ_CHUNK]) for i in range(0, len(data), READ_CHUNK))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    data = sample(args.mib)
    times: dict[str, list[float]] = {"guilds": [], "floor": []}
    for _ in range(args.rounds):
        for name, fn in (("guilds", guilds), ("floor", floor)):
            began = time.perf_counter()
            fn(data)
            times[name].append(time.perf_counter() - began)
    mib = len(data) / (1 << 20)
    rate = {name: mib / statistics.median(t) for name, t in times.items()}
    print(f"| stream redaction ({mib:.0f} MiB, 64 KiB chunks) | guilds {rate['guilds']:.0f} MiB/s "
          f"| floor {rate['floor']:.0f} MiB/s | {rate['guilds'] / rate['floor']:.2f}x |")


if __name__ == "__main__":
    main()
