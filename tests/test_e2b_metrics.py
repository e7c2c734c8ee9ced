"""``get_metrics`` through the unmodified E2B Python SDK against a real `guilds serve --e2b`: figures
of the sandbox's own cgroup (bwrap run as root makes one; on docker, the container's, its engine
on this machine), sampled as E2B samples them; a sandbox without a cgroup of its own (local) is
answered 501."""

from __future__ import annotations

import itertools
import os
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from e2b_kit import (
    e2b_server,
    home_of,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
)

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap", "docker")]
MEMORY = 384 << 20


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a bwrap sandbox has a cgroup of its own only when the server runs as root")
    with e2b_server(tmp_path_factory.mktemp("e2b-metrics"), backend, f'[{backend}]\nmemory = "384m"') as served:
        yield served


def _latest(box: Sandbox, after: float) -> object:
    """The first sample taken after `after` (a Unix time), waited for."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        fresh = [m for m in box.get_metrics() if m.timestamp.timestamp() > after]
        if fresh:
            return fresh[-1]
        time.sleep(0.5)
    raise AssertionError("no sample came")


def test_the_figures_are_the_sandboxes_cgroup(server, sbx):
    [first, *_] = sbx.get_metrics()  # the first call samples at once
    assert first.cpu_count == len(os.sched_getaffinity(0))
    assert first.mem_total == MEMORY  # the sandbox's limit, not the machine's
    assert 0 < first.mem_used < MEMORY and first.mem_cache >= 0
    statvfs = os.statvfs(home_of(sbx, server.data))
    assert first.disk_total == statvfs.f_blocks * statvfs.f_frsize and 0 < first.disk_used <= first.disk_total
    held = sbx.commands.run("exec python3 -c 'import time; b = b\"x\" * (160 << 20); time.sleep(60)'",
                            background=True)
    busy = sbx.commands.run("exec python3 -c 'import time\nwhile time.process_time() < 2: pass'", background=True)
    busy.wait()
    _latest(sbx, time.time() + 1)  # a sample after the work
    samples = sbx.get_metrics()
    assert max(m.mem_used for m in samples) >= first.mem_used + (150 << 20)  # the bytes, in the sandbox's cgroup
    used = sum(b.cpu_used_pct / 100 * b.cpu_count * (b.timestamp - a.timestamp).total_seconds()
               for a, b in itertools.pairwise(samples))
    assert 1.0 <= used <= (samples[-1].timestamp - samples[0].timestamp).total_seconds() * first.cpu_count
    held.kill()


def test_the_time_range_bounds_the_samples(sbx):
    sbx.get_metrics()  # a fresh sandbox's first sample is taken now, maybe in the second after `end` below
    before = datetime.now(UTC)
    assert len(sbx.get_metrics(start=before - timedelta(seconds=60), end=datetime.now(UTC))) >= 1
    assert sbx.get_metrics(start=before - timedelta(hours=1), end=before - timedelta(minutes=30)) == []
    with pytest.raises(SandboxException, match="start time cannot be after end time"):
        sbx.get_metrics(start=before, end=before - timedelta(minutes=1))


def test_samples_are_taken_every_interval(sbx):
    sbx.get_metrics()
    time.sleep(11)
    stamps = [m.timestamp for m in sbx.get_metrics()]
    assert len(stamps) >= 3 and stamps == sorted(stamps)


def test_a_sandbox_without_a_cgroup_of_its_own_is_501(tmp_path, monkeypatch):
    with e2b_server(tmp_path, "local") as served:
        served.export(monkeypatch)
        box = Sandbox.create(timeout=60)
        try:
            answer = httpx.get(f"{served.url}/sandboxes/{box.sandbox_id}/metrics", headers={"X-API-KEY": served.key})
            assert answer.status_code == 501 and "share the server's cgroup" in answer.json()["message"]
        finally:
            box.kill()
