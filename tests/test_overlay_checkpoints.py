"""Checkpoints of an overlay home (guilds.checkpoints.overlay_tree): an agent made on demand as
root from a template whose home is a git repository of about 100 MB, in real bwrap sandboxes
over real overlay mounts. A checkpoint keeps the upper only; a rewind after edits, deletions
of the layer's files, a folder renamed, a commit and a whole-home ``rm -rf`` gives back the
tree byte for byte (modes, owners, times, links); a background command writes meanwhile; a
full disk refuses the call in one line and keeps the earlier checkpoints."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import sized_tmpfs
from guilds.agents import fork_layers, mounts
from guilds.checkpoints import CheckpointStore
from test_fork import EDITS, opened, overlay_data, repo, settings_file  # noqa: F401 (repo: the fixture)
from test_fork import picture as fork_picture

pytestmark = [pytest.mark.bwrap, pytest.mark.xdist_group("overlay-checkpoints")]
WHOLE_HOME_GONE = "rm -rf ./* ./.[!.]* 2>/dev/null; ls -A | grep -v '^.runs$' | wc -l"


def picture(root: Path) -> dict[str, tuple]:
    """Every path under root but the calls' own record (.runs): kind, mode, owner, mtime, and a
    file's bytes or a link's target."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        if folder == str(root) and ".runs" in dirs:
            dirs.remove(".runs")
        for name in [*dirs, *files]:
            path = Path(folder, name)
            st = path.lstat()
            about = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
            if stat.S_ISLNK(st.st_mode):
                seen[str(path.relative_to(root))] = ("l", *about, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                seen[str(path.relative_to(root))] = ("d", *about, st.st_mtime_ns)
            else:
                seen[str(path.relative_to(root))] = ("f", *about, st.st_mtime_ns, path.read_bytes())
    return seen


def upper_of(data: Path, agent) -> Path:
    return data / "agent-overlays" / agent.id / "upper"


async def test_a_rewind_gives_back_the_tree_after_edits_a_commit_and_a_whole_home_rm(tmp_path, repo):  # noqa: F811
    data = overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, "bwrap")) as server:
        agent = await server.make_agent("repo")
        home = Path(agent.record.home)
        start = picture(home)
        await agent.call("r", "shell", {"command": "echo first > first.txt; chmod 600 first.txt; "
                                                   "sed -i 's/run/ran/' run.sh; rm link-dangling"})
        first = picture(home)
        done = await agent.call("r", "shell", {"command": EDITS})
        assert not done.is_error, done.text
        gone = await agent.call("r", "shell", {"command": WHOLE_HOME_GONE})
        assert gone.text.split()[0] == "0"
        points = agent.checkpoints()
        assert [p.seq for p in points] == [1, 2, 3]
        store = agent.toolbox.checkpoints.files
        assert store.layers_of(points[1].id) is not None  # an upper's tree, over the template's layer
        assert points[1].files < 200 < len(start)  # the upper's paths only, not the home's thousands

        rewound = await agent.rewind("r", 2)
        assert picture(home) == first
        assert rewound.changed > 1000  # the whole home came back, through the merged mount
        assert (home / "fixed.txt").read_text() == "read only\n"  # deleted from the layer, back
        await agent.rewind("r", 1)
        assert picture(home) == start
        assert not (upper_of(data, agent) / "first.txt").exists()
        await agent.rewind("r", 3)
        again = await agent.call("r2", "shell", {"command": "echo $(git status --porcelain -- . ':!.runs' | wc -l) "
                                                        "$(git log --oneline | wc -l)"})
        assert again.text.split()[:2] == ["0", "2"]  # the commit of call 2 is back, and nothing is left uncommitted
        await server.remove_agent(agent.id)


async def test_a_background_command_writes_while_checkpoints_are_taken_and_the_rewind_stops_it(tmp_path, repo):  # noqa: F811
    overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, "bwrap")) as server:
        agent = await server.make_agent("repo")
        home = Path(agent.record.home)
        await agent.call("r", "shell", {"command": "echo stable > stable.txt"})
        started = await agent.call("r", "shell", {
            "command": "i=0; while :; do i=$((i+1)); echo $i >> log.txt; head -c 4096 /dev/urandom > run.sh; done",
            "background": True})
        bid = started.meta["background_id"]
        for _ in range(3):
            await agent.call("r", "shell", {"command": "sleep 0.05"})
        store = agent.toolbox.checkpoints.files
        point = agent.toolbox.checkpoints.point_before("r", 4)
        kept = store.tree_of(point.id)
        done = await agent.rewind("r", 4)
        assert done.stopped == (bid,)
        for name in ("log.txt", "run.sh"):
            assert (home / name).read_bytes() == (store.objects / kept[name].ref).read_bytes()
        await asyncio.sleep(0.2)
        assert (home / "log.txt").read_bytes() == (store.objects / kept["log.txt"].ref).read_bytes()
        status = await agent.call("r", "shell_status", {})
        assert f"{bid} stopped (by a rewind to before call 4)" in status.text
        await server.remove_agent(agent.id)


async def test_a_full_disk_refuses_the_call_in_one_line_and_keeps_the_earlier_checkpoints(tmp_path, repo):  # noqa: F811
    data = overlay_data(tmp_path)
    (data / "checkpoints").mkdir()
    with sized_tmpfs(data / "checkpoints", "256k"):
        async with opened(tmp_path, settings_file(tmp_path, repo, "bwrap")) as server:
            agent = await server.make_agent("repo")
            home = Path(agent.record.home)
            await agent.call("r", "shell", {"command": "echo small > a; rm fixed.txt"})
            before = picture(home)
            await agent.call("r", "shell", {"command": "head -c 600000 /dev/urandom > big"})
            refused = await agent.call("r", "shell", {"command": "echo ran > ran.txt"})
            assert refused.is_error and not (home / "ran.txt").exists()
            assert refused.text.splitlines()[0] == f"cannot take a checkpoint of {home}: No space left on device"
            assert [p.seq for p in agent.checkpoints()] == [1, 2]
            await agent.rewind("r", 2)
            assert picture(home) == before
            await server.remove_agent(agent.id)


def overlay_home(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A home mounted as an agent's is (``guilds.agents.homes``'s folders) over a small layer that
    holds folders, files, a link to a folder and a link out of the home; (data, home, outside)."""
    data = overlay_data(tmp_path)
    outside = tmp_path / "outside"
    (outside / "secret").mkdir(parents=True)
    layer = data / "agent-layers" / "t-1"
    for folder in ("a/x", "b/y", "c"):
        (layer / folder).mkdir(parents=True)
    for name in ("a/x/1", "a/2", "b/y/3", "c/4", "top"):
        (layer / name).write_text(name)
    os.symlink("a", layer / "link-dir")
    os.symlink(str(outside), layer / "escape")
    own = data / "agent-overlays" / "home"
    for name in ("upper", "work"):
        (own / name).mkdir(parents=True)
    os.symlink(os.path.join("..", "..", "agent-layers", "t-1"), own / "lower")
    home = tmp_path / "home"
    home.mkdir()
    layer_fd = mounts.layer_mount(str(layer), (0, 0))
    try:
        mounts.mount_overlay(str(home), layer_fd, str(own / "upper"), str(own / "work"))
    finally:
        os.close(layer_fd)
    return data, home, outside


@pytest.mark.parametrize(("before", "after"), [
    ("echo e > a/2; rm top", "mv a z; mkdir a; echo k > a/q; rm -rf b; mkdir -p b/y; mv c d; ln -s z c"),
    ("mv a z", "rm -rf ./*; git init -q ."),
    ("mkdir m; echo 1 > m/f; chmod 750 b", "rm -rf ./*; mkdir m; mkdir -p a/x; echo 2 > a/x/1"),
    ("true", "rm escape link-dir; mkdir escape link-dir; echo in > escape/f; touch -d 2001-01-01 a/2 c"),
])
def test_the_upper_s_marks_are_understood_and_a_rewind_writes_only_through_the_home(tmp_path, before, after):
    data, home, outside = overlay_home(tmp_path)
    try:
        store = CheckpointStore.of_agent(data, "home-agent", home)
        assert fork_layers.stack(data, data / "agent-overlays" / "home")  # the agents' homes serve the overlays
        subprocess.run(["sh", "-c", before], cwd=home, check=True)
        kept = picture(home)
        point = store.take(max_count=10, max_bytes=1 << 30)
        assert store.layers_of(point.id) == [os.path.realpath(data / "agent-layers" / "t-1")]
        upper = data / "agent-overlays" / "home" / "upper"
        assert point.files == sum(1 for _ in upper.rglob("*")) + 1  # the upper's paths, itself included
        subprocess.run(["sh", "-c", after], cwd=home, check=True)
        store.rewind(point.id)
        assert picture(home) == kept
        assert os.listdir(outside) == ["secret"] and os.listdir(outside / "secret") == []  # never written through
    finally:
        mounts.unmount(home)


def data_bytes_of(path: Path) -> int:
    """Bytes the file holds on disk (one holding metadata only: its extended attributes' block)."""
    return path.lstat().st_blocks * 512


def data_bytes(folder: Path) -> int:
    """Bytes the files under folder hold on disk."""
    return sum(data_bytes_of(p) for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


async def test_a_change_of_metadata_only_copies_no_data_and_checkpoints_rewinds_and_forks_keep_its_bytes(
        tmp_path, repo):  # noqa: F811
    data = overlay_data(tmp_path)
    big = max((p for p in repo.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.parts),
              key=lambda p: p.stat().st_size)
    rel, original = str(big.relative_to(repo)), big.read_bytes()
    async with opened(tmp_path, settings_file(tmp_path, repo, "bwrap")) as server:
        agent = await server.make_agent("repo")
        home, upper = Path(agent.record.home), upper_of(data, agent)
        # git touches every object it would write again (its add re-hashes the whole tree here):
        # each such touch used to copy the object's data up; now its metadata only
        touched = await agent.call("r", "shell", {"command": f"touch -c -d 2001-02-03 {rel}; chmod 640 {rel}; "
                                                             "git add -A; git -c user.name=f -c user.email=f@f "
                                                             "commit -qm touched; echo done"})
        assert touched.text.startswith("done"), touched.text
        assert "trusted.overlay.metacopy" in os.listxattr(upper / rel) and data_bytes_of(upper / rel) < 64 << 10
        objects = data_bytes(repo / ".git")
        assert data_bytes(upper) < objects * 0.6  # the objects' data stays in the layer (ext4: a block for marks)
        assert (home / rel).read_bytes() == original and stat.S_IMODE((home / rel).stat().st_mode) == 0o640
        after_touch = picture(home)

        child = (await server.fork(agent.id, 1)).agents[0]  # the freeze copies the marks, not the data
        layer = fork_layers.stack(data, data / "agent-overlays" / child.id)[0]
        assert data_bytes(layer) < objects * 0.6 and data_bytes_of(layer / rel) < 64 << 10
        assert fork_picture(Path(child.record.home)) == fork_picture(home)
        assert (Path(child.record.home) / rel).read_bytes() == original
        status = await child.call("c", "shell", {"command": "git status --porcelain -- . ':!.runs' | wc -l; "
                                                            "git log --format=%s"})
        assert status.text.split()[:2] == ["0", "touched"], status.text
        await server.remove_agent(child.id)

        await agent.call("r", "shell", {"command": f"echo changed > {rel}"})
        assert (home / rel).read_text() == "changed\n"
        await agent.rewind("r", 2)  # to before the write: the checkpoint read the data through the home
        assert picture(home) == after_touch
        await agent.rewind("r", 1)
        assert (home / rel).read_bytes() == original and (home / rel).stat().st_mtime_ns == big.stat().st_mtime_ns
        await agent.rewind("r", 2)
        assert picture(home) == after_touch
