"""Call keys (``_meta["guilds/call-key"]``): a call sent again with its key, to the same
server or another on the same record, runs once and is answered once. The official
SDK's client over streamable HTTP, two servers of one agent on one record (SQLite, and
PostgreSQL where $GUILDS_TEST_POSTGRES_URL names one); a process that ran a call and
died is another Store on the record whose machine is elsewhere, asked at an address."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import uvicorn

import mcp_kit as kit
from guilds.fronts.mcp_server import CALL_KEY, RUN_KEY
from guilds.record.call_keys import CallKey, KeyHeld
from guilds.record.liveness import ALIVE, GONE, UNKNOWN, probe
from guilds.record.store import Store
from guilds.toolbox.keyed_calls import NOT_SENT, SENT
from guilds.web.health import with_health
from test_mcp_shared_record import PG_URL, RECORDS, agent_server, client, record_url

TOKEN = "k" * 43


@contextlib.asynccontextmanager
async def replicas(tmp_path: Path, backend: str) -> AsyncIterator[tuple[str, str, Store]]:
    """Two servers of one agent on one record: their endpoints, and the first's Store."""
    url, agent = record_url(tmp_path, backend), f"keys-{uuid.uuid4().hex[:8]}"
    async with agent_server(tmp_path / "a", url, agent, TOKEN) as (box, a), \
            agent_server(tmp_path / "b", url, agent, TOKEN) as (_, b):
        yield a, b, box.store


@pytest.fixture(autouse=True)
def folders(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()


async def keyed(endpoint: str, command: str, key: str, **meta: str):
    async with client(endpoint, TOKEN) as c:
        return await c.call_tool("shell", {"command": command}, meta={CALL_KEY: key, **meta})


@pytest.mark.parametrize("backend", RECORDS)
async def test_a_key_sent_again_to_another_server_is_answered_the_first_answer_and_runs_once(tmp_path, backend):
    tokens, key, run = tmp_path / "tokens", uuid.uuid4().hex, f"mcp-{uuid.uuid4().hex}"
    command = f"echo t1 >> {tokens}; echo ran"
    async with replicas(tmp_path, backend) as (a, b, store):
        first = await keyed(a, command, key, **{RUN_KEY: run})
        again = await keyed(b, command, key, **{RUN_KEY: run})
        sessionless = await keyed(b, command, key)  # the server would choose a new run: the key's is the one
        other = await keyed(b, command, uuid.uuid4().hex, **{RUN_KEY: run})
        calls = await store.calls(run)
    assert not first.is_error and kit.text_of(first).startswith("ran"), kit.text_of(first)
    assert kit.text_of(again) == kit.text_of(first) and kit.meta_of(again)["call"] == kit.meta_of(first)["call"]
    assert kit.text_of(sessionless) == kit.run_line(run) + kit.text_of(first)
    assert tokens.read_text() == "t1\nt1\n"  # the first and the one with a new key
    assert [c.status for c in calls] == ["done", "done"] and kit.meta_of(other)["seq"] == 2


@pytest.mark.parametrize("backend", RECORDS)
async def test_one_key_sent_to_two_servers_at_once_makes_one_call(tmp_path, backend):
    tokens, key, run = tmp_path / "tokens", uuid.uuid4().hex, f"mcp-{uuid.uuid4().hex}"
    command = f"sleep 1; echo once >> {tokens}; echo slept"
    async with replicas(tmp_path, backend) as (a, b, store):
        answers = await asyncio.gather(*(keyed(e, command, key, **{RUN_KEY: run}) for e in (a, b, a)))
        calls = await store.calls(run)
    assert len({kit.text_of(answer) for answer in answers}) == 1 and not answers[0].is_error
    assert tokens.read_text() == "once\n" and len(calls) == 1


async def test_a_key_of_another_run_or_not_a_string_is_refused(tmp_path):
    run, later, key = f"mcp-{uuid.uuid4().hex}", f"mcp-{uuid.uuid4().hex}", uuid.uuid4().hex
    async with replicas(tmp_path, "sqlite") as (a, _, store):
        await keyed(a, "true", key, **{RUN_KEY: run})
        await keyed(a, "true", uuid.uuid4().hex, **{RUN_KEY: later})
        reused = await keyed(a, "echo no", key, **{RUN_KEY: later})
        async with client(a, TOKEN) as c:
            bad = await c.call_tool("shell", {"command": "true"}, meta={CALL_KEY: 7})
            long = await c.call_tool("shell", {"command": "true"}, meta={CALL_KEY: "k" * 256})
        assert [c.seq for c in await store.calls(later)] == [1]
    assert reused.is_error and kit.text_of(reused) == (
        f"call key {key!r} names a call of run {run!r}, not {later!r}; a key names one call: "
        "send a new call with a new key")
    assert bad.is_error and kit.text_of(bad).startswith("_meta['guilds/call-key']: must be a string of 1 to 255")
    assert long.is_error and "must be a string" in kit.text_of(long)


@pytest.mark.parametrize("backend", RECORDS)
async def test_the_record_makes_one_call_of_a_key_per_principal(tmp_path, backend):
    url, run = record_url(tmp_path, backend), f"mcp-{uuid.uuid4().hex}"
    async with Store(url) as store:
        begin = {"run_id": run, "agent_id": "keys", "tool": "shell", "args": {}, "started_at": datetime.now(UTC),
                 "budget": 100}
        slot = await store.begin_call(call_id="c1", key=CallKey("p", "k"), **begin)
        with pytest.raises(KeyHeld) as held:
            await store.begin_call(call_id="c2", key=CallKey("p", "k"), **begin)
        other = await store.begin_call(call_id="c3", key=CallKey("q", "k"), **begin)
        assert (held.value.run_id, held.value.seq) == (run, slot.seq)
        assert other.seq == slot.seq + 1  # the refused one took no seq
        found = await store.keyed_call("keys", CallKey("p", "k"))
        assert found is not None and found.call.call_id == "c1" and not found.sent
        assert found.owner is not None and found.owner.id == store.owner.id


# --- a call whose process died, or lives on elsewhere -----------------------------------
@contextlib.asynccontextmanager
async def health_server(owner_id: str) -> AsyncIterator[str]:
    """/healthz of a process whose owner is owner_id, on a free port: its address."""
    async def nothing(scope, receive, send):
        raise AssertionError("only /healthz is asked")

    server = uvicorn.Server(uvicorn.Config(with_health(nothing, _ready, owner_id), host="127.0.0.1", port=0,
                                          log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    assert await kit.wait_for(lambda: server.started or task.done(), 20) and server.started
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def _ready() -> bool:
    return True


def closed_address() -> str:
    """An address where nothing listens (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_the_probe_tells_the_owner_another_process_and_none_apart():
    async with health_server("owner-1") as address:
        assert await probe(address, "owner-1") is ALIVE
        assert await probe(address, "owner-2") is GONE  # a process started since at its address
    assert await probe(address, "owner-1") is GONE  # nothing listens: refused
    with socket.create_server(("127.0.0.1", 0), backlog=1) as silent:  # accepts nothing: no answer
        assert await probe(f"http://127.0.0.1:{silent.getsockname()[1]}", "owner-1", timeout=0.3) is UNKNOWN


def elsewhere(url: str) -> Store:
    """A Store as a server on another machine opens it."""
    store = Store(url)
    store.owner = dataclasses.replace(store.owner, machine="another-machine")
    return store


@contextlib.asynccontextmanager
async def opened(store: Store, address: str) -> AsyncIterator[Store]:
    """store open, saying it answers at address."""
    async with store:
        await store.advertise(address)
        yield store


async def begin_keyed(store: Store, agent: str, run: str, key: str, sent: bool) -> int:
    slot = await store.begin_call(run_id=run, agent_id=agent, tool="shell", args={"command": "sleep 9"},
                                  call_id="c" + uuid.uuid4().hex[:12], started_at=datetime.now(UTC), budget=100,
                                  key=CallKey("", key))
    if sent:
        await store.mark_key_sent(agent, CallKey("", key))
    return slot.seq


@pytest.mark.parametrize("sent", [True, False])
@pytest.mark.parametrize("backend", RECORDS)
async def test_a_key_whose_process_died_is_answered_lost_at_once(tmp_path, backend, sent):
    from toolbox_kit import local_toolbox

    url, run, key, agent = record_url(tmp_path, backend), f"mcp-{uuid.uuid4().hex}", uuid.uuid4().hex, "died"
    async with Store(url) as store, local_toolbox(tmp_path / "a", store, agent={"id": agent}) as toolbox:
        async with opened(elsewhere(url), closed_address()) as dead:
            seq = await begin_keyed(dead, agent, run, key, sent)
            started = asyncio.get_running_loop().time()
            answer = await toolbox.call(run, "shell", {"command": f"echo again >> {tmp_path}/ran"},
                                        key=CallKey("", key))
            took = asyncio.get_running_loop().time() - started
        recorded = await store.call(run, seq)
    assert answer.is_error and answer.text == (
        f"call key {key!r}: lost: the process running this call ended before it finished (it was killed or "
        f"its machine stopped); {SENT if sent else NOT_SENT}")
    assert "\n" not in answer.text and took < 2, took
    assert recorded is not None and recorded.status == "lost" and not (tmp_path / "ran").exists()


@pytest.mark.skipif(not PG_URL, reason="GUILDS_TEST_POSTGRES_URL is not set")
@pytest.mark.postgres
async def test_a_key_whose_call_runs_on_elsewhere_waits_for_its_answer(tmp_path):
    from toolbox_kit import local_toolbox

    run, key, agent = f"mcp-{uuid.uuid4().hex}", uuid.uuid4().hex, "lives"
    async with Store(str(PG_URL)) as store, local_toolbox(tmp_path / "a", store, agent={"id": agent}) as toolbox:
        other = elsewhere(str(PG_URL))
        async with health_server(other.owner.id) as address, opened(other, address):
            seq = await begin_keyed(other, agent, run, key, sent=True)
            waiting = asyncio.ensure_future(toolbox.call(run, "shell", {"command": "true"}, key=CallKey("", key)))
            await asyncio.sleep(1.5)  # asked, alive: it waits
            assert not waiting.done()
            await other.finish_call(run_id=run, seq=seq, text="finished elsewhere\n", is_error=False, meta={},
                                    cut=False, finished_at=datetime.now(UTC), duration_ms=5, row="shell · ok",
                                    remaining=99)
            answer = await asyncio.wait_for(waiting, 5)
    assert not answer.is_error and answer.text == "finished elsewhere\nremaining_tool_calls: 99"
    assert answer.meta["seq"] == seq and answer.meta["run"] == run

