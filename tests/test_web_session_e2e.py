"""What another server on this machine gets from the app's browser (Chromium via Playwright).

A browser sends the cookies of 127.0.0.1 to every port of it. After a login through the
URL a real `guilds serve` printed, the browser visits a bystander: a plain HTTP server on
another port of 127.0.0.1 that writes down every request it receives, as any local dev
server could. It must receive a session of the app, never the token; and what it
received, replayed as an attacker would, must not run a command through `/mcp`.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from test_endpoint_lock import ID_U, ID_U_HEADERS, INITIALIZE, MCP_HEADERS
from test_web_e2e import CHROMIUM, CHROMIUM_ARGS
from web_kit import printed_lines, start_serve, stop_serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]
playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect


@contextlib.contextmanager
def bystander() -> Iterator[tuple[str, list[str]]]:
    """(its URL, every request it received: request line and headers as they came)."""
    heard: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            heard.append(f"{self.requestline}\n{self.headers}")
            body = b"<!doctype html><title>bystander</title><p>bystander</p>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", heard
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def _visit(login_url: str, other_url: str) -> str:
    """Log in through the printed URL in Chromium, then open the other server's page;
    the URL the app's login left the browser on."""
    async with playwright_api.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await page.goto(login_url)
        landed = page.url
        await expect(page.locator("body")).not_to_contain_text("needs its token")
        await page.goto(other_url)
        await expect(page.locator("p")).to_have_text("bystander")
        await browser.close()
    return landed


async def test_a_server_on_another_port_gets_a_session_that_mcp_refuses(tmp_path):
    proc = start_serve(tmp_path / "data")
    try:
        printed = "".join(printed_lines(proc))
        url = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=(\S+)", printed)
        assert url, printed
        base, port, token = url.groups()
        with bystander() as (other_url, heard):
            assert await _visit(url.group(0), other_url) == base + "/"
        assert heard and not [request for request in heard if token in request]
        cookie = re.search(r"^Cookie: (.*)$", heard[0], re.MULTILINE | re.IGNORECASE).group(1)
        session = re.fullmatch(rf"guilds-session-{port}=([A-Za-z0-9_-]+)", cookie).group(1)

        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            for replayed in ({"authorization": f"Bearer {session}"}, {"cookie": cookie},
                             {"cookie": f"guilds-token-{port}={session}"}):
                assert (await c.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **replayed})).status_code == 401
                refused = await c.post("/mcp", json=ID_U, headers={**ID_U_HEADERS, **replayed})
                assert refused.status_code == 401, replayed
            app = await c.get("/", headers={"cookie": cookie})  # the session opens the app's pages
            assert app.status_code == 200 and "<title>" in app.text
            ran = await c.post("/mcp", json=ID_U, headers={**ID_U_HEADERS, "authorization": f"Bearer {token}"})
            run_line, output = ran.json()["result"]["content"][0]["text"].split("\n", 1)
            assert run_line.startswith("run: mcp-") and output.startswith(f"{os.getuid()}\n")
    finally:
        stop_serve(proc)


FOREIGN = {"name": "prefs", "value": '{"theme": "dark", "size": 2}'}
"""Another local app's cookie: JSON, spaces and quotes (a strict cookie parser stops at it)."""


async def test_another_apps_cookie_does_not_lock_out_and_log_out_ends_the_session(tmp_path):
    """In Chromium: another app's cookie of 127.0.0.1, set before the login so the browser sends it
    first, leaves the app open; the Log out button ends the session on the server."""
    from guilds.web.endpoint_lock import LOGGED_OUT

    proc = start_serve(tmp_path / "data")
    try:
        printed = "".join(printed_lines(proc))
        url = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=(\S+)", printed)
        assert url, printed
        base, port, _ = url.groups()
        sent: list[str] = []
        async with playwright_api.async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = await browser.new_context()
            await context.add_cookies([{**FOREIGN, "url": base + "/"}])
            page = await context.new_page()

            async def note(request) -> None:
                if request.url == base + "/":
                    sent.append((await request.all_headers()).get("cookie", ""))

            page.on("request", note)
            await page.goto(url.group(0))
            await expect(page.locator("header.top .brand")).to_have_text("guilds")
            assert sent and sent[-1].startswith("prefs=") and f"guilds-session-{port}=" in sent[-1], sent
            logged_in = sent[-1]
            await page.get_by_role("button", name="Log out").click()
            await expect(page.locator("body")).to_contain_text(LOGGED_OUT)
            assert [c["name"] for c in await context.cookies()] == ["prefs"]  # the session cookie dropped
            await page.goto(base + "/")
            await expect(page.locator("body")).to_contain_text("needs its token")
            await browser.close()
        assert f"guilds-session-{port}=" not in sent[-1]
        session = re.search(rf"guilds-session-{port}=[A-Za-z0-9_-]+", logged_in).group(0)
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            assert (await c.get("/", headers={"cookie": session})).status_code == 401  # ended on the server
    finally:
        stop_serve(proc)
