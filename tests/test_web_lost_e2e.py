"""A call whose process is killed, seen live in a real browser (Chromium via Playwright):
the open run's row turns from running to lost, and the call's page says what happened."""

from __future__ import annotations

import os

import pytest

import mcp_kit as kit
from guilds.limits import OWNER_HEARTBEAT_SECONDS as HEARTBEAT_SECONDS
from guilds.web.app import create_app
from guilds.web.endpoint_lock import Lock, host_names
from guilds.web.logs import HelperLogReader
from guilds_code.redact import Redactor
from test_process_faults import record, running_sleep, start_call
from test_web_e2e import CHROMIUM, CHROMIUM_ARGS, start_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
TOKEN = "lost-e2e-token-0123456789abcdefghijklmnop"


async def no_logs(agent_id: str, path: str) -> dict:
    return {"ok": False, "error": "no logs here"}


async def test_a_killed_calls_row_turns_lost_live(tmp_path):
    (tmp_path / "data").mkdir()
    command, arg = kit.sleep_command()
    async with record(tmp_path) as store:
        app = create_app(store, redactor=Redactor([]), logs=HelperLogReader(no_logs),
                         lock=Lock(TOKEN, host_names("127.0.0.1")))
        server, task, base = await start_server(app)
        proc = start_call(tmp_path, command, "doomed")
        try:
            await running_sleep(proc, arg)
            async with playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page()
                await page.goto(f"{base}/runs/doomed?token={TOKEN}")
                assert page.url == f"{base}/runs/doomed"
                row = page.locator("#call-1")
                await expect(row).to_have_class("item row running")
                proc.kill()
                proc.wait(10)
                await expect(row).to_have_class("item row lost", timeout=(3 * HEARTBEAT_SECONDS + 5) * 1000)
                await expect(row.locator(".text")).to_have_text(f"Run {command} · lost")
                await row.locator("a").click()
                detail = page.locator("#detail")
                await expect(detail).to_contain_text("ended before the call finished")
                assert "Running: the result is not in yet" not in await detail.inner_text()
                await browser.close()
        finally:
            proc.kill()
            proc.communicate()
            server.should_exit = True
            await task
    assert not await kit.left_running(arg)
