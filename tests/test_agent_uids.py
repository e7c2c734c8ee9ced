"""Each agent made on demand runs as a uid of its own (guilds.record.agent_rows, guilds.agents.registry):
the record admits a make only when no running agent holds its uid, makes at once included,
on SQLite and PostgreSQL; a make whose id hashes to a taken uid (or the settings file's own
agent's) draws another id; a record written before uids were kept gets them when opened.
Collisions are forced: the ids are chosen, and their uids mapped by hand."""

from __future__ import annotations

import asyncio
import os
import sqlite3

import pytest
import sqlalchemy as sa

from guilds.agents import registry
from guilds.record.agent_rows import UidTaken
from guilds.record.statements import utc_now
from guilds.record.store import Store
from guilds.sandbox.bwrap.bwrap_argv import agent_uid
from test_agents_on_demand import opened, record_url, server


def agent_row(agent_id: str, uid: int) -> dict:
    return {"id": agent_id, "template": "py", "owner": f"o-{agent_id}", "sandbox": "bwrap",
            "home": f"/h/{agent_id}", "created_at": utc_now(), "expires_at": None, "uid": uid}


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_makes_at_once_with_one_uid_admit_one_and_a_running_agent_s_uid_stays_its_own(tmp_path, backend):
    tag, uid = f"{os.getpid()}-{backend}", 1_500_000_000 + os.getpid()
    async with Store(record_url(backend, tmp_path)) as store:
        tried = await asyncio.gather(*(store.admit_agent(agent_row(f"py-{tag}-{n}", uid), max_total=100,
                                                         max_per_owner=2) for n in range(6)),
                                     return_exceptions=True)
        assert tried.count(None) == 1 and all(isinstance(t, UidTaken) for t in tried if t is not None)
        assert str(next(t for t in tried if t is not None)) == \
            f"uid {uid}: another agent of this data folder runs as it"
        admitted = [a for a in await store.agents() if a.uid == uid]
        assert [a.status for a in admitted] == ["making"]
        for status in ("live", "pooled", "retiring"):  # each status whose sandbox may run keeps the uid
            assert await store.mark_agent(admitted[0].id, status)
            with pytest.raises(UidTaken):
                await store.admit_agent(agent_row(f"py-{tag}-{status}", uid), max_total=100, max_per_owner=2)
        await store.admit_agent(agent_row(f"py-{tag}-other", uid + 1), max_total=100, max_per_owner=2)
        assert await store.mark_agent(admitted[0].id, "removed", utc_now())
        await store.admit_agent(agent_row(f"py-{tag}-again", uid), max_total=100, max_per_owner=2)  # freed
        assert {a.id for a in await store.agents() if a.uid == uid and a.status == "making"} == {f"py-{tag}-again"}
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE agents"))  # the worker's database left as found


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_record_without_uids_gets_those_of_its_agents_not_removed(tmp_path, backend):
    url, tag = record_url(backend, tmp_path), f"{os.getpid()}-{backend}"
    async with Store(url) as store:
        for uid, name in enumerate(("live", "removed")):
            await store.admit_agent(agent_row(f"py-{tag}-{name}", uid), max_total=100, max_per_owner=2)
            await store.mark_agent(f"py-{tag}-{name}", name, utc_now())
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("ALTER TABLE agents DROP COLUMN uid"))  # a record as it was
    async with Store(url) as store:
        uids = {a.id: a.uid for a in await store.agents(statuses=("live", "removed"))}
        assert uids == {f"py-{tag}-live": agent_uid(f"py-{tag}-live"), f"py-{tag}-removed": None}
        with pytest.raises(UidTaken):
            await store.admit_agent(agent_row("py-new", agent_uid(f"py-{tag}-live")), max_total=100, max_per_owner=2)
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE agents"))


def forced(monkeypatch: pytest.MonkeyPatch, uids: dict[str, int]) -> list[str]:
    """Ids drawn in the order of uids (agents' ids: py-*), each running as the uid given; the draws made."""
    drawn: list[str] = []
    order = iter([i for i in uids if i.startswith("py-")])

    def draw(template: str) -> str:
        drawn.append(next(order))
        return drawn[-1]

    monkeypatch.setattr(registry, "new_agent_id", draw)
    monkeypatch.setattr(registry, "agent_uid", uids.__getitem__)
    return drawn


async def test_a_make_draws_another_id_while_its_uid_is_taken_and_never_shares_one(tmp_path, monkeypatch):
    own = 1_500_000_001
    drawn = forced(monkeypatch, {"server1": own, "py-a": own, "py-b": 2, "py-c": 2, "py-d": 3,
                                 **{f"py-x{n}": 3 for n in range(registry.UID_DRAWS)}})
    async with opened(tmp_path, server(tmp_path)) as agent:
        first = await agent.make_agent("py", owner="alice")  # py-a: the settings file's own agent's uid
        second = await agent.make_agent("py", owner="bob")  # py-c: first's
        assert (first.id, second.id, drawn) == ("py-b", "py-d", ["py-a", "py-b", "py-c", "py-d"])
        with pytest.raises(UidTaken, match=f"^template py: no id drawn gave a uid of its own in {registry.UID_DRAWS}"):
            await agent.make_agent("py", owner="carol")  # every draw: second's uid
        assert [(a.id, a.uid) for a in await agent.list_agents()] == [("py-b", 2), ("py-d", 3)]
    assert not any(p.name.startswith("py-x") for p in (tmp_path / "data").rglob("*"))  # nothing of a refused draw
    with sqlite3.connect(tmp_path / "data" / "guilds.db") as conn:
        assert conn.execute("SELECT id, uid FROM agents ORDER BY id").fetchall() == [("py-b", 2), ("py-d", 3)]


async def test_makes_at_once_whose_ids_share_a_uid_end_with_uids_of_their_own(tmp_path, monkeypatch):
    forced(monkeypatch, {"server1": 1, **{f"py-{n}": 10 + n // 2 for n in range(8)}})
    async with opened(tmp_path, server(tmp_path, max=10, per_owner=10)) as agent:
        made = await asyncio.gather(*(agent.make_agent("py", owner="alice") for _ in range(4)))
        uids = [m.record.uid for m in made]
        assert sorted(uids) == [10, 11, 12, 13]


async def test_a_fork_whose_drawn_ids_share_a_uid_admits_its_children_one_by_one_each_with_its_own(
        tmp_path, monkeypatch):
    from guilds.agents import fork

    drawn = forced(monkeypatch, {"server1": 1, "py-src": 5, "py-a": 6, "py-b": 6, "py-c": 5,
                                 "py-d": 7, "py-e": 7, "py-f": 8, "py-g": 9})
    monkeypatch.setattr(fork, "new_agent_id", registry.new_agent_id)  # the draw forced() set
    async with opened(tmp_path, server(tmp_path, max=10, per_owner=10)) as agent:
        source = await agent.make_agent("py", owner="alice")
        done = await agent.fork(source.id, 3)  # drawn at once: py-b shares py-a's uid, py-c the source's
        assert [(c.record.id, c.record.uid) for c in done.agents] == [("py-d", 7), ("py-f", 8), ("py-g", 9)]
        assert drawn == ["py-src", "py-a", "py-b", "py-c", "py-d", "py-e", "py-f", "py-g"]
        assert sorted((a.id, a.uid) for a in await agent.list_agents()) == \
            [("py-d", 7), ("py-f", 8), ("py-g", 9), ("py-src", 5)]
    assert not any(p.name in ("py-a", "py-b", "py-c", "py-e") for p in (tmp_path / "data").rglob("*"))
    with sqlite3.connect(tmp_path / "data" / "guilds.db") as conn:
        assert {row[0] for row in conn.execute("SELECT id FROM agents")} == {"py-src", "py-d", "py-f", "py-g"}
