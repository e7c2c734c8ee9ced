"""E2B snapshots and fork (guilds.fronts.e2b.forks), through the unmodified E2B Python SDK
against a real `guilds serve --e2b` on bwrap and docker: a snapshot keeps a sandbox's files
(written before it, never after), a sandbox made from it starts with them, outlives its
source, its deletion and the server's restart; a fork's children start as the source is
now, apart from each other and from the source, with no process of it, and live on when the
source is killed; the caps refuse a fork past them whole; one key never sees another's."""

from __future__ import annotations

import json
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException, SandboxNotFoundException

from conftest import sized_tmpfs
from e2b_kit import E2BServer, e2b_server, home_of
from guilds.fronts.e2b.connect import ConnectError
from guilds.fronts.e2b.forks import Forks
from guilds.fronts.e2b.snapshots import ABOUT, FOLDER, Snapshot, Snapshots
from guilds.limits import E2B_FORK_DEFAULT_TIMEOUT_SECONDS, E2B_MAX_SNAPSHOTS, E2B_SNAPSHOTS_PAGE, FORK_MAX_CHILDREN
from guilds.record.agent_rows import LIVE
from guilds.record.statements import utc_now
from guilds.record.store import Store

FILE_BACKENDS = ("bwrap", "docker")
"""The backends whose homes are on this machine and that isolate a sandbox's processes."""
PER_KEY = 4
"""agents.max_per_owner of the server: a key's sandboxes, a fork's source and children counted."""


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"e2b-snap-{backend}")
    (folder / "home").mkdir()
    (folder / "home" / "from-template.txt").write_text("template\n")
    with e2b_server(folder, backend, f"[agents]\nmax_per_owner = {PER_KEY}\nmax = 8\n") as served:
        yield served


@pytest.fixture
def env(server: E2BServer, monkeypatch):
    server.export(monkeypatch)


@pytest.fixture
def source(env):
    box = Sandbox.create(timeout=120, envs={"FROM_CREATE": "carried"}, metadata={"role": "source"})
    yield box
    box.kill()


def _tree(box: Sandbox) -> str:
    """Each path under the home with its kind, mode and a link's target or a file's digest."""
    return box.commands.run("find . -path ./.cache -prune -o -printf '%p %y %m %l\\n' | sort; "
                            "find . -type f -not -path './.cache/*' -exec md5sum {} + | sort").stdout


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_a_sandbox_made_from_a_snapshot_has_what_was_written_before_it_never_after(server, source):
    source.files.write("app/config.json", '{"env": "test"}')
    source.commands.run("printf '#!/bin/sh\\necho run\\n' > app/run.sh && chmod 750 app/run.sh && "
                        "ln -s config.json app/current && mkdir -m 711 app/empty")
    before = _tree(source)
    snapshot = source.create_snapshot()
    assert snapshot.snapshot_id.endswith(":default") and snapshot.names == []
    source.files.write("app/config.json", "changed after")
    source.files.write("after.txt", "after the snapshot")
    made = Sandbox.create(snapshot.snapshot_id, timeout=120)
    try:
        assert _tree(made) == before  # kinds, modes, links and contents as they were
        assert made.files.read("app/config.json") == '{"env": "test"}'
        assert not made.files.exists("after.txt")
        assert made.commands.run("./app/run.sh").stdout == "run\n"
        assert made.get_info().template_id == snapshot.snapshot_id
        kept = server.data / FOLDER
        tries = made.commands.run(f"cat {kept}/*/{ABOUT}; ls -R {kept}; rm -rf {kept}/*; "
                                  f"cat /proc/1/root{kept}/*/{ABOUT}; echo end", timeout=30)
        assert tries.stdout.endswith("end\n") and '"raw"' not in tries.stdout and "index.json" not in tries.stdout
        assert len(list(kept.iterdir())) == 1  # out of every sandbox's reach
        made.files.write("from-made.txt", "made's own")
        made.files.write("app/config.json", "made's config")  # a file of the snapshot, written over
        made.commands.run("echo more >> app/run.sh && rm app/current")
        assert not source.files.exists("from-made.txt")
        assert made.files.read("app/config.json") == "made's config"
        assert source.files.read("app/config.json") == "changed after"
        source.kill()  # a snapshot outlives its sandbox
        again = Sandbox.create(snapshot.snapshot_id, timeout=120)
        assert _tree(again) == before  # nothing of made's writes
        again.kill()
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True
        assert made.files.read("app/config.json") == "made's config"  # made's files are its own
        assert made.files.read("app/empty/../run.sh").endswith("run\nmore\n")
        with pytest.raises(SandboxException, match=rf"^404: template '{snapshot.snapshot_id}' not found"):
            Sandbox.create(snapshot.snapshot_id, timeout=60)
    finally:
        made.kill()
    assert not list((server.data / FOLDER).iterdir())


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_a_named_snapshot_is_named_by_its_name_and_a_new_one_of_that_name_replaces_it(server, source):
    name = f"snap-{secrets.token_hex(3)}"
    source.files.write("v.txt", "one")
    first = source.create_snapshot(name=name)
    assert (first.snapshot_id, first.names) == (f"default/{name}:default", [f"default/{name}:default"])
    source.files.write("v.txt", "two")
    second = Sandbox.create_snapshot(source.sandbox_id, name=name)
    assert second.snapshot_id == first.snapshot_id
    assert [s.snapshot_id for s in Sandbox.list_snapshots(name=name).next_items()] == [first.snapshot_id]
    for ref in (name, f"{name}:default", f"default/{name}", first.snapshot_id):
        made = Sandbox.create(ref, timeout=60)
        assert made.files.read("v.txt") == "two"
        made.kill()
    for wrong in (f"{name}:v1", f"ci/{name}", f"{name}x"):
        with pytest.raises(SandboxException, match=r"^404: template"):
            Sandbox.create(wrong, timeout=60)
    with pytest.raises(SandboxException, match=r"^400: name: 'base' is a template's id on this server"):
        source.create_snapshot(name="base")
    with pytest.raises(SandboxException, match=r"^400: name: letters, digits"):
        source.create_snapshot(name="a/b")
    assert Sandbox.delete_snapshot(name) is True
    assert Sandbox.delete_snapshot(name) is False
    templates = httpx.delete(f"{server.url}/templates/base", headers={"X-API-KEY": server.key})
    assert templates.status_code == 501 and "this template request is not supported" in templates.json()["message"]


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_snapshots_are_listed_by_sandbox_and_name_page_by_page_and_never_to_another_key(server, source):
    other = Sandbox.create(timeout=60)
    try:
        taken = [source.create_snapshot().snapshot_id for _ in range(4)] + [other.create_snapshot().snapshot_id]
        pages, paginator = [], Sandbox.list_snapshots(limit=2)
        while paginator.has_next:
            pages.append([s.snapshot_id for s in paginator.next_items()])
        assert [len(p) for p in pages] == [2, 2, 1] and [i for p in pages for i in p] == taken  # oldest first
        assert [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()] == taken[:4]
        assert [s.snapshot_id for s in source.list_snapshots().next_items()] == taken[:4]
        assert Sandbox.list_snapshots(name="nothing-of-that-name").next_items() == []
        assert Sandbox.list_snapshots(api_key=server.other_key).next_items() == []
        hidden = taken[0]
        assert Sandbox.delete_snapshot(hidden, api_key=server.other_key) is False
        with pytest.raises(SandboxException, match=r"^404: template"):
            Sandbox.create(hidden, timeout=60, api_key=server.other_key)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.create_snapshot(source.sandbox_id, api_key=server.other_key)
        keyed = {"X-API-KEY": server.key}
        for query, why in (({"limit": "0"}, "limit"), ({"limit": str(E2B_SNAPSHOTS_PAGE + 1)}, "limit"),
                           ({"nextToken": "x"}, "nextToken")):
            answer = httpx.get(f"{server.url}/snapshots", params=query, headers=keyed)
            assert answer.status_code == 400 and answer.json()["message"].startswith(f"{why}: "), answer.text
        for snapshot_id in taken:
            assert Sandbox.delete_snapshot(snapshot_id) is True
    finally:
        other.kill()


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_fork_children_start_as_the_source_is_now_apart_and_live_on_past_its_kill(server, source):
    source.files.write("state.txt", "before fork")
    source.commands.run("sleep 300", background=True)
    children = source.fork(count=2, timeout=120)
    assert all(isinstance(c, Sandbox) for c in children)
    one, two = children
    try:
        assert len({source.sandbox_id, one.sandbox_id, two.sandbox_id}) == 3
        for child in (one, two):
            assert child.is_running() and child.files.read("state.txt") == "before fork"
            assert child.files.read("from-template.txt") == "template\n"
            assert child.commands.run("echo $FROM_CREATE").stdout == "carried\n"
            assert child.get_info().metadata == {"role": "source"}
            assert child.commands.list() == []  # no process of the source is forked
        assert len(source.commands.list()) == 1  # the source's runs on
        one.files.write("state.txt", "one's")
        two.files.write("state.txt", "two's")
        source.files.write("state.txt", "source's")
        assert [b.files.read("state.txt") for b in (source, one, two)] == ["source's", "one's", "two's"]
        source.kill()
        assert one.commands.run("cat state.txt").stdout == "one's" and two.files.read("state.txt") == "two's"
        with pytest.raises(SandboxNotFoundException):
            source.fork()
    finally:
        one.kill()
        two.kill()


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_a_kill_during_a_fork_waits_for_its_children_which_are_whole(server, source):
    source.files.write("state.txt", "whole")
    with ThreadPoolExecutor(2) as pool:
        forking = pool.submit(source.fork, count=2, timeout=60)
        time.sleep(0.05)
        killing = pool.submit(source.kill)
        children = forking.result(timeout=120) if forking.exception(timeout=120) is None else forking.exception()
        assert killing.result(timeout=120) is True
    if isinstance(children, SandboxNotFoundException):  # the kill came first: nothing was forked
        assert Sandbox.list().next_items() == []
        return
    try:
        assert all(c.files.read("state.txt") == "whole" for c in children)  # type: ignore[union-attr]
        wanted = sorted(home_of(c, server.data).name for c in children)  # type: ignore[arg-type]
        deadline = time.monotonic() + 30  # a killed sandbox's files are removed after the kill's answer
        while (homes := sorted(p.name for p in (server.data / "agent-homes").iterdir())) != wanted \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert homes == wanted
    finally:
        for child in children:  # type: ignore[union-attr]
            child.kill()


@pytest.mark.slow
@pytest.mark.backends(*FILE_BACKENDS)
def test_a_fork_past_the_key_s_cap_makes_none_and_bad_counts_are_refused(server, source):
    refused = source.fork(count=PER_KEY)  # the source and PER_KEY children: one past the cap
    assert len(refused) == PER_KEY and all(isinstance(r, RateLimitException) for r in refused)
    assert re.search(r"sandbox limit reached: .*agents\.max_per_owner", str(refused[0]))
    assert [b.sandbox_id for b in Sandbox.list().next_items()] == [source.sandbox_id]
    children = source.fork(count=PER_KEY - 1, timeout=60)  # at the cap
    try:
        assert all(isinstance(c, Sandbox) for c in children) and len(children) == PER_KEY - 1
    finally:
        for child in children:
            child.kill()
    keyed = {"X-API-KEY": server.key}
    for count in (0, FORK_MAX_CHILDREN + 1, "2", True):
        answer = httpx.post(f"{server.url}/sandboxes/{source.sandbox_id}/fork", json={"count": count}, headers=keyed)
        assert (answer.status_code, answer.json()["message"]) == (
            400, f"count: the number of sandboxes to fork, 1 to {FORK_MAX_CHILDREN}")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(source.sandbox_id, api_key=server.other_key)
    bare = httpx.post(f"{server.url}/sandboxes/{source.sandbox_id}/fork", json={}, headers=keyed)  # E2B's defaults
    assert bare.status_code == 201 and len(bare.json()) == 1
    child = Sandbox.get_info(bare.json()[0]["sandbox"]["sandboxID"])
    assert abs((child.end_at - child.started_at).total_seconds() - E2B_FORK_DEFAULT_TIMEOUT_SECONDS) < 5
    Sandbox.kill(child.sandbox_id)


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_a_key_keeps_at_most_its_snapshots_and_they_outlive_the_server(backend, tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    with e2b_server(tmp_path, backend) as server:
        server.export(monkeypatch)
        box = Sandbox.create(timeout=120)
        box.files.write("kept.txt", "kept")
        url, keyed = f"{server.url}/sandboxes/{box.sandbox_id}/snapshots", {"X-API-KEY": server.key}
        for _ in range(E2B_MAX_SNAPSHOTS - 1):
            assert httpx.post(url, json={}, headers=keyed).status_code == 201
        last = box.create_snapshot(name="last")  # at the cap
        with pytest.raises(RateLimitException, match=f"snapshot limit reached: key 'default' holds "
                                                     f"{E2B_MAX_SNAPSHOTS} snapshots; delete one first"):
            box.create_snapshot()
        assert box.create_snapshot(name="last").snapshot_id == last.snapshot_id  # a replacement adds none
    with e2b_server(tmp_path, backend) as again:  # the same data folder, a new server
        again.export(monkeypatch)
        made = Sandbox.create(last.snapshot_id, timeout=60)
        assert made.files.read("kept.txt") == "kept"
        made.kill()


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_a_full_disk_refuses_a_snapshot_in_one_line_and_keeps_the_others_whole(backend, tmp_path, monkeypatch):
    """On bwrap a snapshot of the sandbox's overlay home is a layer under agent-layers: the full disk is there."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "t.txt").write_text("template")
    layers = tmp_path / "data" / "agent-layers"
    layers.mkdir(parents=True, mode=0o700)
    (tmp_path / "data").chmod(0o700)
    with sized_tmpfs(layers, "256k"), e2b_server(tmp_path, backend) as server:
        server.export(monkeypatch)
        box = Sandbox.create(timeout=120)
        try:
            box.files.write("small.txt", "small")
            first = box.create_snapshot()
            frozen = sorted(layers.glob("fork-*"))
            assert len(frozen) == 1
            box.commands.run("head -c 600000 /dev/urandom > big")
            with pytest.raises(SandboxException, match=r"^500: the snapshot could not be taken: cannot copy \S+ to "
                                                       r"\S+: .*No space left on device$"):
                box.create_snapshot()
            assert [s.snapshot_id for s in Sandbox.list_snapshots().next_items()] == [first.snapshot_id]
            assert len(list((server.data / FOLDER).iterdir())) == 1  # nothing of the refused one
            assert sorted(p for p in layers.iterdir() if "fork-" in p.name) == frozen
            made = Sandbox.create(first.snapshot_id, timeout=60)
            assert made.files.read("small.txt") == "small" and not made.files.exists("big")
            made.kill()
            assert box.commands.run("echo still").stdout == "still\n"
        finally:
            box.kill()


def test_a_snapshot_is_named_by_its_id_name_key_part_and_tag_only():
    named = Snapshot(raw="ab12", key_name="ci", name="snap", sandbox_id="i1", agent_id="a-1", template="default",
                     point="k1", at=1.0)
    assert named.id == "ci/snap:default"
    assert [ref for ref in ("snap", "snap:default", "ci/snap", "ci/snap:default", "ab12", "ab12:default",
                            "ci/ab12", "default/snap", "snap:v1", "sna", "x/ci/snap") if named.named_by(ref)] == [
        "snap", "snap:default", "ci/snap", "ci/snap:default", "ab12", "ab12:default", "ci/ab12"]
    bare = Snapshot(raw="cd34", key_name="ci", name=None, sandbox_id="i1", agent_id="a-1", template="default",
                    point="k1", at=1.0)
    assert (bare.id, bare.info()) == ("cd34:default", {"snapshotID": "cd34:default", "names": []})


def test_a_take_cut_short_is_removed_when_the_snapshots_are_read_back(tmp_path: Path):
    kept = Snapshot(raw="ab12", key_name="ci", name=None, sandbox_id="i1", agent_id="a-1", template="default",
                    point="k1", at=1.0)
    folder = tmp_path / FOLDER
    (folder / "ab12").mkdir(parents=True)
    (folder / "ab12" / ABOUT).write_text(json.dumps(kept.__dict__))
    (folder / "cut" / "points").mkdir(parents=True)  # no about.json: its take never ended
    (folder / "bad").mkdir()
    (folder / "bad" / ABOUT).write_text('{"raw": "bad"}')
    snapshots = Snapshots.open(tmp_path)
    assert snapshots.of_key("ci") == [kept]
    assert sorted(p.name for p in folder.iterdir()) == ["ab12"]


async def test_snapshots_and_fork_are_refused_where_the_sandbox_s_files_are_not_on_this_machine(tmp_path: Path):
    """A kubernetes sandbox's home lives in its pod: 501 naming why, before anything is made."""
    async with Store(f"sqlite:///{tmp_path / 'guilds.db'}") as store:
        row = {"id": "py-0123456789ab", "template": "py", "owner": "e2b:default", "sandbox": "kubernetes",
               "home": "/h/py-0123456789ab", "created_at": utc_now(), "expires_at": None, "uid": 1_600_000_123}
        await store.admit_agent(row, max_total=10, max_per_owner=10)
        await store.mark_agent(row["id"], LIVE)
        agents = SimpleNamespace(store=store, data_dir=tmp_path)
        forks = Forks(SimpleNamespace(agents=agents), Snapshots.open(tmp_path))  # type: ignore[arg-type]
        box = SimpleNamespace(id="i0", agent_id=row["id"], key_name="default")
        for asked in (forks.snapshot(box, None), forks.fork(box, 2, 60)):  # type: ignore[arg-type]
            with pytest.raises(ConnectError) as refused:
                await asked
            assert (refused.value.status, str(refused.value)) == (
                501, ("snapshots and fork are not supported on kubernetes: the sandbox's files are not on this "
                     "server's machine"))
    assert not (tmp_path / FOLDER).exists()
