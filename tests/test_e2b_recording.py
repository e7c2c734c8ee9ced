"""E2B requests are recorded through the toolbox's own path: past ``max_tool_calls`` a
command or any other request gets the toolbox's own refusal, and a secret redacted from a
command's output is counted in its call's savings, as for any tool call."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from e2b_kit import e2b_server
from guilds.record import Store, database_url
from guilds.toolbox.toolbox import BUDGET_REFUSED

pytestmark = pytest.mark.slow

SECRET = "e2b-kept-secret-5c1f"
BUDGET = 4


async def _calls(data, run_id: str) -> list:
    async with Store(database_url(data, {})) as store:
        return await store.calls(run_id)


def _ended_calls(data, run_id: str, count: int) -> list:
    """The run's calls once count of them are finished (a command's record comes at its end)."""
    deadline = time.monotonic() + 10
    while True:
        calls = asyncio.run(_calls(data, run_id))
        if sum(c.status != "running" for c in calls) >= count or time.monotonic() > deadline:
            return calls
        time.sleep(0.1)


def test_past_the_budget_e2b_requests_get_the_toolboxs_text_and_redactions_are_counted(tmp_path, monkeypatch):
    with e2b_server(tmp_path, "local", f'[secrets]\nKEPT = "{SECRET}"', max_tool_calls=BUDGET) as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        box = Sandbox.create()
        run_id = f"e2b-{box.sandbox_id}"
        assert box.commands.run("echo $KEPT; echo $KEPT >&2").exit_code == 0
        calls = _ended_calls(served.data, run_id, 1)
        assert calls[0].tool == "shell" and SECRET not in calls[0].text
        assert calls[0].meta.get("secrets_redacted") == 2, (calls[0].text, calls[0].meta)
        box.commands.run("true")
        box.files.write("a.txt", "x")
        box.commands.run("true")  # the budget's last call
        refused = BUDGET_REFUSED.format(n=BUDGET)
        with pytest.raises(RateLimitException) as command:
            box.commands.run("touch never.txt")
        assert refused in str(command.value)
        with pytest.raises(RateLimitException) as write:
            box.files.write("b.txt", "never")
        assert refused in str(write.value)
        home, = (served.data / "agent-homes").iterdir()  # the sandbox's agent's
        assert not (home / "never.txt").exists() and not (home / "b.txt").exists()  # nothing was run
        calls = _ended_calls(served.data, run_id, BUDGET + 2)
        assert [c.tool for c in calls[-2:]] == ["shell", "e2b files.write"]
        assert all(c.is_error and not c.counted and c.body == refused for c in calls[-2:])
