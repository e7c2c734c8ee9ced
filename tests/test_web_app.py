"""The app over a real run record, filled through the real toolbox (local sandbox, SQLite)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx2
import pytest
import pytest_asyncio
import uvicorn

from fixtures import secret_forms
from guilds.record.statements import FLOW_PAGE
from guilds.record.values import decision_rows
from web_kit import AUTH, FLOW, FORMS_COMMAND, SECRET, SPLITS_COMMAND, fill, record_code_task, served, shown_text

pytestmark = pytest.mark.asyncio(loop_scope="module")
ROWS = [  # the page's "Row reads", for FLOW
    "Run for i in $(seq 1 3000); do echo line $i $API_KEY; done",
    "Read notes.md",
    "Read notes.md · unchanged since step 2",
    "Run echo &#39;{&#34;ok&#34;: true, &#34;items&#34;: [1, 2]}&#39;",
    "Run echo [REDACTED]; exit 3 · exit 3",
    "Start sleep 0.2",
    "List background commands",
    "Check b1",
    "Search files in notes.md",
    "Code task · error",
    "Run sleep 5 · timed out",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(tmp_path_factory):
    async with served(tmp_path_factory.mktemp("web")) as s:
        yield s


@pytest_asyncio.fixture(loop_scope="module")
async def client(app):
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app.app), base_url="http://127.0.0.1",
                                headers=AUTH) as c:
        yield c


async def get(client, url: str, *, fragment: bool = False, status: int = 200) -> str:
    r = await client.get(url, headers={"HX-Request": "true"} if fragment else {})
    assert r.status_code == status, (url, r.status_code, r.text[:300])
    return r.text


def texts(html: str, css_class: str) -> list[str]:
    return re.findall(rf'<span class="{css_class}">(.*?)</span>', html)


async def test_the_runs_newest_first(app, client):
    await app.toolbox.call("run2", "shell", {"command": "true"})
    html = await get(client, "/")
    assert html.index('href="/runs/run2"') < html.index('href="/runs/run1"')
    assert "<td>11</td>" in html


async def test_a_runs_flow_reads_as_the_page_says(client):
    html = await get(client, "/runs/run1")
    assert texts(html, "text") == ROWS[:9] + ROWS[10:]
    assert '<li id="call-10" class="item task error"' in html and "the agent has no repository" in html
    assert 'class="item row error"' not in html.split('id="call-5"')[1].split("</li>")[0]
    assert 'data-events="/runs/run1/events?after=11"' in html
    assert "Load earlier" not in html


async def test_a_code_task_is_a_block_with_its_status_diffstat_and_final_message(app, client):
    seq = await record_code_task(app.store, "tasks")
    html = await get(client, "/runs/tasks")
    block = html.split(f'<li id="call-{seq}" class="item task done"')[1].split("</li>")[0]
    assert '<span class="status">completed</span>' in block
    assert '<pre class="diffstat"> src/app.py       | 4 +++-' in block and "2 files changed" in block
    assert '<div class="message">Added a test for the empty cart and fixed the total.</div>' in block


async def test_a_call_opens_as_a_fragment_or_as_the_whole_page(client):
    part = await get(client, "/runs/run1/calls/2", fragment=True)
    assert part.startswith('<article class="call" data-seq="2">') and "<html" not in part
    whole = await get(client, "/runs/run1/calls/2")
    assert whole.startswith("<!doctype html>") and 'id="flow"' in whole and '<article class="call"' in whole


async def test_the_result_as_markdown_and_raw(client):
    html = await get(client, "/runs/run1/calls/2", fragment=True)
    assert '<div class="markdown"><p>notes.md lines 1–4 of 4<br' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    raw = await get(client, "/runs/run1/calls/2?view=result&format=raw", fragment=True)
    assert '<pre class="raw">notes.md lines 1–4 of 4\n1  # Notes' in raw
    assert "remaining_tool_calls: 198</pre>" in raw


async def test_a_json_result_as_a_tree(client):
    html = await get(client, "/runs/run1/calls/4", fragment=True)
    assert '<span class="key">items</span>: <span class="size">[…] 2 items</span>' in html
    assert '<span class="boolean">true</span>' in html


async def test_the_metadata_and_same_as_step(client):
    html = await get(client, "/runs/run1/calls/3?view=metadata", fragment=True)
    labels = re.findall(r"<dt>(.*?)</dt>", html)
    assert labels == ["Call", "Tool", "File", "Lines", "Same as step", "Bytes saved by the pointer"]
    assert '<dd><a href="/runs/run1/calls/2">2</a></dd>' in html and "<dd>1–4 of 4</dd>" in html
    shell = await get(client, "/runs/run1/calls/1?view=metadata", fragment=True)
    assert re.findall(r"<dt>(.*?)</dt>", shell) == ["Call", "Tool", "Exit code", "Full output log",
                                                   "Working directory", "Bytes elided", "Secrets redacted"]
    timed_out = await get(client, "/runs/run1/calls/11?view=metadata", fragment=True)
    assert "<dd>124 (timed out)</dd>" in timed_out


async def test_the_arguments_redacted(client):
    html = await get(client, "/runs/run1/calls/5?view=arguments", fragment=True)
    assert "<dt>command</dt>" in html and "<code>echo [REDACTED]; exit 3</code>" in html


async def test_the_full_output_log_through_redaction(app, client):
    result = (await app.store.call("run1", 1)).text
    assert "bytes elided; full output:" in result
    html = await get(client, "/runs/run1/calls/1/log")
    assert "line 1 [REDACTED]\n" in html and "line 3000 [REDACTED]\n" in html
    assert "The whole log:" in html
    await get(client, "/runs/run1/calls/2/log", status=404)


async def test_no_form_of_a_secret_shows_in_the_result_or_the_log(app, client):
    """Markdown undoes re.escape, JSON's \\/ and character references, and joins what emphasis or a
    code span splits: the page shows none of it; nor does the Raw view or the Full output log."""
    forms = await app.toolbox.call("forms", "shell", {"command": FORMS_COMMAND})
    splits = await app.toolbox.call("forms", "shell", {"command": SPLITS_COMMAND})
    assert secret_forms.SECRET not in splits.text and "&#x" in splits.text  # the text holds no one piece
    pages = {}
    for call in (forms, splits):
        seq = call.meta["seq"]
        html = await get(client, f"/runs/forms/calls/{seq}", fragment=True)
        pages[seq] = shown_text(re.search(r'<div class="markdown">(.*?)</div>', html, re.S)[1])
        raw = await get(client, f"/runs/forms/calls/{seq}?view=result&format=raw", fragment=True)
        assert secret_forms.SECRET not in shown_text(raw)
    shown_forms, shown_splits = pages[forms.meta["seq"]], pages[splits.meta["seq"]]
    assert all(line in shown_forms for line in secret_forms.redacted_lines()), shown_forms
    assert shown_splits.count("[REDACTED]") == 4 and secret_forms.SECRET not in shown_splits, shown_splits
    log = shown_text(await get(client, f"/runs/forms/calls/{forms.meta['seq']}/log"))
    assert all(line in log for line in secret_forms.redacted_lines()) and secret_forms.SECRET not in log


async def test_unknown_runs_and_calls(client):
    await get(client, "/runs/nope", status=404)
    await get(client, "/runs/run1/calls/99", status=404)
    await get(client, "/runs/run1/flow?before=x", status=400)


async def test_headers_and_hosts(app, client):
    r = await client.get("/runs/run1")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    refused = await client.get("/", headers={"host": "evil.example"})
    assert refused.status_code == 400
    css = await client.get("/static/app.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    htmx = await client.get("/static/vendor/htmx.min.js")
    assert htmx.status_code == 200 and b"htmx" in htmx.content


async def test_a_thousand_calls_page_and_load_quickly(app, client):
    await fill(app.store, "big", 5000)
    t0 = time.perf_counter()
    html = await get(client, "/runs/big")
    assert time.perf_counter() - t0 < 2.0  # docs/app.md has the figures measured with bench/app_bench.py
    seqs = [int(s) for s in re.findall(r'<li id="call-(\d+)"', html)]
    assert seqs == list(range(5001 - FLOW_PAGE, 5001))
    assert f'hx-get="/runs/big/flow?before={5001 - FLOW_PAGE}"' in html
    earlier = await get(client, f"/runs/big/flow?before={5001 - FLOW_PAGE}", fragment=True)
    assert [int(s) for s in re.findall(r'<li id="call-(\d+)"', earlier)] == list(range(4801 - FLOW_PAGE, 4801))
    first = await get(client, "/runs/big/flow?before=101", fragment=True)
    assert "Load earlier" not in first and len(re.findall(r'<li id="call-', first)) == 100
    t0 = time.perf_counter()
    await get(client, "/runs/big/calls/2500", fragment=True)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("url", [
    "/runs/run1/calls/99999999999999999999", "/runs/run1/calls/9223372036854775808", "/runs/run1/calls/0",
    "/runs/run1/calls/99999999999999999999/log", "/runs/run1/calls/-1", "/runs/run1/calls/1e3",
])
async def test_a_malformed_or_huge_seq_is_404(client, url):
    await get(client, url, status=404)
    await get(client, url, fragment=True, status=404)


@pytest.mark.parametrize("url", ["/runs/run1/flow?before=99999999999999999999",
                                 "/runs/run1/flow?after=99999999999999999999", "/runs/run1?at=99999999999999999999",
                                 "/runs/run1/events?after=99999999999999999999"])
async def test_a_huge_seq_in_a_query_is_a_clear_400(client, url):
    assert "out of range" in await get(client, url, status=400)


async def test_jump_to_the_first_call_and_any_seq_then_load_later(app, client):
    await fill(app.store, "jump", 5000)
    html = await get(client, "/runs/jump?at=1")
    seqs = [int(s) for s in re.findall(r'<li id="call-(\d+)"', html)]
    assert seqs == list(range(1, FLOW_PAGE + 1))
    assert "Load earlier" not in html and f'hx-get="/runs/jump/flow?after={FLOW_PAGE}"' in html
    assert 'data-events=""' in html  # not at the newest call: nothing streams yet
    html = await get(client, "/runs/jump?at=2345")
    assert re.findall(r'<li id="call-(\d+)"', html)[0] == "2345"
    assert 'hx-get="/runs/jump/flow?before=2345"' in html and 'hx-get="/runs/jump/flow?after=2544"' in html
    later = await get(client, "/runs/jump/flow?after=4700", fragment=True)
    assert [int(s) for s in re.findall(r'<li id="call-(\d+)"', later)] == list(range(4701, 4901))
    assert 'hx-get="/runs/jump/flow?after=4900"' in later and "Load earlier" not in later
    last = await get(client, "/runs/jump/flow?after=4900", fragment=True)
    assert len(re.findall(r'<li id="call-', last)) == 100 and "Load later" not in last
    newest = await get(client, "/runs/jump?at=4950")  # on the newest page: that page, live
    assert re.findall(r'<li id="call-(\d+)"', newest)[0] == str(5001 - FLOW_PAGE)
    assert 'data-events="/runs/jump/events?after=5000"' in newest
    opened = await get(client, "/runs/jump/calls/7")  # a call opened by its address: the flow shows it
    assert re.findall(r'<li id="call-(\d+)"', opened)[0] == "7" and '<article class="call" data-seq="7">' in opened
    assert 'hx-get="/runs/jump/flow?before=7"' in opened
    for url in ("/runs/jump?at=x", "/runs/jump/flow?after=x"):
        await get(client, url, status=400)


async def test_the_run_page_keeps_no_history_snapshot_and_tabs_replace_the_address(client):
    html = await get(client, "/runs/run1/calls/1")
    assert 'hx-history="false"' in html
    assert '<nav class="tabs views" role="tablist" hx-replace-url="true">' in html
    assert '<nav class="switch" hx-replace-url="true">' in html


async def test_new_calls_arrive_live(app):
    """Server-sent events over a real server: new calls and a running call's finish, as they land."""
    config = uvicorn.Config(app.app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    events: list[str] = []
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=20, headers=AUTH) as c:
            assert (await c.get("/mcp")).status_code not in (404, 500)  # the MCP endpoint is routed, and runs
            async with c.stream("GET", "/runs/run1/events?after=11") as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                lines = r.aiter_lines()
                call = asyncio.create_task(app.toolbox.call("run1", "shell", {"command": "sleep 1; echo late"}))
                while events.count("") < 3:  # the retry line, then two events
                    events.append(await asyncio.wait_for(anext(lines), 10))
                await call
    finally:
        server.should_exit = True
        await task
    blocks = "\n".join(events).split("\n\n")
    assert blocks[0] == "retry: 1000"
    data = ["\n".join(line[len("data: "):] for line in b.split("\n") if line.startswith("data: ")) for b in blocks[1:3]]
    ids = [line for line in events if line.startswith("id:")]
    assert 'class="item row running"' in data[0] and "Run sleep 1; echo late" in data[0]
    assert 'class="item row done"' in data[1] and 'id="call-12"' in data[1]
    assert ids == ["id: 11", "id: 12"]


async def test_no_secret_reaches_any_page(client):
    pages = [await get(client, "/"), await get(client, "/runs/run1"), await get(client, "/runs/run1/calls/1/log")]
    views = ("view=arguments", "view=result", "view=result&format=raw", "view=metadata")
    pages += [await get(client, f"/runs/run1/calls/{seq}?{query}")
              for seq in range(1, len(FLOW) + 1) for query in views]
    assert not any(SECRET in page for page in pages)
    assert sum("[REDACTED]" in page for page in pages) > 5


async def test_egress_decisions_are_listed_in_the_metadata_and_counted_on_the_run_page(app, client):
    result = await app.toolbox.call("run-egress", "shell", {"command": "true"})
    call = result.meta["call"]
    await app.store.add_egress(decision_rows([
        {"time": 1.0, "host": "github.com", "port": 443, "allowed": True, "reason": "listed",
         "bytes_up": 2150, "bytes_down": 15700, "tag": f"run-egress/{call}"},
        {"time": 2.0, "host": "api.example.com", "port": 443, "allowed": False,
         "reason": "guilds egress: api.example.com:443 is not in agent.network", "tag": f"run-egress/{call}"},
    ], "run-egress", call))
    html = await get(client, f"/runs/run-egress/calls/{result.meta['seq']}?view=metadata", fragment=True)
    assert re.findall(r"<dt>Egress</dt>\s*<dd>(.*?)</dd>", html) == [
        "github.com:443 allowed · 2.1 KB up, 15 KB down",
        "api.example.com:443 refused: guilds egress: api.example.com:443 is not in agent.network"]
    assert "Egress: 1 allowed, 1 refused" in await get(client, "/runs/run-egress")
    assert "Egress:" not in await get(client, "/runs/run1")  # a run without any: as before
