"""The Rewind button of a call row, through the served app (``guilds.fronts.serve.build_app``)
over the real local sandbox, helper, bash and SQLite: the button only on a row with a
checkpoint, a rewind behind the lock and the header, one line for what cannot be done, and
an agent made on demand rewound through its own checkpoints."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

import guilds
from guilds.fronts.serve import build_app
from guilds.web.rewind import NO_HEADER
from web_kit import AUTH, LOCK, TOKEN

REWIND = {"x-guilds-rewind": "1"}
BASE = "http://127.0.0.1:8765"


def settings_file(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "kept.txt").write_text("before\n")
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nhome = "home"\nsandbox = "local"\ncheckpoints = true\nmax_tool_calls = 50\n')
    return path


@contextlib.asynccontextmanager
async def served(tmp_path: Path, *, with_agents: bool = False) -> AsyncIterator[tuple[guilds.fronts.agent.Agent,
                                                                                       httpx2.AsyncClient]]:
    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env={}) as agent:
        agents = await agent.agents() if with_agents else None
        app = build_app(agent.settings, agent.toolbox.store, agent.toolbox, lock=LOCK, agents=agents)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE) as client:
            yield agent, client


async def shell(run, command: str) -> None:
    result = await run.call("shell", {"command": command})
    assert not result.is_error, result.text


def rows_of(page: str) -> dict[str, str]:
    return dict(re.findall(r'<li id="call-(\d+)"(.*?)</li>', page, re.S))


async def test_a_row_with_a_checkpoint_has_the_button_and_it_puts_the_files_back(tmp_path):
    async with served(tmp_path) as (agent, client):
        run = agent.run("r")
        await shell(run, "echo after > kept.txt && echo new > made.txt")
        await run.call("file_read", {"path": "kept.txt"})
        rows = rows_of((await client.get("/runs/r", headers=AUTH)).text)
        assert 'data-rewind="/runs/r/calls/1/rewind"' in rows["1"]
        assert "button" not in rows["2"]  # a file_read takes no checkpoint: nothing to rewind to
        answer = await client.post("/runs/r/calls/1/rewind", headers={**AUTH, **REWIND})
        point = agent.toolbox.checkpoints.point_before("r", 1)
        assert answer.status_code == 200
        line = answer.json()["text"]
        assert re.fullmatch(rf"rewound run r to before call 1 \({point.id}\): \d+ paths restored", line)
        assert (tmp_path / "home" / "kept.txt").read_text() == "before\n"
        assert not (tmp_path / "home" / "made.txt").exists()


async def test_a_rewind_needs_the_token_the_header_the_origin_and_a_post(tmp_path):
    async with served(tmp_path) as (agent, client):
        await shell(agent.run("r"), "echo after > kept.txt")
        url = "/runs/r/calls/1/rewind"
        no_header = await client.post(url, headers=AUTH)
        assert (no_header.status_code, no_header.json()) == (403, {"error": NO_HEADER})
        assert (await client.post(url, headers=REWIND)).status_code == 401
        other_site = await client.post(url, headers={**AUTH, **REWIND, "origin": "http://127.0.0.1:9999"})
        assert other_site.status_code == 403
        form = await client.post(url, headers={**AUTH, "origin": "null"})  # another page's form, no-referrer
        assert form.status_code == 403
        assert (await client.get(url, headers={**AUTH, **REWIND})).status_code == 405
        assert (tmp_path / "home" / "kept.txt").read_text() == "after\n"  # none of them rewound
        login = await client.get(f"/runs/r?token={TOKEN}")  # the browser's session, as the button sends it
        assert login.status_code == 303
        mine = await client.post(url, headers={**REWIND, "origin": BASE})
        assert mine.status_code == 200 and mine.json()["text"].startswith("rewound run r to before call 1 ")
        assert (tmp_path / "home" / "kept.txt").read_text() == "before\n"


async def test_what_cannot_be_rewound_is_one_line(tmp_path):
    async with served(tmp_path) as (agent, client):
        run = agent.run("r")
        await shell(run, "true")
        await run.call("file_read", {"path": "kept.txt"})
        headers = {**AUTH, **REWIND}
        none_before = await client.post("/runs/r/calls/2/rewind", headers=headers)
        assert none_before.status_code == 400
        assert none_before.json()["error"].startswith("no checkpoint before call 2 of run r is kept")
        assert "\n" not in none_before.json()["error"]
        for url in ("/runs/r/calls/9/rewind", "/runs/nowhere/calls/1/rewind", "/runs/r/calls/99999999999/rewind"):
            missing = await client.post(url, headers=headers)
            assert missing.status_code == 404 and missing.json()["error"].startswith("no call "), url


async def test_the_button_is_absent_when_the_app_serves_no_rewind(tmp_path):
    from guilds.toolbox.log_reading import log_reading
    from guilds.web import create_app
    from guilds.web.logs import HelperLogReader

    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env={}) as agent:
        await shell(agent.run("r"), "true")
        tb = agent.toolbox
        app = create_app(tb.store, redactor=tb.redactor, logs=HelperLogReader(log_reading(tb)), lock=LOCK)
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url=BASE) as client:
            assert "checkpoint " in rows_of((await client.get("/runs/r", headers=AUTH)).text)["1"]
            assert "button" not in rows_of((await client.get("/runs/r", headers=AUTH)).text)["1"]
            assert (await client.post("/runs/r/calls/1/rewind", headers={**AUTH, **REWIND})).status_code == 404


@pytest.mark.parametrize("removed", [False, True])
async def test_an_agent_made_on_demand_is_rewound_through_its_own_checkpoints(tmp_path, removed):
    async with served(tmp_path, with_agents=True) as (agent, client):
        made = await agent.make_agent(owner="alice")
        run = made.run("m")
        await shell(run, "echo changed > kept.txt")
        home = Path(made.record.home)
        assert (home / "kept.txt").read_text() == "changed\n"
        if removed:
            await agent.remove_agent(made.id)
        answer = await client.post("/runs/m/calls/1/rewind", headers={**AUTH, **REWIND})
        if removed:
            assert answer.status_code == 400 and "\n" not in answer.json()["error"]
            assert made.id in answer.json()["error"]
        else:
            assert answer.status_code == 200, answer.text
            assert (home / "kept.txt").read_text() == "before\n"
            assert (tmp_path / "home" / "kept.txt").read_text() == "before\n"  # the server's own is untouched


@pytest.mark.slow
async def test_the_button_rewinds_in_a_real_browser(tmp_path):
    """Chromium as the app serves it (no-referrer pages, the login's strict cookie): the button's
    request carries the page's own origin and the header, and its line shows in the row."""
    e2e = pytest.importorskip("test_web_e2e")
    if not Path(e2e.CHROMIUM).exists():
        pytest.skip(f"{e2e.CHROMIUM} is not installed")
    async with served(tmp_path) as (agent, _):
        await shell(agent.run("r"), "echo after > kept.txt")
        app = build_app(agent.settings, agent.toolbox.store, agent.toolbox, lock=LOCK)
        server, task, base = await e2e.start_server(app)
        problems: list[str] = []
        try:
            async with e2e.playwright_api.async_playwright() as p:
                browser = await p.chromium.launch(executable_path=e2e.CHROMIUM, args=e2e.CHROMIUM_ARGS)
                page = await browser.new_page()
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                dialogs: list[str] = []

                async def accept(dialog) -> None:
                    dialogs.append(dialog.message)
                    await dialog.accept()

                page.on("dialog", accept)
                await page.goto(f"{base}/runs/r?token={TOKEN}")
                await page.locator("#call-1 button.rewind").click()
                await e2e.expect(page.locator("#call-1 .rewound")).to_contain_text("rewound run r to before call 1 (")
                await browser.close()
        finally:
            server.should_exit = True
            await task
        assert dialogs and dialogs[0].startswith("Put the files back as they were before call 1?")
        assert (tmp_path / "home" / "kept.txt").read_text() == "before\n" and not problems
