"""Benchmarks of the guilds-code helper against the floor of its design.

Run: .venv/bin/python bench/helper_bench.py [--quick]

Each figure is a ratio measured in the same run on the same machine:
  1. a shell call of `true`, start to envelope, against `python3 -I -S -c pass`
     plus `bash -c true` (aim <= 1.5x);
  2. code_search against plain `rg` with the same query over the Python standard
     library folder, files and content modes (aim <= 1.2x);
  3. a command printing 1 GiB: the helper's throughput against the same command
     piped into `cat` writing a file (aim >= 0.5x), and the helper's peak RSS
     (aim < 50 MiB);
  4. file_read of 200 lines of a 1 GiB file against `openssl dgst -sha256` of it
     (aim <= 1.2x).
Prints a Markdown table (pasted into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox.helpers import build_helper  # noqa: E402

PYTHON = os.path.realpath(sys.executable)
GIB = 1 << 30


def timed(argv, env=None, cwd=None) -> tuple[float, int, bytes]:
    """Run argv; return (seconds, peak RSS of the process tree in KiB, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss, out


def median_time(argv_list, runs, **kw) -> float:
    """Median wall time of running every argv in argv_list one after another."""
    samples = []
    for _ in range(runs):
        samples.append(sum(timed(argv, **kw)[0] for argv in argv_list))
    return statistics.median(samples)


class Helper:
    def __init__(self, work: Path):
        self.path = build_helper(work / "guilds-code")
        self.home = work / "home"
        self.home.mkdir(exist_ok=True)
        self.state = work / "state"
        self.state.mkdir(exist_ok=True)
        self.calls = 0
        self.env = {"PATH": os.environ["PATH"], "HOME": str(self.home),
                    "GUILDS_STATE_DIR": str(self.state), "LANG": "C.UTF-8"}

    def argv(self, op: str, args: dict, max_bytes: int = 8192) -> list[str]:
        self.calls += 1
        req = {"op": op, "args": args, "run_id": "bench", "agent_id": "bench",
               "call_id": f"c{self.calls}", "home": str(self.home), "cwd": str(self.home),
               "max_bytes": max_bytes, "seq": self.calls}
        arg = base64.b64encode(json.dumps(req).encode()).decode()
        return [PYTHON, "-I", "-S", str(self.path), arg]

    def envelope(self, out: bytes) -> dict:
        return json.loads(base64.b64decode(out.strip()))


def bench_shell_true(h: Helper, runs: int) -> dict:
    argv = h.argv("shell", {"command": "true"})
    assert h.envelope(timed(argv, env=h.env)[2])["ok"]
    helper = median_time([argv], runs, env=h.env)
    floor = median_time([[PYTHON, "-I", "-S", "-c", "pass"], ["bash", "-c", "true"]], runs)
    return {"what": "shell `true`, start to envelope", "ours": helper, "floor": floor,
            "floor_name": "`python3 -I -S -c pass` + `bash -c true`", "aim": "≤ 1.5×"}


def _stdlib_copy(h: Helper) -> str:
    target = h.home / "stdlib"
    if not target.exists():
        shutil.copytree(sysconfig.get_paths()["stdlib"], target, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "site-packages"))
    return "stdlib"


def bench_search(h: Helper, runs: int, mode: str) -> dict:
    folder = _stdlib_copy(h)
    args = {"pattern": "def __init__", "path": folder, "mode": mode}
    argv = h.argv("code_search", args)
    env = h.envelope(timed(argv, env=h.env)[2])
    assert env["ok"], env
    ours = median_time([argv], runs, env=h.env)
    if mode == "files":
        rg = ["rg", "--no-config", "--count-matches", "--regexp=def __init__", "--", folder]
    else:
        rg = ["rg", "--no-config", "--line-number", "--max-count=10", "--regexp=def __init__", "--", folder]
    floor = median_time([rg], runs, cwd=h.home)
    return {"what": f"code_search, {mode} mode, stdlib", "ours": ours, "floor": floor,
            "floor_name": f"plain `{' '.join(rg[:-2])}`", "aim": "≤ 1.2×"}


def bench_big_output(h: Helper, size: int) -> list[dict]:
    produce = f"yes 'a line of build output, 40 characters' | head -c {size}"
    argv = h.argv("shell", {"command": produce, "timeout_seconds": 600})
    secs, rss_kib, out = timed(argv, env=h.env)
    env = h.envelope(out)
    assert env["ok"] and "bytes elided" in env["text"], env
    log = env["meta"]["log_path"]
    os.unlink(log)
    target = Path(tempfile.mkstemp(dir=h.home)[1])
    floor_secs = timed(["bash", "-c", f"{produce} | cat > {target}"])[0]
    target.unlink()
    mib = size / (1 << 20)
    return [
        {"what": f"shell printing {mib:.0f} MiB: throughput", "ours": mib / secs, "floor": mib / floor_secs,
         "floor_name": "the same command `| cat > file`", "aim": "≥ 0.5×", "unit": "MiB/s", "higher": True},
        {"what": f"shell printing {mib:.0f} MiB: helper peak RSS", "ours": rss_kib / 1024, "floor": None,
         "floor_name": "", "aim": "< 50 MiB", "unit": "MiB"},
    ]


def _big_file(h: Helper, size: int) -> Path:
    path = h.home / "big.log"
    if not path.exists() or path.stat().st_size != size:
        line = b"2026-12-02 11:15:29 INFO request served in 12 ms, path=/api/v1/items\n"
        block = line * (GIB // 64 // len(line))
        with open(path, "wb") as fh:
            written = 0
            while written < size:
                chunk = block[: size - written]
                fh.write(chunk)
                written += len(chunk)
    return path


def bench_file_read(h: Helper, runs: int, size: int) -> dict:
    path = _big_file(h, size)
    argv = h.argv("file_read", {"path": path.name, "offset": 1000, "limit": 200})
    env = h.envelope(timed(argv, env=h.env)[2])
    assert env["ok"], env
    ours = median_time([argv], runs, env=h.env)
    floor = median_time([["openssl", "dgst", "-sha256", str(path)]], runs)
    return {"what": f"file_read 200 lines of a {size / GIB:.0f} GiB file", "ours": ours, "floor": floor,
            "floor_name": "`openssl dgst -sha256` of it", "aim": "≤ 1.2×"}


def row(r: dict) -> str:
    unit = r.get("unit", "s")
    ours = f"{r['ours']:.3f} {unit}" if unit == "s" else f"{r['ours']:.0f} {unit}"
    if r["floor"] is None:
        return f"| {r['what']} | {ours} | — | — | {r['aim']} |"
    floor = f"{r['floor']:.3f} {unit}" if unit == "s" else f"{r['floor']:.0f} {unit}"
    ratio = r["ours"] / r["floor"]
    return f"| {r['what']} | {ours} | {floor} ({r['floor_name']}) | {ratio:.2f}× | {r['aim']} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, 64 MiB instead of 1 GiB")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".out"), help="scratch folder")
    opts = parser.parse_args()
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = 5 if opts.quick else 21
    size = (64 << 20) if opts.quick else GIB
    h = Helper(work)
    results = [bench_shell_true(h, runs), bench_search(h, runs, "files"), bench_search(h, runs, "content")]
    results += bench_big_output(h, size)
    results.append(bench_file_read(h, max(3, runs // 4), size))
    print("| what | guilds-code | floor | ratio | aim |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
