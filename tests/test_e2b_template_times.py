"""The time bounds of E2B template builds, at their edge, on bwrap (in-process, the bounds made
short): a build past E2B_TEMPLATE_BUILD_SECONDS fails naming the step under way and leaves no
sandbox, one within it is ready; a built template's ready command that never succeeds within
E2B_TEMPLATE_READY_SECONDS fails the create, one that succeeds in time lets it answer; a build's
logs hold E2B_TEMPLATE_LOG_ENTRIES entries of E2B_TEMPLATE_LOG_LINE_CHARS at most."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import guilds
from e2b_kit import _settings
from guilds.fronts.e2b import template_service, template_start
from guilds.fronts.e2b.connect import ConnectError
from guilds.fronts.e2b.sandboxes import Sandboxes
from guilds.fronts.e2b.template_service import Templates
from guilds.limits import E2B_TEMPLATE_LOG_ENTRIES, E2B_TEMPLATE_LOG_LINE_CHARS

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap")]
BOUND = 4.0
"""The bounds, made this short for the test (seconds)."""


async def _ended(templates: Templates, made: dict) -> dict:
    build = templates.build("default", made["templateID"], made["buildID"])
    deadline = time.monotonic() + 120
    while build.status == "building" and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return build.info(0, 100)


@pytest.fixture
async def served(tmp_path, backend):
    (tmp_path / "home").mkdir()
    data = tmp_path / "data"
    async with guilds.open(_settings(tmp_path, backend, ""), data_dir=data, pool=False,
                           env={**os.environ, "GUILDS_DATA": str(data)}) as agent:
        agents = await agent.agents()
        sandboxes = Sandboxes(agents, "client")
        templates = Templates(sandboxes)
        try:
            yield agents, sandboxes, templates
        finally:
            await templates.close()
            await sandboxes.close()


async def test_a_build_past_its_time_fails_naming_the_step_under_way(served, monkeypatch):
    agents, _, templates = served
    monkeypatch.setattr(template_service, "E2B_TEMPLATE_BUILD_SECONDS", BOUND)
    steps = [{"type": "RUN", "args": ["true"]}, {"type": "RUN", "args": [f"sleep {BOUND + 30:g}"]}]
    made = templates.request("default", {"name": "slow"})
    started = time.monotonic()
    templates.start("default", made["templateID"], made["buildID"], {"fromImage": "e2bdev/base", "steps": steps})
    info = await _ended(templates, made)
    assert info["status"] == "error" and info["reason"]["step"] == "2"
    assert info["reason"]["message"] == f"the build ran past {BOUND:g} s (E2B_TEMPLATE_BUILD_SECONDS)"
    assert time.monotonic() - started < BOUND + 20  # ended at its bound, not at the step's end
    assert not [a for a in await agents.live() if a.owner.startswith("e2b:")]  # its sandbox removed
    quick = templates.request("default", {"name": "quick"})
    templates.start("default", quick["templateID"], quick["buildID"],
                    {"fromImage": "e2bdev/base", "steps": [{"type": "RUN", "args": [f"sleep {BOUND / 4:g}"]}]})
    assert (await _ended(templates, quick))["status"] == "ready"  # within the bound


async def test_a_ready_command_is_waited_for_within_its_bound(served, monkeypatch):
    _, sandboxes, _ = served
    monkeypatch.setattr(template_start, "E2B_TEMPLATE_READY_SECONDS", BOUND)
    box = await sandboxes.create("default", "base", 120, {}, {})
    try:
        started = time.monotonic()
        await template_start.started(box, {"start_cmd": "sleep 1 && touch ready.flag && exec sleep 300",
                                           "ready_cmd": "test -f ready.flag"})
        assert 1 <= time.monotonic() - started < BOUND
        with pytest.raises(ConnectError, match=r"ready command did not succeed within 4 s .*: test -f never"):
            await template_start.started(box, {"ready_cmd": "test -f never"})
        assert time.monotonic() - started >= BOUND
    finally:
        await sandboxes.pause(box)  # its process service closed, its start command ended
        await sandboxes.kill(box)


async def test_a_builds_logs_are_bounded_at_their_edge(served):
    _, _, templates = served
    made = templates.request("default", {"name": "loud"})
    long_line = f"printf 'x%.0s' $(seq 1 {E2B_TEMPLATE_LOG_LINE_CHARS + 1}); echo"
    steps = [{"type": "RUN", "args": [long_line]}, {"type": "RUN", "args": [f"seq 1 {E2B_TEMPLATE_LOG_ENTRIES}"]}]
    templates.start("default", made["templateID"], made["buildID"], {"fromImage": "e2bdev/base", "steps": steps})
    await _ended(templates, made)
    build = templates.build("default", made["templateID"], made["buildID"])
    messages = [e["message"] for e in build.entries]
    assert build.status == "ready" and E2B_TEMPLATE_LOG_ENTRIES - 10 < len(messages) <= E2B_TEMPLATE_LOG_ENTRIES
    cut = next(m for m in messages if m.startswith("xxx"))
    assert len(cut) == E2B_TEMPLATE_LOG_LINE_CHARS and cut.endswith("...")
    assert sum(m.startswith("... more output dropped") for m in messages) == 1
    assert messages[-1] == "Build finished: the template is ready"
    assert "1990" not in messages and len(build.info(0, 1000)["logEntries"]) == 1000
    assert build.info(len(messages) - 1, 100)["logEntries"][0]["message"] == messages[-1]


async def test_builds_not_running_are_kept_up_to_their_bound(served):
    _, _, templates = served
    made = [templates.request("default", {"name": "same"}) for _ in range(template_service.BUILDS_KEPT)]
    assert all(templates.build("default", m["templateID"], m["buildID"]) for m in made)  # exactly the most
    templates.request("default", {"name": "same"})
    with pytest.raises(ConnectError, match="not found"):
        templates.build("default", made[0]["templateID"], made[0]["buildID"])  # the oldest forgotten
    assert templates.build("default", made[1]["templateID"], made[1]["buildID"])
