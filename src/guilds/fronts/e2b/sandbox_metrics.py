"""``GET /sandboxes/{id}/metrics``: a sandbox's CPU, memory and disk, sampled from its cgroup.

Every E2B_METRICS_INTERVAL_SECONDS each running sandbox is sampled (and at once when it is
asked for and has no sample yet); the last E2B_METRICS_KEPT samples are kept, none while it
is paused, all dropped with it. A sample reads the cgroup of the sandbox's process service
(a process of this machine), which holds every command of the sandbox:

- ``memUsed``: the cgroup's memory less its page cache, ``memCache`` that cache, ``memTotal``
  its memory limit (the machine's memory when it has none): cgroup v2 ``memory.current``,
  ``memory.stat`` ``file``, ``memory.max``; v1 ``memory.usage_in_bytes``, ``memory.stat``
  ``total_cache``, ``memory.limit_in_bytes``;
- ``cpuUsedPct``: the CPU time the cgroup used since the sample before (the first: since the
  sandbox started), over that time and the CPUs it may use (``cpuCount``), rounded to two
  decimals: v2 ``cpu.stat`` ``usage_usec``; v1 (whose CPU accounting is not the sandbox's
  own) the user and system time of the cgroup's processes and of the children they waited for;
- ``diskUsed``, ``diskTotal``: the filesystem of the sandbox's home, whose space its files take.

``start`` and ``end`` (Unix seconds, default the sandbox's start and now) bound the samples
listed; ``start`` after ``end`` is answered 400. On docker the cgroup is the container's, read through its
first process as this machine sees it (``cgroup_pid``: an engine on this machine). A sandbox
whose processes have no cgroup of their own on this machine (kubernetes, whose processes are
the cluster's; docker with an engine elsewhere; local, which shares the server's) is answered
501 with E2B's body naming why. ``cpuCount``: the CPUs its processes may run on, at most what
its cgroup v2 quota (``cpu.max``) gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...limits import E2B_METRICS_INTERVAL_SECONDS, E2B_METRICS_KEPT
from .connect import ConnectError
from .sandboxes import RUNNING, E2BSandbox, Sandboxes

log = logging.getLogger(__name__)

CGROUP_ROOT = "/sys/fs/cgroup"
_TICKS = os.sysconf("SC_CLK_TCK")


class NoCgroup(Exception):
    """The sandbox's processes have no cgroup of their own on this machine."""


def _v2() -> bool:
    return os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers"))


def memory_cgroup(pid: int) -> str:
    """The folder of the memory cgroup pid is in (cgroup v2: its one cgroup)."""
    v2 = _v2()
    with open(f"/proc/{pid}/cgroup") as fh:
        for line in fh:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if v2 and number == "0":
                return CGROUP_ROOT + path
            if not v2 and "memory" in controllers.split(","):
                return os.path.join(CGROUP_ROOT, "memory") + path
    raise NoCgroup(f"process {pid} is in no memory cgroup")


def _read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name)) as fh:
        return fh.read().strip()


def _stat(folder: str, name: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in _read(folder, name).splitlines())}


def _machine_memory() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise NoCgroup("no MemTotal in /proc/meminfo")


def _cpu_seconds_v1(folder: str) -> float:
    """The user and system time of the cgroup's processes and of their waited-for children."""
    total = 0
    for pid in _read(folder, "cgroup.procs").split():
        with contextlib.suppress(OSError, IndexError, ValueError):  # ended meanwhile
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / _TICKS


def _quota_cpus(folder: str) -> int | None:
    """The CPUs a cgroup v2 quota gives (``cpu.max``, rounded up), None without one."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = _read(folder, "cpu.max").split()
        if quota != "max":
            return max(1, -(-int(quota) // int(period)))
    return None


@dataclass
class Reading:
    """One look at a cgroup: its CPU time so far and its memory now."""

    at: float
    cpu_seconds: float
    cpu_count: int
    mem_used: int
    mem_cache: int
    mem_total: int


def read_cgroup(pid: int) -> Reading:
    folder = memory_cgroup(pid)
    own = memory_cgroup(os.getpid())
    if folder == own or folder.rstrip("/") in (CGROUP_ROOT, os.path.join(CGROUP_ROOT, "memory")):
        raise NoCgroup("its processes share the server's cgroup")
    cpu_count = len(os.sched_getaffinity(pid))
    if _v2():
        cpu_count = min(cpu_count, _quota_cpus(folder) or cpu_count)
        usage, cache = int(_read(folder, "memory.current")), _stat(folder, "memory.stat").get("file", 0)
        limit_text = _read(folder, "memory.max")
        limit = _machine_memory() if limit_text == "max" else int(limit_text)
        cpu = _stat(folder, "cpu.stat")["usage_usec"] / 1e6
    else:
        usage, cache = int(_read(folder, "memory.usage_in_bytes")), _stat(folder, "memory.stat")["total_cache"]
        limit = min(int(_read(folder, "memory.limit_in_bytes")), _machine_memory())
        cpu = _cpu_seconds_v1(folder)
    return Reading(time.time(), cpu, cpu_count, max(usage - cache, 0), cache, limit)


def _disk(home: str) -> tuple[int, int]:
    """(used, total) bytes of the filesystem home is on."""
    found = os.statvfs(home)
    total = found.f_blocks * found.f_frsize
    return total - found.f_bavail * found.f_frsize, total


def sample(reading: Reading, before: Reading | None, started: float, home: str) -> dict[str, Any]:
    """E2B's SandboxMetric of reading, its CPU share since before (none: since started)."""
    since, used = (before.at, reading.cpu_seconds - before.cpu_seconds) if before else (started, reading.cpu_seconds)
    span = max(reading.at - since, 1e-6) * reading.cpu_count
    disk_used, disk_total = _disk(home)
    at = int(reading.at)
    return {"timestamp": datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z"), "timestampUnix": at,
            "cpuCount": reading.cpu_count, "cpuUsedPct": round(min(max(used / span, 0.0), 1.0) * 100, 2),
            "memUsed": reading.mem_used, "memTotal": reading.mem_total, "memCache": reading.mem_cache,
            "diskUsed": disk_used, "diskTotal": disk_total}


@dataclass
class Series:
    samples: deque[dict[str, Any]]
    last: Reading | None = None


class Metrics:
    """The samples of every sandbox of the server (the module docstring)."""

    def __init__(self, sandboxes: Sandboxes):
        self.sandboxes = sandboxes
        self._series: dict[str, Series] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The sampling begins (once; in the server's loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._every_interval())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _every_interval(self) -> None:
        while True:
            boxes = self.sandboxes.every()
            self._series = {box.id: self._series[box.id] for box in boxes if box.id in self._series}
            for box in boxes:
                try:
                    await self.take(box)
                except (NoCgroup, OSError, ConnectError, TimeoutError):  # not sampled now: killed, paused, busy
                    continue
                except Exception:  # never the end of every sandbox's sampling
                    log.exception("e2b: sandbox %s not sampled", box.id)
            await asyncio.sleep(E2B_METRICS_INTERVAL_SECONDS)

    async def take(self, box: E2BSandbox) -> None:
        """A sample of the sandbox now, kept (none while it is paused)."""
        pid = None if box.envd is None or box.state != RUNNING else box.envd.host_pid()
        if pid is None and box.state == RUNNING:
            pid = await asyncio.to_thread(box.sandbox.cgroup_pid)
        if pid is None:
            if box.state == RUNNING:
                raise NoCgroup("its processes are not this machine's")
            return
        if box.envd is not None and not box.envd.answered:  # still joining its cgroup: read it once it runs
            await asyncio.wait_for(box.envd.call("list"), E2B_METRICS_INTERVAL_SECONDS)
        reading = await asyncio.to_thread(read_cgroup, pid)
        before = self._series[box.id].last if box.id in self._series else None
        taken = await asyncio.to_thread(sample, reading, before, box.started_at.timestamp(),
                                        str(box.agent.settings.home))
        series = self._series.setdefault(box.id, Series(deque(maxlen=E2B_METRICS_KEPT)))
        series.samples.append(taken)
        series.last = reading

    async def of(self, box: E2BSandbox, start: int | None, end: int | None) -> list[dict[str, Any]]:
        """Its samples from start to end (Unix seconds); NoCgroup where it cannot be sampled."""
        if box.id not in self._series or not self._series[box.id].samples:
            await self.take(box)
        low = int(box.started_at.timestamp()) if start is None else start
        high = int(time.time()) if end is None else end
        series = self._series.get(box.id)
        return [] if series is None else [s for s in series.samples if low <= s["timestampUnix"] <= high]
