"""The app's Agents page over a real run record (SQLite, and PostgreSQL where
$GUILDS_TEST_POSTGRES_URL names one): agents made and removed through
``Agents.make`` on the local sandbox (the built helper, real bash), their runs made
through their own toolboxes, the page read through the whole app behind its token."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from html import unescape
from urllib.parse import urlencode

import httpx2
import pytest
import sqlalchemy as sa

from guilds.record.agent_rows import AgentRecord
from guilds.record.schema import agents, runs
from guilds.record.statements import utc_now
from guilds.web import app as web_app
from toolbox_kit import local_toolbox
from web_kit import AUTH, PY_SECRET, AgentsRecord, agents_record

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
EVIL = "<img src=x onerror=alert(1)>&amp;"
"""An owner name holding HTML: the page shows it as text."""


@contextlib.asynccontextmanager
async def client(app: object, headers: dict[str, str] = AUTH) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1",
                                  headers=headers) as c:
        yield c


async def page(app: object, url: str, status: int = 200) -> str:
    async with client(app) as c:
        r = await c.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[:300])
    return r.text


COLUMNS = ["Agent", "Template", "Owner", "State", "Sandbox", "Made", "Expires", "Removed", "Runs", "Last call"]


def rows(html: str) -> dict[str, dict[str, str]]:
    """The page's agents: id -> {column: the text a browser shows}."""
    if '<table class="runs agents">' not in html:
        return {}
    assert re.findall(r"<th>(.*?)</th>", html) == COLUMNS
    found = {}
    for row in re.findall(r'<tr class="agent".*?</tr>', html, re.S):
        cells = [unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        cells[0] = cells[0].removesuffix(" this server's own")
        found[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return found


def when(at) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


async def made_with_runs(rec: AgentsRecord) -> tuple[AgentRecord, AgentRecord, AgentRecord]:
    """alice's agent with two runs, an agent of EVIL expiring in an hour, alice's second one removed."""
    alice = await rec.agents.make("py", owner=rec.owner("alice"))
    tools = await rec.agents.toolbox(alice.id)
    for run in ("a-1", "a-2", "a-2"):
        await tools.call(f"{run}-{rec.tag}", "shell", {"command": "cat README"})
    evil = await rec.agents.make("py", owner=rec.owner(EVIL), expires_in=3600)
    gone = await rec.agents.make("default", owner=rec.owner("alice"))
    await (await rec.agents.toolbox(gone.id)).call(f"g-1-{rec.tag}", "shell", {"command": "true"})
    await rec.agents.remove(gone.id)
    return alice, evil, gone


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_page_lists_every_agent_of_the_record_with_its_fields(tmp_path, backend):
    async with agents_record(tmp_path, backend) as rec:
        await rec.own.call(f"own-{rec.tag}", "shell", {"command": "true"})
        alice, evil, gone = await made_with_runs(rec)
        html = await page(rec.app, "/agents")
        listed = rows(html)
        own = rec.own.settings.id
        mine = [i for i in listed if i in {own, alice.id, evil.id, gone.id}]
        assert mine == [own, gone.id, evil.id, alice.id]  # the serving agent, then newest first
        assert listed[own] == {
            "Agent": own, "Template": "default", "Owner": "", "State": "live", "Sandbox": "local",
            "Made": "", "Expires": "", "Removed": "", "Runs": "1",
            "Last call": when((await rec.store.list_runs(own))[0].updated_at)}
        assert next(iter(listed)) == own
        a_runs = await rec.store.list_runs(alice.id)
        assert listed[alice.id] == {
            "Agent": alice.id, "Template": "py", "Owner": rec.owner("alice"), "State": "live", "Sandbox": "local",
            "Made": when(alice.created_at), "Expires": "never", "Removed": "", "Runs": "2",
            "Last call": when(a_runs[0].updated_at)}
        assert listed[evil.id]["Expires"] == when(evil.expires_at) and listed[evil.id]["Runs"] == "0"
        assert listed[evil.id]["Last call"] == ""
        removed = (await rec.store.agents(agent_id=gone.id, statuses=("removed",)))[0]
        assert (listed[gone.id]["Template"], listed[gone.id]["State"], listed[gone.id]["Removed"],
                listed[gone.id]["Runs"]) == ("default", "removed", when(removed.removed_at), "1")
        assert f'<a href="/?agent={alice.id}">{alice.id}</a>' in html


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_owner_with_html_in_it_is_shown_as_text(tmp_path, backend):
    async with agents_record(tmp_path, backend) as rec:
        evil = await rec.agents.make("py", owner=rec.owner(EVIL))
        html = await page(rec.app, "/agents")
        assert "<img" not in html
        assert f"<td>&lt;img src=x onerror=alert(1)&gt;&amp;amp;-{rec.tag}</td>" in html
        assert rows(html)[evil.id]["Owner"] == rec.owner(EVIL)
        filtered = await page(rec.app, "/agents?" + urlencode({"owner": rec.owner(EVIL)}))
        assert list(rows(filtered)) == [evil.id] and "<img" not in filtered
        assert 'value="&lt;img src=x onerror=alert(1)&gt;&amp;amp;-' in filtered  # the filter's field, escaped


@pytest.mark.parametrize("backend", BACKENDS)
async def test_filters_by_owner_and_by_state(tmp_path, backend):
    async with agents_record(tmp_path, backend) as rec:
        alice, evil, gone = await made_with_runs(rec)
        bob = await rec.agents.make("py", owner=rec.owner("bob"))
        pooled = {"id": f"py-pooled-{rec.tag}", "template": "py", "owner": rec.owner("pool"), "sandbox": "local",
                  "home": str(tmp_path / "pooled"), "created_at": utc_now(), "expires_at": None}
        await rec.store.admit_agent(pooled, max_total=100, max_per_owner=10)
        assert await rec.store.mark_agent(pooled["id"], "pooled")  # a state this page has no word of

        def of(html: str) -> list[str]:
            ours = {rec.own.settings.id, alice.id, evil.id, gone.id, bob.id, pooled["id"]}
            return [i for i in rows(html) if i in ours]

        alices = await page(rec.app, f"/agents?owner={rec.owner('alice')}")
        assert of(alices) == [gone.id, alice.id]  # no serving agent: it has no owner
        assert of(await page(rec.app, f"/agents?owner={rec.owner('alice')}&state=live")) == [alice.id]
        assert of(await page(rec.app, f"/agents?owner={rec.owner('alice')}&state=removed")) == [gone.id]
        live = of(await page(rec.app, "/agents?state=live"))
        assert live == [rec.own.settings.id, bob.id, evil.id, alice.id]
        both = of(await page(rec.app, "/agents?state=live&state=removed&owner=" + rec.owner("alice")))
        assert both == [gone.id, alice.id]
        pool = await page(rec.app, "/agents?state=pooled")
        assert of(pool) == [pooled["id"]] and rows(pool)[pooled["id"]]["State"] == "pooled"
        assert '<option value="pooled" selected>pooled</option>' in pool
        assert of(await page(rec.app, "/agents?owner=nobody-" + rec.tag)) == []
        assert "No agent matches." in await page(rec.app, "/agents?owner=nobody-" + rec.tag)
        unfiltered = await page(rec.app, "/agents?owner=&state=")  # an empty field filters nothing
        assert set(of(unfiltered)) == {rec.own.settings.id, alice.id, evil.id, gone.id, bob.id, pooled["id"]}


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_agent_links_to_its_runs_and_the_runs_show_their_agent(tmp_path, backend):
    async with agents_record(tmp_path, backend) as rec:
        await rec.own.call(f"own-{rec.tag}", "shell", {"command": "true"})
        alice, _, _ = await made_with_runs(rec)
        html = await page(rec.app, f"/?agent={alice.id}")
        assert re.findall(r'<a href="/runs/([^"]+)">', html) == [f"a-2-{rec.tag}", f"a-1-{rec.tag}"]
        assert f"<h1>Runs <small>of agent {alice.id}</small></h1>" in html
        assert html.count(f'<a class="agent" href="/?agent={alice.id}">{alice.id}</a>') == 2
        everyone = await page(rec.app, "/")
        own_run = everyone.split(f'href="/runs/own-{rec.tag}"')[1].split("</tr>")[0]
        assert f'<a class="agent" href="/?agent={rec.own.settings.id}">{rec.own.settings.id}</a>' in own_run
        run = await page(rec.app, f"/runs/a-1-{rec.tag}")
        assert f'agent <a class="agent" href="/?agent={alice.id}">{alice.id}</a>' in run
        assert "No runs of agent nobody" in await page(rec.app, "/?agent=nobody")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_agents_and_an_agent_s_runs_are_paged_keeping_the_filter(tmp_path, backend, monkeypatch):
    async with agents_record(tmp_path, backend) as rec:
        monkeypatch.setattr(web_app, "AGENTS_PAGE", 2)
        monkeypatch.setattr(web_app, "RUNS_PAGE", 2)
        owner = rec.owner("carol")
        made = [await rec.agents.make("py", owner=owner) for _ in range(3)]
        first = await page(rec.app, f"/agents?owner={owner}&state=live")
        assert list(rows(first)) == [made[2].id, made[1].id]
        older = f"/agents?owner={owner}&amp;state=live&amp;offset=2"
        assert f'<a href="{older}">Older</a>' in first and "Newer" not in first
        second = await page(rec.app, unescape(older))
        assert list(rows(second)) == [made[0].id] and "Older" not in second
        assert f'<a href="/agents?owner={owner}&amp;state=live">Newer</a>' in second
        tools = await rec.agents.toolbox(made[0].id)
        for n in range(3):
            await tools.call(f"c-{n}-{rec.tag}", "shell", {"command": "true"})
        runs_first = await page(rec.app, f"/?agent={made[0].id}")
        assert re.findall(r'<a href="/runs/([^"]+)">', runs_first) == [f"c-2-{rec.tag}", f"c-1-{rec.tag}"]
        assert f'<a href="/?agent={made[0].id}&amp;offset=2">Older</a>' in runs_first
        runs_second = await page(rec.app, f"/?agent={made[0].id}&offset=2")
        assert re.findall(r'<a href="/runs/([^"]+)">', runs_second) == [f"c-0-{rec.tag}"]
        assert f'<a href="/?agent={made[0].id}">Newer</a>' in runs_second


async def test_a_bad_filter_is_a_clear_400_and_no_token_is_401(tmp_path):
    async with agents_record(tmp_path) as rec:
        for url, line in ((f"/agents?owner={'o' * 129}", "owner: at most 128 characters, got 129"),
                          (f"/agents?state={'s' * 129}", "state: at most 128 characters, got 129"),
                          (f"/?agent={'a' * 129}", "agent: at most 128 characters, got 129"),
                          ("/agents?offset=x", "not a number: &#39;x&#39;")):
            assert line in await page(rec.app, url, status=400)
        assert "Agents" in await page(rec.app, f"/agents?owner={'o' * 128}")  # at the edge: a filter like any
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            async with client(rec.app, headers) as c:
                for url in ("/agents", "/agents?state=live", f"/?agent={rec.own.settings.id}"):
                    r = await c.get(url)
                    assert r.status_code == 401 and "Agents" not in r.text, url


async def test_an_agent_that_only_runs_name_is_listed_too(tmp_path):
    """A record shared with another settings file: its agent has runs here and no row of its own."""
    async with agents_record(tmp_path) as rec, \
            local_toolbox(tmp_path / "other", rec.store, agent={"id": f"other-{rec.tag}"}) as other:
        await other.call(f"o-1-{rec.tag}", "shell", {"command": "true"})
        first_run = (await rec.store.list_runs(other.settings.id))[0]
        listed = rows(await page(rec.app, "/agents"))
        assert listed[other.settings.id] == {
            "Agent": other.settings.id, "Template": "", "Owner": "", "State": "", "Sandbox": "",
            "Made": when(first_run.created_at), "Expires": "", "Removed": "", "Runs": "1",
            "Last call": when(first_run.updated_at)}
        assert rec.own.settings.id in listed  # no run yet: listed all the same, first
        assert next(iter(listed)) == rec.own.settings.id
        assert other.settings.id not in rows(await page(rec.app, "/agents?state=live"))


async def test_a_made_agent_s_runs_open_with_its_template_s_secrets_redacted_and_its_logs_read(tmp_path):
    async with agents_record(tmp_path) as rec:
        made = await rec.agents.make("py", owner=rec.owner("alice"))
        tools = await rec.agents.toolbox(made.id)
        loud = await tools.call("p-1", "shell", {"command": "for i in $(seq 1 3000); do echo line $i $PY_SECRET; done"})
        assert "bytes elided; full output:" in loud.text
        log = await page(rec.app, "/runs/p-1/calls/1/log")  # read by the made agent's own sandbox
        assert "line 1 [REDACTED]\n" in log and "line 3000 [REDACTED]\n" in log and PY_SECRET not in log
        # a call recorded before the template had its secret: the app redacts it with the template's
        slot = await rec.store.begin_call(run_id="p-old", agent_id=made.id, tool="shell",
                                          args={"command": f"echo {PY_SECRET}"}, call_id="old1",
                                          started_at=utc_now(), budget=10)
        await rec.store.finish_call(run_id="p-old", seq=slot.seq, text=PY_SECRET, is_error=False, meta={},
                                    cut=False, finished_at=utc_now(), duration_ms=1, row=f"Run echo {PY_SECRET}")
        for url in ("/runs/p-old", "/runs/p-old/calls/1?view=arguments", "/runs/p-old/calls/1"):
            shown = await page(rec.app, url)
            assert PY_SECRET not in shown and "[REDACTED]" in shown, url
        await rec.agents.remove(made.id)
        gone = await page(rec.app, "/runs/p-1/calls/1/log")
        assert f"The logs of agent {made.id} are not served here." in gone


async def test_a_page_of_thousands_of_agents_and_runs_loads_quickly(tmp_path):
    """2,000 agents made on demand and 40,000 runs (50 agents only runs name), written straight into
    the tables: a page counts the runs of its own agents alone."""
    async with agents_record(tmp_path) as rec:
        t0 = utc_now()
        made = [{"id": f"py-{n:012x}", "template": "py", "owner": rec.owner(f"o{n % 20}"), "sandbox": "local",
                 "home": f"/h/{n}", "status": ("live", "removed")[n % 2], "created_at": t0 + timedelta(seconds=n)}
                for n in range(2000)]
        named = [f"py-{n:012x}" for n in range(0, 2000, 2)] + [f"only-{n}" for n in range(50)]
        many = [{"id": f"r{n}", "agent_id": named[n % len(named)], "created_at": t0, "updated_at": t0,
                 "next_seq": 1, "used_calls": 1, "admitted_seq": 1} for n in range(40_000)]
        async with rec.store.engine.begin() as conn:
            await conn.execute(sa.insert(agents), made)
            await conn.execute(sa.insert(runs), many)
        for url in ("/agents", "/agents?offset=1900", f"/agents?owner={rec.owner('o4')}&state=live",
                    "/?agent=py-000000000002"):
            started = time.perf_counter()
            await page(rec.app, url)
            assert time.perf_counter() - started < 1.0, url
        first = rows(await page(rec.app, "/agents"))
        assert list(first)[:3] == [rec.own.settings.id, "py-0000000007cf", "py-0000000007ce"]
        assert len(first) == 51 and (first["py-0000000007ce"]["State"], first["py-0000000007ce"]["Runs"]) == (
            "live", str(len(range(999, 40_000, len(named)))))
