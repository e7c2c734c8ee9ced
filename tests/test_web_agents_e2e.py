"""The Agents page in a real browser (Playwright driving Debian's Chromium, as tests/test_web_e2e.py):
agents made and removed through ``Agents.make`` on the local sandbox, the list read, filtered
through its form, and an agent's link followed to its runs and on to a run.
``GUILDS_UPDATE_SCREENSHOTS=1`` writes docs/screenshots/agents.png."""

from __future__ import annotations

import os

import pytest

from guilds.web.flow import when
from test_web_e2e import CHROMIUM, SCREENSHOTS, _browser, _page, _watch, start_server
from web_kit import agents_record

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect
EVIL = "<img src=x onerror=alert(1)>"


async def test_the_agents_list_filters_and_leads_to_an_agent_s_runs(tmp_path):
    async with agents_record(tmp_path) as rec:
        alice = await rec.agents.make("py", owner=rec.owner("alice"))
        await (await rec.agents.toolbox(alice.id)).call("alice-run", "shell", {"command": "cat README"})
        evil = await rec.agents.make("py", owner=rec.owner(EVIL), expires_in=600)
        gone = await rec.agents.make("py", owner=rec.owner("alice"))
        await rec.agents.remove(gone.id)
        server, task, base = await start_server(rec.app)
        problems: list[str] = []
        try:
            async with playwright_api.async_playwright() as p:
                browser = await _browser(p)
                page = await _page(browser, base)
                _watch(page, problems)
                await page.get_by_role("link", name="Agents", exact=True).click()
                assert page.url == f"{base}/agents"
                ids = page.locator("tr.agent td:first-child a")
                await expect(ids).to_have_text([rec.own.settings.id, gone.id, evil.id, alice.id])
                alice_row = page.locator(f'tr[data-agent="{alice.id}"] td')
                last_call = (await rec.store.list_runs(alice.id))[0].updated_at
                await expect(alice_row).to_have_text([alice.id, "py", rec.owner("alice"), "live", "local",
                                                      when(alice.created_at), "never", "", "1", when(last_call)])
                await expect(page.locator(f'tr[data-agent="{evil.id}"] td').nth(2)).to_have_text(rec.owner(EVIL))
                assert await page.evaluate("document.querySelectorAll('main img').length") == 0
                shots = SCREENSHOTS if os.environ.get("GUILDS_UPDATE_SCREENSHOTS") == "1" else tmp_path
                await page.screenshot(path=str(shots / "agents.png"))

                # the filter form: the removed agents only, then back to every agent
                await page.get_by_label("State").select_option("removed")
                await page.get_by_role("button", name="Filter").click()
                await expect(ids).to_have_text([gone.id])
                assert page.url.endswith("/agents?owner=&state=removed")
                await page.get_by_role("link", name="Clear").click()
                await page.get_by_label("Owner").fill(rec.owner("alice"))
                await page.get_by_role("button", name="Filter").click()
                await expect(ids).to_have_text([gone.id, alice.id])

                # an agent's link: its runs, then a run, which names its agent
                await page.get_by_role("link", name=alice.id, exact=True).click()
                await expect(page.locator("h1")).to_have_text(f"Runs of agent {alice.id}")
                await page.get_by_role("link", name="alice-run").click()
                await expect(page.locator("#call-1 .text")).to_have_text("Run cat README")
                await expect(page.locator("h1 a.agent")).to_have_text(alice.id)
                await browser.close()
        finally:
            server.should_exit = True
            await task
    assert problems == []
