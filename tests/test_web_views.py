"""The app's views as pure functions, tested by tables from the product page's "In the app"."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from guilds.record.agent_listing import AgentListing
from guilds.record.migration import split_answer
from guilds.record.rows import row_text
from guilds.record.values import CallRecord
from guilds.web.agents_view import AgentFilters, ServingAgent, agent_item, agents_page, serving_item
from guilds.web.events import sse_message
from guilds.web.flow import (
    CodeTaskBlock,
    call_path,
    duration_text,
    flow_item,
    flow_page,
    later_page,
    redact_call,
    resume_after,
    runs_href,
    runs_page,
    seq_in_range,
)
from guilds.web.logs import LogExcerpt
from guilds.web.render import json_tree, parse_json
from guilds.web.views import (
    Argument,
    MetaRow,
    arguments_view,
    call_page,
    lines_text,
    log_view,
    metadata_view,
    result_view,
)
from guilds_code.redact import Redactor

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
NO_SECRETS = Redactor([])
"""An agent with no secrets: the views render as they are."""


def record(tool: str, args=None, meta=None, *, text: str = "ok\nremaining_tool_calls: 9", is_error=False,
           status="done", seq=5, duration_ms=12) -> CallRecord:
    """A call as the toolbox records it: its row made by guilds.record.rows when it finished,
    its body and the trailer's count apart."""
    args = {} if args is None else args
    body, remaining = split_answer(text)
    meta = {"call": "c1a2b3", "tool": tool, **(meta or {})}
    done = status == "done"
    return CallRecord(run_id="r1", seq=seq, call_id="c1a2b3", tool=tool, args=args, text=text if done else None,
                      is_error=is_error, meta=meta if done else None, cut=False, counted=True, status=status,
                      started_at=T0, finished_at=T0 if done else None, duration_ms=duration_ms if done else None,
                      row=row_text(tool, args, meta, is_error) if done else None,
                      body=body if done else None, remaining=remaining if done else None)


# The page's "Row reads" table: each call other than code_task is a row with its summary.
ROWS = [
    ("shell", {"command": "make test"}, {"exit_code": 0, "timed_out": False}, "Run make test"),
    ("shell", {"command": "npm run dev", "background": True}, {"background_id": "b1"}, "Start npm run dev"),
    ("shell", {"command": "sleep 900"}, {"exit_code": 124, "timed_out": True}, "Run sleep 900 · timed out"),
    ("shell", {"command": "make test"}, {"exit_code": 2, "timed_out": False}, "Run make test · exit 2"),
    ("shell_status", {}, {}, "List background commands"),
    ("shell_status", {"id": "b1"}, {"state": "running"}, "Check b1"),
    ("shell_status", {"id": "b1", "stop": True}, {"state": "stopping"}, "Stop b1"),
    ("file_read", {"path": "src/app.py"}, {"range": [1, 200]}, "Read src/app.py"),
    ("file_read", {"path": "src/app.py", "offset": 201}, {"range": [201, 400]}, "Read src/app.py from line 201"),
    ("file_read", {"path": "src/app.py"}, {"repeat_of": 4}, "Read src/app.py · unchanged since step 4"),
    ("code_search", {"pattern": "TODO"}, {"matches": 3}, "Search files"),
    ("code_search", {"pattern": "TODO", "mode": "content"}, {}, "Search lines"),
    ("code_search", {"pattern": "TODO", "path": "src"}, {}, "Search files in src"),
]


@pytest.mark.parametrize("tool, args, meta, row", ROWS)
def test_a_flow_row_reads_as_the_page_says(tool, args, meta, row):
    item = flow_item(record(tool, args, meta))
    assert (item.text, item.task, item.state, item.href) == (row, None, "done", "/runs/r1/calls/5")


@pytest.mark.parametrize("tool, args, row", [
    ("shell", {"command": "make test\nmake lint"}, "Run make test"),
    ("shell", {"command": "npm run dev", "background": True}, "Start npm run dev"),
    ("file_read", {"path": "a.py", "offset": 3}, "Read a.py from line 3"),
])
def test_a_running_call_reads_its_arguments_row(tool, args, row):
    item = flow_item(record(tool, args, status="running"))
    assert (item.text, item.state, item.duration) == (row, "running", "")


def test_the_stored_row_is_shown_as_stored():
    stored = replace(record("shell", {"command": "ls"}), row="Run ls · exit 1")
    assert flow_item(stored).text == "Run ls · exit 1"


def test_a_cancelled_call_is_final():
    call = replace(record("shell", {"command": "make"}, is_error=True), status="cancelled")
    assert (flow_item(call).state, flow_item(call).text) == ("cancelled", "Run make · error")
    assert resume_after([call], 4) == 5 and not result_view(call, redactor=NO_SECRETS).running


def test_a_failed_call_is_an_error_row():
    item = flow_item(record("file_read", {"path": "gone.py"}, is_error=True))
    assert (item.text, item.state) == ("Read gone.py · error", "error")


CODE_TASKS = [
    # meta, text, is_error, block
    ({"status": "completed", "diffstat": " app.py | 3 ++-\n 1 file changed", "final_message": "Fixed the bug.",
      "log_path": "/home/agent/.runs/r/c1.log"},
     "done", False, CodeTaskBlock("completed", " app.py | 3 ++-\n 1 file changed", "Fixed the bug.",
                                  "/runs/r1/calls/5/log")),
    ({"status": "timed out", "diffstat": "", "final_message": ""}, "timed out\nremaining_tool_calls: 3", True,
     CodeTaskBlock("timed out", "", "timed out")),
    ({}, "brief: required by code_task\nremaining_tool_calls: 3", True,
     CodeTaskBlock("error", "", "brief: required by code_task")),
]


@pytest.mark.parametrize("meta, text, is_error, block", CODE_TASKS)
def test_a_code_task_is_a_block_of_its_own(meta, text, is_error, block):
    item = flow_item(record("code_task", {"brief": "fix it"}, meta, text=text, is_error=is_error))
    assert item.task == block
    assert item.text.startswith("Code task")


@pytest.mark.parametrize("ms, text", [(None, ""), (0, "0 ms"), (999, "999 ms"), (1234, "1.2 s"), (95_400, "95 s")])
def test_durations(ms, text):
    assert duration_text(ms) == text


# --- Arguments: the call's arguments ------------------------------------------------
ARGUMENTS = [
    ({"command": "ls -la"}, [Argument("command", "ls -la", False)]),
    ({"command": "cd web\nnpm test"}, [Argument("command", "cd web\nnpm test", True)]),
    ({"path": "a.py", "offset": 10, "limit": 50}, [Argument("path", "a.py", False), Argument("offset", "10", False),
                                                    Argument("limit", "50", False)]),
    ({"command": "x", "background": True}, [Argument("command", "x", False), Argument("background", "true", False)]),
    ({"pattern": "a" * 81}, [Argument("pattern", "a" * 81, True)]),
    ({}, []),
    (["not", "an", "object"], [Argument("", '[\n  "not",\n  "an",\n  "object"\n]', True)]),
]


@pytest.mark.parametrize("args, view", ARGUMENTS)
def test_the_arguments_view(args, view):
    assert arguments_view(args) == view


# --- Result: text as Markdown, with Raw for the text as returned; JSON as a tree ---
def test_result_as_markdown():
    view = result_view(record("file_read", text="# Title\n\n- one\n- two\nremaining_tool_calls: 7"),
                       redactor=NO_SECRETS)
    assert view.format == "markdown"
    assert "<h1>Title</h1>" in view.html and "<li>one</li>" in view.html
    assert "remaining_tool_calls" not in view.html and view.trailer == "remaining_tool_calls: 7"
    assert [(s.label, s.active) for s in view.formats] == [("Markdown", True), ("Raw", False)]


def test_result_raw_is_the_text_as_returned():
    text = "# Title\n<b>x</b>\nremaining_tool_calls: 7"
    view = result_view(record("shell", text=text), "raw", redactor=NO_SECRETS)
    assert (view.format, view.raw, view.html, view.tree) == ("raw", text, None, None)
    assert [(s.label, s.href, s.active) for s in view.formats] == [
        ("Markdown", "/runs/r1/calls/5?view=result", False), ("Raw", "/runs/r1/calls/5?view=result&format=raw", True)]


@pytest.mark.parametrize("text, present, absent", [
    ("<script>alert(1)</script>", "&lt;script&gt;", "<script"),
    ("<img src=x onerror=alert(1)>", "&lt;img", "<img"),
    ("[click](javascript:alert(1))", "click", 'href="javascript'),
    ("line one\nline two", "line one<br", None),
    ("| a | b |\n|---|---|\n| 1 | 2 |", "<table>", None),
])
def test_markdown_keeps_raw_html_as_text(text, present, absent):
    html = result_view(record("shell", text=text), redactor=NO_SECRETS).html
    assert present in html
    assert absent is None or absent not in html


def test_a_json_result_is_a_tree():
    view = result_view(record("shell", text='{"a": [1, "x"], "b": null}\nremaining_tool_calls: 3'), redactor=NO_SECRETS)
    assert view.format == "tree" and view.html is None and view.trailer == "remaining_tool_calls: 3"
    assert [(s.label, s.active) for s in view.formats] == [("Tree", True), ("Raw", False)]
    root = view.tree
    assert (root.kind, root.text, [c.key for c in root.children]) == ("object", "{…} 2 keys", ["a", "b"])
    a, b = root.children
    assert (a.text, [(c.key, c.kind, c.text) for c in a.children]) == (
        "[…] 2 items", [("0", "number", "1"), ("1", "string", '"x"')])
    assert (b.kind, b.text) == ("null", "null")


@pytest.mark.parametrize("text, is_json", [
    ('{"a": 1}', True), ("[1, 2]", True), ("  [] ", True), ('"just a string"', False), ("42", False),
    ("[1, 2", False), ('{"a": NaN}', False), ("a.md lines 1–4 of 4", False), ("", False),
])
def test_what_counts_as_a_json_result(text, is_json):
    assert (parse_json(text) is not None) == is_json


@pytest.mark.parametrize("value, text", [({}, "{}"), ([], "[]"), ({"k": 1}, "{…} 1 key"), ([True], "[…] 1 item"),
                                         (True, "true"), ("é", '"é"'), (1.5, "1.5")])
def test_json_tree_labels(value, text):
    assert json_tree(value).text == text


def test_a_running_call_has_no_result_yet():
    view = result_view(record("shell", {"command": "sleep 5"}, status="running"), redactor=NO_SECRETS)
    assert view.running and view.raw == ""


# --- Metadata: the call and the tool, then exit code, Full output log, working
# directory, the file and its lines, Same as step -----------------------------------
LOG = "/home/a/.runs/r1/c1a2b3.log"
METADATA = [
    (
        "shell",
        {"exit_code": 0, "cwd": "/home/a", "timed_out": False},
        [("Call", "c1a2b3", ""), ("Tool", "shell", ""), ("Exit code", "0", ""), ("Working directory", "/home/a", "")],
    ),
    (
        "shell",
        {"exit_code": 2, "cwd": "/home/a/web", "timed_out": False, "log_path": LOG},
        [
            ("Call", "c1a2b3", ""),
            ("Tool", "shell", ""),
            ("Exit code", "2", ""),
            ("Full output log", LOG, "/runs/r1/calls/5/log"),
            ("Working directory", "/home/a/web", ""),
        ],
    ),
    (
        "shell",
        {"exit_code": 124, "cwd": "/home/a", "timed_out": True},
        [
            ("Call", "c1a2b3", ""),
            ("Tool", "shell", ""),
            ("Exit code", "124 (timed out)", ""),
            ("Working directory", "/home/a", ""),
        ],
    ),
    (
        "shell",
        {"background_id": "b1", "log_path": LOG},
        [("Call", "c1a2b3", ""), ("Tool", "shell", ""), ("Full output log", LOG, "/runs/r1/calls/5/log")],
    ),
    (
        "shell_status",
        {"background_id": "b1", "state": "exited 0", "exit_code": 0, "log_path": LOG},
        [
            ("Call", "c1a2b3", ""),
            ("Tool", "shell_status", ""),
            ("Exit code", "0", ""),
            ("Full output log", LOG, "/runs/r1/calls/5/log"),
        ],
    ),
    (
        "file_read",
        {"path": "/home/a/app.py", "range": [1, 200], "lines": 812, "content_hash": "ab"},
        [
            ("Call", "c1a2b3", ""),
            ("Tool", "file_read", ""),
            ("File", "/home/a/app.py", ""),
            ("Lines", "1–200 of 812", ""),
        ],
    ),
    (
        "file_read",
        {"path": "/home/a/app.py", "range": [1, 4], "lines": 4, "repeat_of": 3},
        [
            ("Call", "c1a2b3", ""),
            ("Tool", "file_read", ""),
            ("File", "/home/a/app.py", ""),
            ("Lines", "1–4 of 4", ""),
            ("Same as step", "3", "/runs/r1/calls/3"),
        ],
    ),
    ("code_search", {"matches": 3, "files": 2}, [("Call", "c1a2b3", ""), ("Tool", "code_search", "")]),
]


@pytest.mark.parametrize("tool, meta, rows", METADATA)
def test_the_metadata_view(tool, meta, rows):
    assert [(r.label, r.value, r.href) for r in metadata_view(record(tool, meta=meta))] == rows


def test_only_the_log_opens_a_page_of_its_own():
    rows = metadata_view(record("file_read", meta={"log_path": LOG, "repeat_of": 2}))
    assert [(r.label, r.own_page) for r in rows if r.href] == [("Full output log", True), ("Same as step", False)]


@pytest.mark.parametrize("meta, text", [
    ({"range": [3, 9], "lines": 9}, "3–9 of 9"), ({"range": [3, 9]}, "3–9"), ({"lines": 0}, "0 lines"),
    ({}, ""), ({"range": "1-2"}, ""), ({"range": [True, 2], "lines": 2}, "2 lines"),
])
def test_the_lines_of_a_read(meta, text):
    assert lines_text(meta) == text


def test_a_call_page_shows_one_view_and_the_tabs():
    call = record("shell", {"command": "ls"}, {"exit_code": 0})
    page = call_page(call, "metadata", redactor=NO_SECRETS)
    assert [(t.label, t.href, t.active) for t in page.tabs] == [
        ("Arguments", "/runs/r1/calls/5?view=arguments", False), ("Result", "/runs/r1/calls/5?view=result", False),
        ("Metadata", "/runs/r1/calls/5?view=metadata", True)]
    assert page.metadata[0] == MetaRow("Call", "c1a2b3") and page.result is None and page.arguments is None
    assert call_page(call, redactor=NO_SECRETS).view == "result"
    assert call_page(call, "bogus", redactor=NO_SECRETS).result is not None
    assert call_page(call, "arguments", redactor=NO_SECRETS).arguments == [Argument("command", "ls", False)]


# --- no secret reaches a view ------------------------------------------------------
def test_redact_call_redacts_what_the_record_keeps_as_given():
    secret = "sk-live-0123456789"
    call = replace(record("shell", {"command": f"curl -H 'auth: {secret}' x"}, {"cwd": f"/h/{secret}"},
                          text=f"token {secret}"), row=f"Run curl {secret}")
    clean = redact_call(call, Redactor([secret]))
    assert secret not in repr(clean)
    assert clean.args == {"command": "curl -H 'auth: [REDACTED]' x"} and clean.text == "token [REDACTED]"
    assert redact_call(call, Redactor([])) is call


# --- pages and live updates ------------------------------------------------------------
def calls(*states: str, first: int = 1) -> list[CallRecord]:
    return [record("shell", {"command": "true"}, status=s, seq=first + i) for i, s in enumerate(states)]


@pytest.mark.parametrize("states, after, point", [
    ([], 7, 7), (["done", "done"], 0, 2), (["done", "running", "done"], 0, 1), (["running"], 0, 0),
])
def test_live_updates_resume_after_the_last_final_call(states, after, point):
    assert resume_after(calls(*states, first=after + 1), after) == point


def test_a_flow_page_links_the_page_before_and_where_live_updates_start():
    page = flow_page("r1", calls("done", "running", "done", first=201))
    assert [i.seq for i in page.items] == [201, 202, 203]
    assert page.earlier_href == "/runs/r1/flow?before=201"
    assert page.events_href == "/runs/r1/events?after=201"
    first = flow_page("r1", calls("done", first=1))
    assert (first.earlier_href, first.events_href) == ("", "/runs/r1/events?after=1")
    assert flow_page("r1", []).events_href == "/runs/r1/events?after=0"


def test_a_page_that_stops_before_the_newest_call_links_the_next_and_streams_nothing():
    page = flow_page("r1", calls("done", "done", first=1), more_after=True, start=1)
    assert (page.earlier_href, page.later_href, page.events_href) == ("", "/runs/r1/flow?after=2", "")
    jumped = flow_page("r1", calls("done", first=40), more_after=True, start=40)
    assert (jumped.earlier_href, jumped.later_href) == ("/runs/r1/flow?before=40", "/runs/r1/flow?after=40")
    assert flow_page("r1", [], start=9000).earlier_href == "/runs/r1/flow?before=9000"
    more = later_page("r1", calls("done", "running", first=10), more_after=True)
    assert ([i.seq for i in more.items], more.earlier_href, more.later_href) == ([10, 11], "", "/runs/r1/flow?after=11")
    assert later_page("r1", calls("done", first=10), more_after=False).later_href == ""


@pytest.mark.parametrize("seq, ok", [(0, False), (1, True), (2**63 - 1, True), (2**63, False), (10**20, False)])
def test_seq_in_range(seq, ok):
    assert seq_in_range(seq) is ok


def test_runs_pages():
    page = runs_page([], 0, 50)
    assert (page.items, page.newer_href, page.older_href) == ([], "", "")


def test_call_paths():
    assert call_path("r1", 3) == "/runs/r1/calls/3"
    assert call_path("r1", 3, "result", "raw") == "/runs/r1/calls/3?view=result&format=raw"


@pytest.mark.parametrize("event, data, id, text", [
    ("call", "<li>x</li>", 4, "event: call\nid: 4\ndata: <li>x</li>\n\n"),
    ("call", "a\nb", None, "event: call\ndata: a\ndata: b\n\n"),
])
def test_server_sent_events(event, data, id, text):
    assert sse_message(event, data, id) == text


def test_the_log_view():
    call = record("shell", meta={"log_path": LOG})
    whole = log_view(call, LogExcerpt(LOG, 12, "all of it\n"))
    assert (whole.head, whole.tail, whole.omitted, whole.note) == ("all of it\n", "", "", "The whole log: 12 bytes.")
    cut = log_view(call, LogExcerpt(LOG, 500_000, "start\n", "end\n", 368_928))
    assert cut.omitted == "[… 368928 bytes of the log not shown …]" and cut.tail == "end\n"
    assert cut.back == "/runs/r1/calls/5?view=metadata"
    gone = log_view(call, None, "The log is no longer kept.")
    assert (gone.error, gone.head, gone.path) == ("The log is no longer kept.", "", LOG)


def test_a_secret_used_as_an_argument_name_never_reaches_the_arguments_view():
    secret = "sk-live-0123456789abcdef"
    call = redact_call(record("shell", {"command": "true", secret: "x"}), Redactor([secret]))
    names = [arg.name for arg in call_page(call, "arguments", redactor=NO_SECRETS).arguments]
    assert secret not in names and "[REDACTED]" in names


# --- the Agents page

MADE = AgentListing(id="py-0a1b2c3d4e5f", template="py", owner="e2b:ci", sandbox="bwrap", status="live",
                    created_at=T0, runs=2, last_call_at=T0.replace(minute=30))


@pytest.mark.parametrize("listing, shown", [
    (MADE, ("py", "e2b:ci", "live", "bwrap", "2025-01-02 03:04:05 UTC", "never", "", 2, "2025-01-02 03:30:05 UTC")),
    (replace(MADE, status="removed", expires_at=T0.replace(hour=4), removed_at=T0.replace(hour=5), runs=0,
             last_call_at=None),
     ("py", "e2b:ci", "removed", "bwrap", "2025-01-02 03:04:05 UTC", "2025-01-02 04:04:05 UTC",
      "2025-01-02 05:04:05 UTC", 0, "")),
    (replace(MADE, status="pooled"), ("py", "e2b:ci", "pooled", "bwrap", "2025-01-02 03:04:05 UTC", "never", "", 2,
                                      "2025-01-02 03:30:05 UTC")),
    (AgentListing(id="agent2", template=None, owner=None, sandbox=None, status=None, created_at=T0, runs=1,
                  last_call_at=T0),
     ("", "", "", "", "2025-01-02 03:04:05 UTC", "", "", 1, "2025-01-02 03:04:05 UTC")),
])
def test_an_agent_s_row(listing, shown):
    item = agent_item(listing)
    assert (item.template, item.owner, item.state, item.sandbox, item.made, item.expires, item.removed, item.runs,
            item.last_call) == shown
    assert item.runs_href == f"/?agent={listing.id}" and not item.serving


def test_the_serving_agent_first_on_the_first_page_when_the_filters_keep_it():
    serving = serving_item(ServingAgent("agent1", "docker"), 3, T0)
    assert (serving.template, serving.state, serving.sandbox, serving.owner, serving.made, serving.serving) == (
        "default", "live", "docker", "", "", True)
    listed = [replace(MADE, id=f"py-{n}") for n in range(3)]
    first = agents_page(listed, AgentFilters(), 2, serving=serving, states=["removed", "live"])
    assert [i.id for i in first.items] == ["agent1", "py-0", "py-1"]
    assert (first.newer_href, first.older_href, first.states) == ("", "/agents?offset=2", ["live", "removed"])
    for kept_out in (AgentFilters(owner="alice"), AgentFilters(states=("removed",)), AgentFilters(offset=2)):
        assert "agent1" not in [i.id for i in agents_page(listed, kept_out, 5, serving=serving).items]
    assert agents_page([], AgentFilters(states=("live", "making")), 2, serving=serving).items == [serving]


@pytest.mark.parametrize("filters, offset, href", [
    (AgentFilters(), 0, "/agents"),
    (AgentFilters(owner="a b&c=<d>", states=("live", "x y")), 50, ("/agents?owner=a+b%26c%3D%3Cd%3E&state=live"
                                                                  "&state=x+y&offset=50")),
])
def test_the_agents_pages_keep_their_filters(filters, offset, href):
    assert filters.href(offset) == href
    page = agents_page([MADE] * 3, replace(filters, offset=offset), 2)
    assert page.older_href == filters.href(offset + 2)
    assert page.states == sorted(set(filters.states))


@pytest.mark.parametrize("agent, offset, href", [
    (None, 0, "/"), (None, 50, "/?offset=50"), ("py-1", 0, "/?agent=py-1"), ("a&b", 100, "/?agent=a%26b&offset=100")])
def test_the_runs_list_of_one_agent_keeps_it_in_its_links(agent, offset, href):
    assert runs_href(agent, offset) == href
