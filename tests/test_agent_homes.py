"""Agents' homes (guilds.agents.homes): an overlay over the template's home frozen as a
layer where the orchestrator is root and the kernel mounts it, a copy otherwise. Real
mounts and files; on bwrap and docker, an agent tries as an attacker would to change the
layer or another agent's home and to reach their folders, and deletes its whole home."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import guilds
from guilds.agents import home_layers, homes, mounts
from guilds.agents.homes import make_home, mount_homes, overlay_dir, overlay_unavailable, remove_home

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="overlay homes need a root orchestrator")
UID_A, UID_B = 1_500_000_101, 1_500_000_102
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A data folder where overlay homes can be made (skipped, saying why, where they cannot)."""
    folder = tmp_path / "data"
    (folder / "agent-homes").mkdir(parents=True)
    why = overlay_unavailable(folder, (UID_A, UID_A))
    if why is not None:
        pytest.skip(why)
    return folder


def template(tmp_path: Path) -> Path:
    """A starting home: a nested file, a read-only file, a file of another owner, a link, a dotfile."""
    home = tmp_path / "tpl"
    (home / "src" / "pkg").mkdir(parents=True)
    (home / "src" / "app.py").write_text("print('template')\n")
    (home / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    (home / "README").write_text("read me\n")
    (home / "README").chmod(0o444)
    (home / "theirs.txt").write_text("another owner's\n")
    os.chown(home / "theirs.txt", 4321, 4321)
    (home / ".profile").write_text("export A=1\n")
    os.symlink("src/app.py", home / "app-link")
    return home


def tree_digest(folder: Path) -> str:
    """Every entry's path, mode, owner and content (links: their target)."""
    digest = hashlib.sha256()
    for where, dirs, files in sorted(os.walk(folder)):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(where, name)
            info = path.lstat()
            content = os.readlink(path).encode() if path.is_symlink() else (
                path.read_bytes() if path.is_file() else b"")
            digest.update(f"{path.relative_to(folder)} {info.st_mode:o} {info.st_uid}\n".encode() + content)
    return digest.hexdigest()


def as_uid(uid: int, home: Path, script: str) -> subprocess.CompletedProcess:
    """script run by sh as uid (no groups, no capabilities), in home."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                           "sh", "-c", script], cwd=home, capture_output=True, text=True, check=False)


def layers(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "agent-layers").iterdir() if p.is_dir() and not p.name.startswith("."))


def test_an_overlay_home_is_the_template_s_seen_as_the_agent_s_and_its_writes_stay_its_own(tmp_path, data):
    tpl = template(tmp_path)
    before = tree_digest(tpl)
    home_a, home_b = data / "agent-homes" / "a", data / "agent-homes" / "b"
    make_home(tpl, home_a, data, (UID_A, UID_A))
    make_home(tpl, home_b, data, (UID_B, UID_B))
    try:
        assert mounts.mounted(home_a) and mounts.mounted(home_b)
        assert (home_a / "src" / "app.py").read_text() == "print('template')\n"
        owners = {p.lstat().st_uid for p in [home_a, *home_a.rglob("*")]}
        assert owners == {UID_A}  # every file, the other owner's too, is the agent's
        assert os.readlink(home_a / "app-link") == "src/app.py"
        [layer] = layers(data)  # one frozen layer, shared by both
        frozen = tree_digest(data / "agent-layers" / layer)
        done = as_uid(UID_A, home_a, "set -e; echo mine >> src/app.py; chmod u+w README; echo x > README; "
                                     "rm theirs.txt .profile; mv src/pkg src/moved; touch src/moved/new.py; "
                                     "mkdir -p a/b; echo c > a/b/c; ln -sf README app-link; stat -c %u a/b/c")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(UID_A)]
        assert (home_a / "src" / "app.py").read_text() == "print('template')\nmine\n"
        assert tree_digest(tpl) == before
        assert tree_digest(data / "agent-layers" / layer) == frozen
        assert (home_b / "src" / "pkg" / "mod.py").read_text() == "X = 1\n" and (home_b / "theirs.txt").exists()
        upper = overlay_dir(data, home_a) / "upper"
        assert (upper / "src" / "app.py").read_text() == "print('template')\nmine\n"  # copied up, written
        assert (upper / "src" / "moved" / "new.py").exists()
        assert not (upper / "src" / "moved" / "mod.py").exists()  # a folder renamed: nothing in it copied
        assert os.listdir(overlay_dir(data, home_b) / "upper") == []  # b wrote nothing
    finally:
        assert remove_home(home_a, data) and remove_home(home_b, data)
    assert not home_a.exists() and not mounts.mounted(home_a) and os.listdir(data / "agent-overlays") == []
    assert layers(data) == [layer]  # the newest layer stays for the next agent


def test_an_agent_can_delete_its_whole_home_and_the_layer_stays_whole(tmp_path, data):
    tpl = template(tmp_path)
    home = data / "agent-homes" / "a"
    make_home(tpl, home, data, (UID_A, UID_A))
    [layer] = layers(data)
    frozen = tree_digest(data / "agent-layers" / layer)
    done = as_uid(UID_A, home, "rm -rf ./* ./.[!.]* && ls -A . | wc -l && touch again")  # in it: its way shut
    assert done.stdout.split() == ["0"] and not done.stderr, done.stderr
    assert sorted(os.listdir(home)) == ["again"]
    assert tree_digest(data / "agent-layers" / layer) == frozen
    assert (data / "agent-layers" / layer / "src" / "app.py").read_text() == "print('template')\n"
    remove_home(home, data)


def test_an_edit_to_the_template_makes_a_new_layer_and_live_homes_keep_theirs(tmp_path, data, monkeypatch):
    tpl = template(tmp_path)
    old, new, stale = (data / "agent-homes" / n for n in ("old", "new", "stale"))
    make_home(tpl, old, data, (UID_A, UID_A))
    (tpl / "src" / "app.py").write_text("print('edited')\n")
    make_home(tpl, stale, data, (UID_A, UID_A))  # within HOME_VERSION_SECONDS: the walk is reused
    assert (stale / "src" / "app.py").read_text() == "print('template')\n"
    monkeypatch.setattr(home_layers, "HOME_VERSION_SECONDS", 0)
    make_home(tpl, new, data, (UID_B, UID_B))
    assert (new / "src" / "app.py").read_text() == "print('edited')\n"
    assert (old / "src" / "app.py").read_text() == "print('template')\n"
    assert len(layers(data)) == 2
    remove_home(old, data)
    assert len(layers(data)) == 2  # the old layer: still under the stale agent's home
    remove_home(stale, data)
    [kept] = layers(data)  # unused and superseded: removed
    assert (data / "agent-layers" / kept / "src" / "app.py").read_text() == "print('edited')\n"
    remove_home(new, data)
    assert layers(data) == [kept]


def test_makes_at_once_freeze_one_layer_and_each_gets_its_own_home(tmp_path, data):
    tpl = template(tmp_path)
    made = [data / "agent-homes" / f"m{n}" for n in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: make_home(tpl, made[n], data, (UID_A + n, UID_A + n)), range(8)))
    try:
        assert len(layers(data)) == 1 and all(mounts.mounted(home) for home in made)
        assert [(home / "src" / "app.py").stat().st_uid for home in made] == [UID_A + n for n in range(8)]
    finally:
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(lambda home: remove_home(home, data), made))
    assert os.listdir(data / "agent-overlays") == [] and len(layers(data)) == 1


def test_a_busy_home_is_detached_lazily_and_removed(tmp_path, data, caplog):
    home = data / "agent-homes" / "busy"
    make_home(template(tmp_path), home, data, (UID_A, UID_A))
    holder = subprocess.Popen(["sleep", "60"], cwd=home / "src")  # its working folder in the home
    try:
        with caplog.at_level(logging.WARNING, logger="guilds.agents.homes"):
            assert remove_home(home, data)
        assert f"agent home {home} was busy: detached lazily" in caplog.text
        assert not home.exists() and not overlay_dir(data, home).exists() and not mounts.mounted(home)
    finally:
        holder.kill()
        holder.wait()


def test_a_home_not_mounted_after_a_reboot_is_mounted_again_with_what_the_agent_wrote(tmp_path, data):
    home = data / "agent-homes" / "a"
    make_home(template(tmp_path), home, data, (UID_A, UID_A))
    assert as_uid(UID_A, home, "echo kept > note; rm README").returncode == 0
    mounts.unmount(home)  # what a reboot leaves: the folder, empty, not mounted
    assert os.listdir(home) == []
    assert mount_homes(data, [home, data / "agent-homes" / "never-made"]) == [home]
    assert (home / "note").read_text() == "kept\n" and not (home / "README").exists()
    assert (home / "note").stat().st_uid == UID_A and (home / "src" / "app.py").stat().st_uid == UID_A
    assert mount_homes(data, [home]) == []  # mounted already: never twice
    remove_home(home, data)


def test_without_an_owner_or_when_the_overlay_fails_the_home_is_a_copy(tmp_path, data, caplog, monkeypatch):
    monkeypatch.setattr(homes, "_told", set())  # a process that has not said why yet
    tpl = template(tmp_path)
    plain, failed = data / "agent-homes" / "plain", data / "agent-homes" / "failed"
    with caplog.at_level(logging.INFO, logger="guilds.agents.homes"):
        make_home(tpl, plain, data, None)
        make_home(tpl, data / "agent-homes" / "plain2", data, None)
        (data / "agent-overlays").write_text("not a folder")  # the overlay's own folders cannot be made
        make_home(tpl, failed, data, (UID_A, UID_A))
    assert caplog.text.count("agents' homes are copies: the sandbox gives its home to no uid of its own") == 1
    assert f"agent home {failed}: a copy, the overlay failed" in caplog.text
    for home in (plain, failed):
        assert not mounts.mounted(home)
        assert (home / "src" / "app.py").read_text() == "print('template')\n"
        assert (home / "src" / "app.py").stat().st_ino != (tpl / "src" / "app.py").stat().st_ino
        assert remove_home(home, data) and not home.exists()
    (data / "agent-overlays").unlink()


def test_a_template_without_a_starting_home_gives_an_empty_home(tmp_path, data):
    home = data / "agent-homes" / "empty"
    make_home(tmp_path / "nothing-here", home, data, (UID_A, UID_A))
    assert os.listdir(home) == [] and not mounts.mounted(home)
    assert remove_home(home, data) and not remove_home(home, data)


# --- on a sandbox, as an attacker would

TEMPLATE = '''
[agent]
id = "homes-server"
home = "own-home"
sandbox = "local"

[templates.box.agent]
home = "tpl"
sandbox = "{backend}"
[templates.box.docker]
image = "{image}"
memory = "256m"
'''


@pytest.mark.backends("bwrap", "docker")
async def test_an_agent_cannot_change_the_layer_or_another_home_nor_reach_their_folders(tmp_path, backend):
    tpl = template(tmp_path)
    before = tree_digest(tpl)
    settings = tmp_path / "server.toml"
    settings.write_text(TEMPLATE.format(backend=backend, image=IMAGE))
    settings.chmod(0o600)
    data = tmp_path / "data"
    async with guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)}) as server:
        a, b = await server.make_agent("box", owner="a"), await server.make_agent("box", owner="b")
        try:
            home_a, home_b = Path(a.record.home), Path(b.record.home)
            assert mounts.mounted(home_a) and mounts.mounted(home_b)
            [layer] = layers(data)
            frozen = tree_digest(data / "agent-layers" / layer)
            seen = await a.call("ra", "shell", {"command": "id -u; stat -c %u src/app.py README theirs.txt; "
                                                           "cat src/app.py"})
            uid, *owners = seen.text.split()[:4]
            assert owners == [uid] * 3 and "print('template')" in seen.text
            reach = (f"ls {data}/agent-layers {data}/agent-overlays/{b.id}/upper {home_b} "
                     f"/proc/1/root{data}/agent-layers 2>&1; "
                     "grep -o 'upperdir=[^,]*' /proc/self/mountinfo | cut -d= -f2 | xargs ls 2>&1; echo done")
            tried = await a.call("ra", "shell", {"command": reach})
            assert "app.py" not in tried.text and "mod.py" not in tried.text and layer not in tried.text.replace(
                f"{data}/agent-layers", ""), tried.text
            wrote = await a.call("ra", "shell", {"command": "echo a-words >> src/app.py; mv src/pkg src/p2; "
                                                            "rm -rf ./* ./.[!.]*; ls -A | wc -l; echo new > f; "
                                                            "cat f"})
            assert wrote.text.split()[:2] == ["0", "new"], wrote.text
            assert set(os.listdir(home_a)) - {".runs"} == {"f"}  # .runs: the call's own record, written after
            assert tree_digest(data / "agent-layers" / layer) == frozen and tree_digest(tpl) == before
            assert (home_b / "src" / "app.py").read_text() == "print('template')\n"
            seen_b = await b.call("rb", "shell", {"command": "cat src/app.py src/pkg/mod.py; ls -A"})
            assert "a-words" not in seen_b.text and "X = 1" in seen_b.text and ".profile" in seen_b.text
        finally:
            for made in (a, b):
                await server.remove_agent(made.id)
    assert not mounts.mounted(home_a) and not home_a.exists() and not home_b.exists()
    assert os.listdir(data / "agent-overlays") == [] and layers(data) == [layer]


@pytest.mark.backends("bwrap")
async def test_a_restarted_server_mounts_its_live_agents_homes_again(tmp_path, backend):
    template(tmp_path)
    settings = tmp_path / "server.toml"
    settings.write_text(TEMPLATE.format(backend=backend, image=IMAGE))
    settings.chmod(0o600)
    data = tmp_path / "data"
    env = {**os.environ, "GUILDS_DATA": str(data)}
    async with guilds.open(settings, data_dir=data, env=env) as server:
        made = await server.make_agent("box")
        await made.call("r1", "shell", {"command": "echo kept > note"})
        await made.toolbox.sandbox.stop()
    mounts.unmount(made.record.home)  # a reboot
    async with guilds.open(settings, data_dir=data, env=env) as server:
        found = await server.made_agent(made.id)
        assert mounts.mounted(made.record.home)
        assert (await found.call("r2", "shell", {"command": "cat note src/app.py"})).text.startswith(
            "kept\nprint('template')")
        await server.remove_agent(made.id)


def test_makes_at_once_on_a_fresh_data_folder_all_get_overlays(tmp_path):
    """A warm pool makes its first agents at once: the overlay probe, once per data folder, is
    made by one of them while the others wait for its answer (each probing in the same folder
    made them copies)."""
    from concurrent.futures import ThreadPoolExecutor

    folder = tmp_path / "fresh"
    (folder / "agent-homes").mkdir(parents=True)
    tpl = template(tmp_path)
    homes = [folder / "agent-homes" / f"a{i}" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda home: make_home(tpl, home, folder, (UID_A, UID_A)), homes))
    try:
        for home in homes:
            assert mounts.mounted(home) and overlay_dir(folder, home).is_dir(), home
            assert (home / "src" / "app.py").read_text() == "print('template')\n"
    finally:
        for home in homes:
            remove_home(home, folder)


def test_a_swappable_home_whose_point_cannot_be_shared_is_a_copy_with_no_overlay_left(data, tmp_path, monkeypatch):
    def refused(path):
        raise homes.SandboxError(f"cannot share {path}: Operation not permitted")

    monkeypatch.setattr(mounts, "share_point", refused)
    home = data / "agent-homes" / "a1"
    assert make_home(template(tmp_path), home, data, (UID_A, UID_A), swappable=True) is False
    try:
        assert not mounts.mounted(home) and not overlay_dir(data, home).exists()
        assert (home / "src" / "app.py").read_text() == "print('template')\n"
        assert mount_homes(data, [home]) == []  # nothing to mount again at a start
    finally:
        remove_home(home, data)


def test_a_swappable_home_takes_its_overlay_on_its_shared_point_and_another_in_place(data, tmp_path):
    home = data / "agent-homes" / "a1"
    assert make_home(template(tmp_path), home, data, (UID_A, UID_A), swappable=True) is True
    try:
        assert mounts.mounted(home) and not (home / "README").exists()  # the bare point, no overlay yet
        homes.mount_home(data, home)
        assert (home / "README").read_text() == "read me\n" and os.stat(home / "README").st_uid == UID_A
        (home / "mine").write_text("the pool's\n")
        lower = os.readlink(overlay_dir(data, home) / "lower")
        homes.swap_home(data, home, [], lower)  # the template's layer alone again: what it wrote goes
        assert not (home / "mine").exists() and (home / "README").read_text() == "read me\n"
        assert os.listdir(overlay_dir(data, home) / "upper") == [] and mounts.mounted(home)
    finally:
        remove_home(home, data)
    assert not home.exists() and not mounts.mounted(home)


def test_a_home_mounted_again_for_its_owner_makes_no_new_user_namespace_and_the_kept_are_bounded(
        data, tmp_path, monkeypatch):
    made: list[tuple[int, int]] = []
    new = mounts._new_user_namespace

    def counted(uid: int, gid: int) -> int:
        made.append((uid, gid))
        return new(uid, gid)

    monkeypatch.setattr(mounts, "_new_user_namespace", counted)
    monkeypatch.setattr(mounts, "_namespaces", type(mounts._namespaces)())
    monkeypatch.setattr(mounts, "NAMESPACES_KEPT", 1)
    home = data / "agent-homes" / "a1"
    make_home(template(tmp_path), home, data, (UID_A, UID_A), swappable=True)
    try:
        homes.mount_home(data, home)
        lower = os.readlink(overlay_dir(data, home) / "lower")
        homes.swap_home(data, home, [], lower)
        homes.swap_home(data, home, [], lower)
        assert made == [(UID_A, UID_A)]  # the swaps used the kept one
        assert os.stat(home / "README").st_uid == UID_A  # and it still maps root's files to the owner
        [kept_a] = mounts._namespaces.values()
        other = mounts.layer_mount(str(data / "agent-layers" / os.path.basename(lower)), (UID_B, UID_B))
        os.close(other)
        assert made == [(UID_A, UID_A), (UID_B, UID_B)] and list(mounts._namespaces) == [(UID_B, UID_B)]
        with pytest.raises(OSError):  # the one pushed out is closed
            os.fstat(kept_a)
    finally:
        remove_home(home, data)
        for fd in mounts._namespaces.values():
            os.close(fd)
