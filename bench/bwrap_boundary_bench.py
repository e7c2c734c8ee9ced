"""What the bwrap boundary costs: the sandbox as it is against the one before it, in one run.

Run (as root, like CI): .venv/bin/python bench/bwrap_boundary_bench.py [--calls N] [--starts N]

"before" is the earlier sandbox, rebuilt here from its argv: the host's ``/``
bound read-only, commands as root inside with no capability, the idle clock
the state root's mtime, each call ``nsenter ... setpriv ... argv``. "after" is
``BwrapSandbox`` as it is: only toolchain folders bound, sized tmpfs, the
agent's own uid, a cgroup and rlimits, each call ``sh`` (limits, cgroup) then
``nsenter ... setpriv --reuid ...``. Both run the same helper with the same
python. Measured, the two taking turns in a rotating order so that the
machine's load falls on both alike:

  1. a call: a bare exec of ``true`` and a shell call of ``true`` through the
     whole transport (``call_helper``), median of --calls each;
  2. a start: a new sandbox made and ready (``start()`` after ``stop()``),
     median of --starts.

"after, no cgroup" is the sandbox as it is where no cgroup can be made
(rlimits only): what the uid and the mounts cost apart from the cgroup join.
Prints a Markdown table with the ratios to before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from guilds.sandbox._spawn import run_process  # noqa: E402
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox  # noqa: E402
from guilds.sandbox.bwrap.bwrap_argv import (  # noqa: E402
    HELPER_DIR, NAMESPACES, STATE_INSIDE, BwrapConfig, Limits, unavailable,
)
from guilds.config.settings import AgentSettings  # noqa: E402
from guilds.toolbox.transport import call_helper  # noqa: E402

LEGACY_INIT = (
    "import os,signal,sys,time\n"
    "stamp,idle,ready=sys.argv[1],float(sys.argv[2]),int(sys.argv[3])\n"
    "def reap(*_):\n"
    " try:\n"
    "  while os.waitpid(-1,os.WNOHANG)[0]:pass\n"
    " except ChildProcessError:pass\n"
    "signal.signal(signal.SIGCHLD,reap)\n"
    "os.write(ready,b'ready\\n')\n"
    "os.close(ready)\n"
    "while time.time()-os.stat(stamp).st_mtime<idle:\n"
    " reap()\n"
    " time.sleep(min(idle/4,30))\n"
)


def legacy_bwrap_argv(c: BwrapConfig) -> list[str]:
    """The sandbox's argv before the boundary (the home outside the data folder)."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--tmpfs", "/run", "--tmpfs", HELPER_DIR]
    for name, target in c.local_bin:
        dest = f"{HELPER_DIR}/{name}"
        argv += ["--ro-bind", dest, dest] if target is None else ["--symlink", target, dest]
    for name, host in c.helpers:
        argv += ["--ro-bind", host, f"{HELPER_DIR}/{name}"]
    argv += ["--remount-ro", HELPER_DIR, "--bind", c.home, c.home, "--bind", c.state, STATE_INSIDE]
    argv += [arg for folder in c.hidden for arg in ("--tmpfs", folder)]
    return argv + [*NAMESPACES, "--unshare-net", "--as-pid-1", "--cap-drop", "ALL",
                   "--info-fd", str(c.info_fd), "--chdir", "/", "--", c.python, "-I", "-S", "-c",
                   LEGACY_INIT, STATE_INSIDE, f"{c.idle_seconds:g}", str(c.ready_fd)]


def legacy_enter_argv(pid: int, wd: str, argv: list[str]) -> list[str]:
    return ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid",
            "--root", f"--wd={wd}", "--",
            "setpriv", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--", *argv]


class LegacySandbox(BwrapSandbox):
    """BwrapSandbox with the argv, uid and clock it had before the boundary."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._owner, self._clock = None, self._state  # root's files; the state root's mtime

    def _fingerprint(self) -> str:
        return "legacy:" + str(legacy_bwrap_argv(self._config()))

    def _launch_argv(self, info_fd: int, ready_fd: int) -> list[str]:
        return legacy_bwrap_argv(self._config(info_fd, ready_fd))

    async def exec(self, argv, *, env=None, timeout):
        pid = await asyncio.to_thread(self._ensure)
        try:
            return await run_process(legacy_enter_argv(pid, self.home, list(argv)),
                                     env={**self._env, **(env or {})}, cwd="/", timeout=timeout)
        finally:
            self._touch()


class NoCgroupSandbox(BwrapSandbox):
    """BwrapSandbox as it is where no cgroup can be made: rlimits only."""

    def _process_limits(self) -> Limits:
        cfg = self.settings.bwrap
        self._limits = self._call_limits = Limits(pids=cfg.pids_limit, memory_bytes=cfg.memory)
        return self._limits


async def bare(box) -> float:
    began = time.perf_counter()
    result = await box.exec(["true"], timeout=30)
    assert result.exit_code == 0, result
    return time.perf_counter() - began


async def shell(box, n: int) -> float:
    request = {"op": "shell", "args": {"command": "true"}, "run_id": "bench", "agent_id": box.settings.id,
               "call_id": f"c{n}", "home": box.home, "cwd": box.home}
    began = time.perf_counter()
    envelope = await call_helper(box, request, wait=60)
    assert envelope["ok"], envelope
    return time.perf_counter() - began


async def start(box) -> float:
    await box.stop()
    began = time.perf_counter()
    await box.start()
    return time.perf_counter() - began


def rotated(boxes: dict, i: int) -> list:
    items = list(boxes.items())
    return items[i % len(items):] + items[:i % len(items)]


async def main(calls: int, starts: int) -> None:
    if os.geteuid() != 0 or unavailable():
        sys.exit("bwrap_boundary_bench: needs root and a working bwrap")
    work = Path(tempfile.mkdtemp(prefix="guilds-bwrap-bench-"))
    boxes = {"before": LegacySandbox(AgentSettings(id="before", home=work / "before", sandbox="bwrap"),
                                     work / "data-before"),
             "after": BwrapSandbox(AgentSettings(id="after", home=work / "after", sandbox="bwrap"),
                                   work / "data-after"),
             "after, no cgroup": NoCgroupSandbox(
                 AgentSettings(id="nocg", home=work / "nocg", sandbox="bwrap"), work / "data-nocg")}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        for box in boxes.values():
            await box.start()
            await shell(box, 0)  # warm: helper built, page cache
        for i in range(calls):
            order = rotated(boxes, i)
            for name, box in order:
                times.setdefault((name, "bare exec `true`"), []).append(await bare(box))
                times.setdefault((name, "shell `true`, whole transport"), []).append(await shell(box, i + 1))
        for i in range(starts):
            order = rotated(boxes, i)
            for name, box in order:
                times.setdefault((name, "a new sandbox, start to ready"), []).append(await start(box))
    finally:
        for box in boxes.values():
            await box.stop()
    load = os.getloadavg()
    print(f"calls: median of {calls}; starts: median of {starts}; "
          f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} CPUs at the end\n")
    print("| bwrap | before | after | after / before | after, no cgroup | no cgroup / before |")
    print("|---|---:|---:|---:|---:|---:|")
    for what in dict.fromkeys(w for _, w in times):
        before, after, plain = (statistics.median(times[(n, what)]) * 1000
                                for n in ("before", "after", "after, no cgroup"))
        print(f"| {what} | {before:.1f} ms | {after:.1f} ms | {after / before:.2f}x "
              f"| {plain:.1f} ms | {plain / before:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.starts))
