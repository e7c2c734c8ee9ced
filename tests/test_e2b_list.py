"""``Sandbox.list`` through the unmodified E2B Python SDK against a real `guilds serve --e2b`: paged,
ordered and filtered as E2B's API pages, orders and filters (local backend: these are the control
plane's answers, the same on every backend)."""

from __future__ import annotations

import base64
import secrets
from datetime import timedelta

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from e2b_kit import E2BServer, e2b_server
from guilds.limits import E2B_LIST_MAX_LIMIT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-list"), "local") as served:
        yield served


@pytest.fixture(scope="module")
def three(server: E2BServer):
    """Three sandboxes of one tag, made one after another; the middle one paused."""
    tag = secrets.token_hex(4)
    env = server.env()
    made = [Sandbox.create(metadata={"tag": tag, "odd": "a&b=c %d"}, timeout=300, api_key=env["E2B_API_KEY"],
                           api_url=env["E2B_API_URL"], sandbox_url=env["E2B_SANDBOX_URL"]) for _ in range(3)]
    made[1].beta_pause()
    yield tag, made
    for box in made:
        box.kill()


@pytest.fixture
def sdk(server: E2BServer, monkeypatch):
    server.export(monkeypatch)
    return server


def _ids(paginator) -> list[list[str]]:
    pages = []
    while paginator.has_next:
        pages.append([box.sandbox_id for box in paginator.next_items()])
    return pages


def _get(server: E2BServer, **params) -> httpx.Response:
    return httpx.get(f"{server.url}/v2/sandboxes", params=params, headers={"X-API-KEY": server.key})


def test_newest_first_or_oldest_first_paged_one_at_a_time(sdk, three):
    tag, made = three
    ids = [box.sandbox_id for box in made]
    query = SandboxQuery(metadata={"tag": tag})
    assert _ids(Sandbox.list(query=query)) == [ids[::-1]]
    assert _ids(Sandbox.list(query=query, order="asc")) == [ids]
    assert _ids(Sandbox.list(query=query, limit=1)) == [[i] for i in ids[::-1]]
    assert _ids(Sandbox.list(query=query, limit=2, order="asc")) == [ids[:2], ids[2:]]
    last = Sandbox.list(query=query, limit=3)
    last.next_items()
    assert last.has_next is False and last.next_token is None


def test_states_filter_and_page_together(sdk, three):
    tag, made = three
    query = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED])
    listed = Sandbox.list(query=query).next_items()
    assert [(b.sandbox_id, b.state) for b in listed] == [(made[1].sandbox_id, SandboxState.PAUSED)]
    running = SandboxQuery(metadata={"tag": tag}, state=[SandboxState.RUNNING])
    assert _ids(Sandbox.list(query=running, limit=1)) == [[made[2].sandbox_id], [made[0].sandbox_id]]
    answer = _get(sdk, metadata=f"tag={tag}", state="running,paused")
    assert answer.headers["X-Total-Running"] == "2" and len(answer.json()) == 3
    assert "X-Total-Running" not in _get(sdk, metadata=f"tag={tag}", state="paused").headers


def test_started_after_is_inclusive(sdk, three):
    tag, made = three
    started = made[1].get_info().started_at
    ids = [b.sandbox_id for b in Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, started_after=started),
                                              order="asc").next_items()]
    assert ids == [made[1].sandbox_id, made[2].sandbox_id]
    later = SandboxQuery(metadata={"tag": tag}, started_after=started + timedelta(microseconds=1))
    assert [b.sandbox_id for b in Sandbox.list(query=later).next_items()] == [made[2].sandbox_id]


def test_the_template_filter(sdk, three):
    tag, _made = three
    assert len(Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="base")).next_items()) == 3
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="unknown")).next_items() == []
    tagged = _get(sdk, template="base:v1")
    assert tagged.status_code == 400 and "tags are not supported" in tagged.json()["message"]


def test_metadata_with_reserved_characters_matches(sdk, three):
    tag, _made = three
    both = SandboxQuery(metadata={"tag": tag, "odd": "a&b=c %d"})
    assert len(Sandbox.list(query=both).next_items()) == 3
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "odd": "a&b"})).next_items() == []
    assert _get(sdk, metadata="no-pair").status_code == 400


def test_bad_pages_are_refused_with_e2b_errors(sdk, three):
    tag, _ = three
    assert _get(sdk, limit=E2B_LIST_MAX_LIMIT).status_code == 200
    for limit in (0, E2B_LIST_MAX_LIMIT + 1, "x"):
        answer = _get(sdk, limit=limit)
        assert answer.status_code == 400 and answer.json()["message"].startswith("limit:"), limit
    token = _get(sdk, metadata=f"tag={tag}", limit=1).headers["X-Next-Token"]
    assert base64.urlsafe_b64decode(token).decode().count("__") == 1  # E2B's descending token
    crossed = _get(sdk, metadata=f"tag={tag}", limit=1, order="asc", nextToken=token)
    assert crossed.status_code == 400 and "different sort order" in crossed.json()["message"]
    assert _get(sdk, nextToken="not a token").status_code == 400
    assert _get(sdk, order="sideways").json() == {"code": 400,
                                                  "message": "Invalid order parameter: unknown order 'sideways'"}
    assert _get(sdk, state="running,gone").status_code == 400
    assert _get(sdk, startedAfter="yesterday").status_code == 400


def test_v1_lists_the_running_newest_first(sdk, three):
    tag, made = three
    answer = httpx.get(f"{sdk.url}/sandboxes", params={"metadata": f"tag={tag}"}, headers={"X-API-KEY": sdk.key})
    assert [b["sandboxID"] for b in answer.json()] == [made[2].sandbox_id, made[0].sandbox_id]


def test_another_key_lists_none_of_them(sdk, three):
    tag, _ = three
    answer = httpx.get(f"{sdk.url}/v2/sandboxes", params={"metadata": f"tag={tag}"},
                       headers={"X-API-KEY": sdk.other_key})
    assert answer.status_code == 200 and answer.json() == []
