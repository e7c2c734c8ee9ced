"""The app end to end in a real browser: Playwright driving Debian's Chromium.

Calls made through the real toolbox appear live in the open run; a row opens
its views; Result switches to Raw; the Full output log opens with the secret
redacted. ``GUILDS_UPDATE_SCREENSHOTS=1`` writes the screenshots into
docs/screenshots/ (else into the test's temporary folder).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import uvicorn
from web_kit import SECRET, TOKEN, record_code_task, served

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(__file__).parent.parent / "docs" / "screenshots"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect


async def start_server(app) -> tuple[uvicorn.Server, asyncio.Task, str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    return server, task, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


async def test_the_flow_live_and_a_calls_views(tmp_path):
    shots = SCREENSHOTS if os.environ.get("GUILDS_UPDATE_SCREENSHOTS") == "1" else tmp_path
    async with served(tmp_path, run_id="demo") as s:
        server, task, base = await start_server(s.app)
        problems: list[str] = []
        try:
            async with playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page(viewport={"width": 1360, "height": 860})
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)

                await record_code_task(s.store, "demo")
                await page.goto(f"{base}/?token={TOKEN}")  # the one-time URL: a cookie, then a clean URL
                assert page.url == base + "/"
                await page.get_by_role("link", name="demo").click()
                await expect(page.locator("#call-11 .text")).to_have_text("Run sleep 5 · timed out")
                await expect(page.locator("#call-10")).to_contain_text("the agent has no repository")

                # new calls land while the page is open: they show up without a reload
                await expect(page.locator("#call-12 .diffstat")).to_contain_text("2 files changed")
                await s.toolbox.call("demo", "file_read", {"path": "notes.md", "offset": 3})
                await expect(page.locator("#call-13.done .text")).to_have_text(
                    "Read notes.md from line 3 · unchanged since step 2")
                late = asyncio.create_task(s.toolbox.call("demo", "shell", {"command": "sleep 1; echo done"}))
                await expect(page.locator("#call-14.running")).to_be_visible()
                await late
                await expect(page.locator("#call-14.done .text")).to_have_text("Run sleep 1; echo done")

                # open a row: the Result as Markdown, then Raw
                await page.locator("#call-1 a").click()
                detail = page.locator("#detail")
                await expect(detail.locator(".view.result.markdown")).to_contain_text("line 1 [REDACTED]")
                await page.screenshot(path=str(shots / "flow.png"), full_page=False)
                await detail.get_by_role("link", name="Raw").click()
                raw = detail.locator("pre.raw")
                await expect(raw).to_contain_text("bytes elided; full output:")
                await expect(raw).to_contain_text("remaining_tool_calls: ")
                assert page.url.endswith("/runs/demo/calls/1?view=result&format=raw")

                await detail.get_by_role("tab", name="Arguments").click()
                await expect(detail.locator("dl.arguments")).to_contain_text("for i in $(seq 1 3000)")
                await detail.get_by_role("tab", name="Metadata").click()
                await expect(detail.locator("dl.metadata dt")).to_have_text(
                    ["Call", "Tool", "Exit code", "Full output log", "Working directory", "Bytes elided",
                     "Secrets redacted"])
                await page.screenshot(path=str(shots / "call-metadata.png"))

                # a repeated read points to its step
                await page.locator("#call-3 a").click()
                await expect(detail.locator("h2")).to_contain_text("unchanged since step 2")
                await detail.get_by_role("tab", name="Metadata").click()
                await expect(detail.locator("dl.metadata")).to_contain_text("Same as step")
                await detail.get_by_role("link", name="2", exact=True).click()
                await expect(detail.locator("h2")).to_have_text("2 Read notes.md")
                await expect(detail.locator(".view.result")).to_contain_text("notes.md lines 1–4 of 4")

                # the Full output log, through redaction
                await page.locator("#call-1 a").click()
                await expect(detail.locator("h2")).to_contain_text("Run for i in")
                await detail.get_by_role("tab", name="Metadata").click()
                await detail.get_by_role("link", name=".log").click()
                await expect(page.locator("h1")).to_have_text("Full output log · step 1")
                await expect(page.locator("pre.log").first).to_contain_text("line 2999 [REDACTED]")
                await page.screenshot(path=str(shots / "full-output-log.png"))
                assert SECRET not in await page.content()

                await page.go_back()
                await expect(page.locator("#flow")).to_be_visible()
                await browser.close()
        finally:
            server.should_exit = True
            await task
    assert problems == []
