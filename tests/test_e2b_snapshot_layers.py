"""E2B snapshots of overlay homes (guilds.fronts.e2b.snapshots) through the unmodified E2B Python
SDK against a real `guilds serve --e2b` on bwrap: a snapshot keeps what the sandbox changed (its
upper, frozen as one layer) above the layers it stood on, no copy of the template's files; a
sandbox made from it, and a fork of that one, is an overlay over those layers and sees exactly
the files of the snapshot's moment (deletions, folders emptied and made again, renames, modes),
never a later change of the source; a layer stays while a snapshot or a home uses it and is
removed when none does, and a snapshot deleted under a live sandbox leaves that sandbox whole."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from e2b import Sandbox

from e2b_kit import E2BServer, e2b_server, home_of
from guilds.agents import fork_layers
from guilds.agents.home_layers import LAYERS_FOLDER, OVERLAYS_FOLDER
from guilds.fronts.e2b.snapshots import ABOUT, FOLDER, HOLDER_PREFIX, Snapshot, Snapshots

TEMPLATE = {
    "keep.txt": "the template's, never changed\n",
    "gone.txt": "deleted by the sandbox\n",
    "edit.txt": "first line\n",
    "tree/a.txt": "a\n",
    "tree/sub/b.txt": "b\n",
    "moved/x.txt": "x\n",
    "mode.sh": "#!/bin/sh\n",
}
CHANGE = ("rm gone.txt && echo second >> edit.txt && rm -rf tree && mkdir -p tree/other && "
          "echo new > tree/other/n.txt && mv moved renamed && chmod 751 mode.sh && "
          "echo own > own.txt && chmod 600 own.txt && ln -s keep.txt link")
AFTER = ("echo third >> edit.txt && echo later >> own.txt && rm keep.txt renamed/x.txt && touch gone.txt && "
         "rm -rf tree && mkdir tree && echo late > tree/late.txt && chmod 700 mode.sh && echo extra > extra.txt")


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2b-snap-layers")
    for rel, text in TEMPLATE.items():
        (folder / "home" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "home" / rel).write_text(text)
    (folder / "home" / "mode.sh").chmod(0o644)
    with e2b_server(folder, backend, "[agents]\nmax_per_owner = 6\nmax = 8\n") as served:
        yield served


@pytest.fixture
def env(server: E2BServer, monkeypatch):
    server.export(monkeypatch)


def _tree(box: Sandbox) -> str:
    """Each path under the home with its kind, mode and a link's target, and each file's digest."""
    return box.commands.run("find . -path ./.cache -prune -o -printf '%p %y %m %l\\n' | sort; "
                            "find . -type f -not -path './.cache/*' -exec md5sum {} + | sort").stdout


def _kept(server: E2BServer, snapshot_id: str) -> Snapshot:
    raw = snapshot_id.split(":")[0]
    about = json.loads((server.data / FOLDER / raw / ABOUT).read_text())
    return Snapshot(**{**about, "layers": tuple(about["layers"])})


def _layers(server: E2BServer) -> Path:
    return server.data / LAYERS_FOLDER


def _files_in(folder: Path) -> set[str]:
    return {str(Path(where, name).relative_to(folder)) for where, _, names in os.walk(folder) for name in names}


def _gone(path: Path, within: float = 30) -> bool:
    """True once path is removed (a killed sandbox's files go after the kill's answer)."""
    deadline = time.monotonic() + within
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def _stands_on(server: E2BServer, box: Sandbox) -> list[str]:
    """The fork layers the sandbox's home is an overlay over, top first (asserting it is one)."""
    home = home_of(box, server.data)
    assert os.path.ismount(home), f"{home} is not an overlay home"
    return fork_layers.above(server.data / OVERLAYS_FOLDER / home.name)


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_a_snapshot_of_an_overlay_home_is_its_changes_as_a_layer_and_its_sandboxes_see_that_moment(server, env):
    source = Sandbox.create(timeout=120)
    made: list[Sandbox] = []
    try:
        source.commands.run(CHANGE)
        before = _tree(source)
        snapshot = source.create_snapshot()
        kept = _kept(server, snapshot.snapshot_id)
        assert kept.layered and len(kept.layers) == 1 and kept.lower is not None
        assert sorted(p.name for p in (server.data / FOLDER / kept.raw).iterdir()) == [ABOUT]  # no checkpoint
        own = _files_in(_layers(server) / kept.layers[0])
        assert {"edit.txt", "own.txt", "tree/other/n.txt", "gone.txt"} <= own  # gone.txt: its whiteout
        assert not own & {"keep.txt", "tree/a.txt", "tree/sub/b.txt"}  # no template file copied
        source.commands.run(AFTER)  # after the snapshot: none of it reaches its sandboxes
        made.append(Sandbox.create(snapshot.snapshot_id, timeout=120))
        assert _stands_on(server, made[0]) == list(kept.layers)
        assert _tree(made[0]) == before
        assert made[0].files.read("edit.txt") == "first line\nsecond\n"
        assert not made[0].files.exists("gone.txt") and not made[0].files.exists("tree/a.txt")
        assert made[0].files.read("renamed/x.txt") == "x\n" and not made[0].files.exists("moved")
        assert made[0].commands.run("stat -c '%a %U' mode.sh own.txt").stdout == "751 user\n600 user\n"
        made[0].commands.run("echo made >> edit.txt && rm renamed/x.txt && echo m > tree/sub-m.txt")
        made.extend(c for c in made[0].fork(count=1, timeout=120) if isinstance(c, Sandbox))
        assert len(made) == 2
        child = made[1]
        assert _stands_on(server, child)[1:] == list(kept.layers)  # the made one's changes above the snapshot's
        assert child.files.read("edit.txt") == "first line\nsecond\nmade\n" and not child.files.exists("renamed/x.txt")
        again = made[0].create_snapshot()  # a snapshot of a sandbox made from one: a layer more
        assert list(_kept(server, again.snapshot_id).layers[1:]) == list(kept.layers)
        made.append(Sandbox.create(again.snapshot_id, timeout=120))
        assert _tree(made[2]) == _tree(made[0])
        made.append(Sandbox.create(snapshot.snapshot_id, timeout=120))  # the snapshot's layers untouched by all
        assert _tree(made[3]) == before
        assert Sandbox.delete_snapshot(again.snapshot_id) is True
    finally:
        for box in [source, *made]:
            box.kill()
    for box in Sandbox.list().next_items():
        Sandbox.kill(box.sandbox_id)
    assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_a_snapshot_s_layers_stay_while_a_snapshot_or_sandbox_uses_them_and_go_after(server, env):
    source = Sandbox.create(timeout=120)
    source.files.write("state.txt", "at the snapshot")
    snapshot = source.create_snapshot()
    kept = _kept(server, snapshot.snapshot_id)
    layer = _layers(server) / kept.layers[0]
    source.kill()  # the snapshot holds its layers past its source
    assert layer.is_dir()
    made = Sandbox.create(snapshot.snapshot_id, timeout=120)
    try:
        assert Sandbox.delete_snapshot(snapshot.snapshot_id) is True  # a live sandbox stands on its layer
        assert layer.is_dir() and kept.holder not in fork_layers.holders(server.data)
        assert made.files.read("state.txt") == "at the snapshot"
        made.files.write("state.txt", "made's")
        assert made.commands.run("cat state.txt keep.txt").stdout == "made'sthe template's, never changed\n"
    finally:
        made.kill()
    assert _gone(layer)  # nothing uses it any more
    unused = Sandbox.create(timeout=60)
    unused.files.write("x.txt", "x")
    dropped = unused.create_snapshot()
    dropped_layer = _layers(server) / _kept(server, dropped.snapshot_id).layers[0]
    unused.kill()
    assert not _gone(dropped_layer, within=2)
    assert Sandbox.delete_snapshot(dropped.snapshot_id) is True  # no sandbox of it: its layer goes at once
    assert not dropped_layer.exists()


def test_layers_held_by_a_snapshot_whose_take_was_cut_short_are_let_go_when_read_back(tmp_path: Path):
    layers = tmp_path / LAYERS_FOLDER
    for name in ("fork-00000000000000aa", "fork-00000000000000bb"):
        (layers / name).mkdir(parents=True)
        (layers / name / "f").write_text(name)
    kept = Snapshot(raw="ab12", key_name="ci", name=None, sandbox_id="i1", agent_id="a-1", template="default",
                    point="", at=1.0, layers=("fork-00000000000000aa",))
    (tmp_path / FOLDER / "ab12").mkdir(parents=True)
    (tmp_path / FOLDER / "ab12" / ABOUT).write_text(json.dumps(kept.__dict__))
    fork_layers.hold(tmp_path, kept.holder, ["fork-00000000000000aa"])
    fork_layers.hold(tmp_path, f"{HOLDER_PREFIX}cut", ["fork-00000000000000bb"])  # its about.json never written
    fork_layers.hold(tmp_path, "another-holder", [])
    snapshots = Snapshots.open(tmp_path)
    assert snapshots.of_key("ci") == [kept]
    assert sorted(p.name for p in layers.glob("fork-*")) == ["fork-00000000000000aa"]
    assert fork_layers.holders(tmp_path) == ["another-holder", kept.holder]
