"""An agent's checkpoint store on the real filesystem: take, rewind byte for byte,
prune by count and by size at their edges, and a full disk during a take."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from checkpoint_kit import make_tree, mess_up, picture
from conftest import sized_tmpfs
from guilds.checkpoints import CheckpointError, CheckpointStore

BIG = 1 << 30


@pytest.fixture
def home(tmp_path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    make_tree(path)
    return path


def test_a_rewind_gives_back_the_tree_byte_for_byte(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    before = picture(home)
    point = store.take(max_count=10, max_bytes=BIG)
    mess_up(home)
    assert picture(home) != before
    assert store.rewind(point.id) > 0
    assert picture(home) == before
    store.rewind(point.id)  # again: the same tree
    assert picture(home) == before


def test_a_home_deleted_whole_comes_back(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    before = picture(home)
    point = store.take(max_count=10, max_bytes=BIG)
    for entry in home.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    assert picture(home) == {}
    store.rewind(point.id)
    assert picture(home) == before


def test_a_second_checkpoint_copies_only_what_changed(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    first = store.take(max_count=10, max_bytes=BIG)
    (home / "src" / "pkg" / "mod.py").write_text("v2\n")
    second = store.take(max_count=10, max_bytes=BIG)
    assert second.bytes == 3 and first.bytes > 4096
    assert len(os.listdir(store.objects)) == len([e for e in store.tree_of(first.id).values() if e.kind == "f"]) + 1
    store.rewind(first.id)
    assert (home / "src" / "pkg" / "mod.py").read_text() == "print('hi')\n" * 100
    store.rewind(second.id)
    assert (home / "src" / "pkg" / "mod.py").read_text() == "v2\n"


def test_pruned_by_count_the_kept_ones_still_rewind(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    pictures = {}
    for n in range(5):
        (home / "counter").write_text(str(n))
        point = store.take(max_count=3, max_bytes=BIG, name=f"n{n}")
        pictures[point.id] = picture(home)
    kept = store.points()
    assert [p.name for p in kept] == ["n2", "n3", "n4"]
    named = {e.ref for p in kept for e in store.tree_of(p.id).values() if e.kind == "f"}
    assert set(os.listdir(store.objects)) == named  # nothing else left behind
    for point in kept:
        store.rewind(point.id)
        assert picture(home) == pictures[point.id]


def test_pruned_by_size_at_the_edge(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    (home / "big").write_bytes(b"1" * 1000)
    first = store.take(max_count=10, max_bytes=BIG)
    (home / "big").write_bytes(b"2" * 1000)
    limit = first.bytes + 1000
    second = store.take(max_count=10, max_bytes=limit)  # exactly at the limit: both kept
    assert [p.id for p in store.points()] == [first.id, second.id]
    (home / "big").write_bytes(b"3" * 1000)
    third = store.take(max_count=10, max_bytes=limit + 999)  # past it: the oldest goes
    kept = store.points()
    assert [p.id for p in kept] == [second.id, third.id]
    assert sum(p.bytes for p in kept) == limit  # its shared files handed on, its own "big" gone
    store.rewind(second.id)
    assert (home / "big").read_bytes() == b"2" * 1000 and (home / "run.sh").read_text() == "#!/bin/sh\necho run\n"


def test_a_full_disk_during_a_take_loses_nothing(tmp_path, home):
    (tmp_path / "store").mkdir()
    with sized_tmpfs(tmp_path / "store", "256k"):
        store = CheckpointStore(tmp_path / "store", home)
        before = picture(home)
        point = store.take(max_count=10, max_bytes=BIG)
        objects = sorted(os.listdir(store.objects))
        (home / "huge.bin").write_bytes(os.urandom(512 * 1024))
        with pytest.raises(CheckpointError) as failed:
            store.take(max_count=10, max_bytes=BIG)
        assert str(failed.value) == f"cannot take a checkpoint of {home}: No space left on device"
        assert [p.id for p in store.points()] == [point.id]
        assert sorted(os.listdir(store.objects)) == objects  # the half-made copy is gone
        store.rewind(point.id)
        assert picture(home) == before


def test_an_unknown_checkpoint_is_refused_in_one_line(tmp_path, home):
    store = CheckpointStore(tmp_path / "store", home)
    with pytest.raises(CheckpointError, match=r"^no checkpoint 'knope' is kept for "):
        store.rewind("knope")
