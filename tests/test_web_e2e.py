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

from fixtures import secret_forms
from web_kit import FORMS_COMMAND, SECRET, SPLITS_COMMAND, TOKEN, fill, record_code_task, served

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


async def test_the_result_page_shows_no_escaped_or_markdown_joined_secret(tmp_path):
    """re.escape and JSON's \\/ (Markdown undoes both), a character reference and emphasis: the
    Result view's visible text holds the secret in none of them."""
    async with served(tmp_path, run_id="demo") as s:
        forms = await s.toolbox.call("forms", "shell", {"command": FORMS_COMMAND})
        splits = await s.toolbox.call("forms", "shell", {"command": SPLITS_COMMAND})
        server, task, base = await start_server(s.app)
        problems: list[str] = []
        try:
            async with playwright_api.async_playwright() as p:
                browser = await _browser(p)
                page = await _page(browser, base)
                _watch(page, problems)
                shown = []
                for call in (forms, splits):
                    await page.goto(f"{base}/runs/forms/calls/{call.meta['seq']}")
                    result = page.locator("#detail .view.result.markdown")
                    await expect(result).to_contain_text("[REDACTED]")
                    shown.append(await result.inner_text())
                    assert secret_forms.SECRET not in await page.content()
                await browser.close()
        finally:
            server.should_exit = True
            await task
    assert "re-escape: [REDACTED]" in shown[0] and 'json-slash: "[REDACTED]"' in shown[0], shown[0]
    assert "entity: [REDACTED]" in shown[1] and "emphasis: [REDACTED]" in shown[1], shown[1]
    assert not any(secret_forms.SECRET in text for text in shown)
    assert problems == []


async def _browser(p):
    return await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


async def _page(browser, base: str):
    """A page logged in to the app (the one-time token URL leaves a cookie)."""
    page = await browser.new_page(viewport={"width": 1200, "height": 800})
    await page.goto(f"{base}/?token={TOKEN}")
    return page


def _watch(page, problems: list[str]) -> None:
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)


async def _seqs(page) -> list[int]:
    return [int(s) for s in await page.locator("#flow li.item").evaluate_all("els => els.map(e => e.dataset.seq)")]


async def test_the_flow_stays_whole_across_back_forward_and_reload(tmp_path):
    async with served(tmp_path, run_id="demo") as s:
        server, task, base = await start_server(s.app)
        problems: list[str] = []
        try:
            async with playwright_api.async_playwright() as p:
                browser = await _browser(p)
                page = await _page(browser, base)
                _watch(page, problems)
                await page.goto(base + "/runs/demo")
                await expect(page.locator("#call-11")).to_be_visible()

                # a row open, a new call arrives live, then Back: the new row is still there
                await page.locator("#call-1 a").click()
                await expect(page.locator("#detail h2")).to_contain_text("Run for i in")
                assert page.url.endswith("/runs/demo/calls/1")
                await s.toolbox.call("demo", "shell", {"command": "echo twelve"})
                await expect(page.locator("#call-12.done")).to_be_visible()
                await page.go_back()
                await page.wait_for_url(base + "/runs/demo")
                await expect(page.locator("#call-12.done")).to_be_visible()
                assert await _seqs(page) == list(range(1, 13))

                # Back, rows arrive, Forward: no row is missing, in the middle or at the end
                await s.toolbox.call("demo", "shell", {"command": "echo thirteen"})
                await expect(page.locator("#call-13.done")).to_be_visible()
                await page.go_forward()
                await page.wait_for_url(base + "/runs/demo/calls/1")
                await expect(page.locator("#detail h2")).to_contain_text("Run for i in")
                await s.toolbox.call("demo", "shell", {"command": "echo fourteen"})
                await expect(page.locator("#call-14.done")).to_be_visible()
                assert await _seqs(page) == list(range(1, 15))
                await page.go_back()
                await page.wait_for_url(base + "/runs/demo")
                await expect(page.locator("#call-14.done")).to_be_visible()
                await s.toolbox.call("demo", "shell", {"command": "echo fifteen"})
                await expect(page.locator("#call-15.done")).to_be_visible()
                assert await _seqs(page) == list(range(1, 16))

                # a row restored without the stream (the browser's own cache): the record fills it in
                await page.evaluate("""() => {
                    document.querySelectorAll('#call-3, #call-14, #call-15').forEach(e => e.remove());
                    window.dispatchEvent(new PageTransitionEvent('pageshow', {persisted: true}));
                }""")
                await expect(page.locator("#call-15.done")).to_be_visible()
                await expect(page.locator("#call-3")).to_be_visible()
                assert await _seqs(page) == list(range(1, 16))

                await page.reload()
                assert await _seqs(page) == list(range(1, 16))
                await browser.close()
        finally:
            server.should_exit = True
            await task
    assert problems == []


async def test_tabs_do_not_grow_the_history_and_jumps_reach_any_call(tmp_path):
    async with served(tmp_path, run_id="demo") as s:
        await fill(s.store, "big", 5000)
        server, task, base = await start_server(s.app)
        problems: list[str] = []
        try:
            async with playwright_api.async_playwright() as p:
                browser = await _browser(p)
                page = await _page(browser, base)
                _watch(page, problems)
                await page.goto(base + "/runs/big")
                await page.locator("#call-4990 a").click()
                detail = page.locator("#detail")
                await expect(detail.locator("h2")).to_contain_text("echo step 4990")
                length = await page.evaluate("history.length")
                for name in ("Arguments", "Metadata", "Result", "Arguments"):
                    await detail.get_by_role("tab", name=name).click()
                    await expect(detail.get_by_role("tab", name=name)).to_have_class("active")
                await detail.get_by_role("link", name="Raw").count()
                assert await page.evaluate("history.length") == length
                assert page.url.endswith("/runs/big/calls/4990?view=arguments")
                await page.go_back()  # one step: the page before the row was opened
                await page.wait_for_url(base + "/runs/big")

                # jump to the first call, to any seq, then load later
                await page.get_by_role("link", name="First call").click()
                await page.wait_for_url(base + "/runs/big?at=1")
                assert (await _seqs(page))[:3] == [1, 2, 3]
                await page.get_by_label("Call").fill("2345")
                await page.get_by_role("button", name="Go").click()
                await page.wait_for_url(base + "/runs/big?at=2345")
                assert (await _seqs(page))[0] == 2345
                await page.get_by_role("button", name="Load later").click()
                await expect(page.locator("#call-2744")).to_be_attached()
                await page.locator("#call-2345 a").click()
                await expect(detail.locator("h2")).to_contain_text("echo step 2345")
                await browser.close()
        finally:
            server.should_exit = True
            await task
    assert problems == []


async def _tab_clicks_ms(page, base: str, run: str, seq: int) -> float:
    """The median time of a tab click (request, swap, settle, paint) on a call of run, every
    row loaded, timed in the page."""
    import statistics

    await page.goto(f"{base}/runs/{run}/calls/{seq}")
    earlier = page.get_by_role("button", name="Load earlier")
    while await earlier.count():  # every row of the run on the page (25 pages for 5,000 calls)
        rows = await page.locator("#flow li.item").count()
        await earlier.click()
        await expect(page.locator("#flow li.item")).not_to_have_count(rows)
    times = [await page.evaluate(CLICK_TAB_MS, name) for name in ("Arguments", "Metadata", "Result") * 4]
    return statistics.median(times)


CLICK_TAB_MS = """name => new Promise(resolve => {
    const began = performance.now();
    document.body.addEventListener("htmx:afterSettle", () => {
        requestAnimationFrame(() => setTimeout(() => resolve(performance.now() - began)));  // painted
    }, {once: true});
    [...document.querySelectorAll("#detail nav.views a")].find(a => a.textContent === name).click();
})"""


async def test_a_big_run_clicks_as_fast_as_a_small_one(tmp_path):
    async with served(tmp_path, run_id="demo") as s:
        await fill(s.store, "small", 10)
        await fill(s.store, "big", 5000)
        server, task, base = await start_server(s.app)
        try:
            async with playwright_api.async_playwright() as p:
                browser = await _browser(p)
                page = await _page(browser, base)
                figures = [(await _tab_clicks_ms(page, base, "small", 5),  # interleaved
                            await _tab_clicks_ms(page, base, "big", 4995)) for _ in range(2)]
                await browser.close()
        finally:
            server.should_exit = True
            await task
    small = min(f[0] for f in figures)
    big = min(f[1] for f in figures)
    print(f"tab click median: small run {small:.0f} ms, 5,000-call run {big:.0f} ms")
    assert big < max(2.5 * small, small + 60), figures
