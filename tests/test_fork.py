"""Fork (guilds.agents.fork): n agents whose homes start as one agent's home now, or at a
checkpoint of it. On a real git repository of about 100 MB (packages of this venv, committed),
with real overlay mounts and bwrap sandboxes (and docker): each child's tree is the source's
byte for byte (modes, links, times), writes stay apart, a source that deletes its whole
home and is removed leaves its children whole, a child cannot reach the layers or another
child's upper, caps refuse a fork past them and leave nothing; copies where no overlay is."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import site
import stat
import subprocess
from pathlib import Path

import pytest

import guilds
from guilds.agents import mounts
from guilds.agents.fork_layers import FORK_PREFIX
from guilds.agents.homes import overlay_unavailable
from guilds.errors import BadInput
from guilds.fronts.cli import main as cli_main
from guilds.limits import FORK_MAX_CHILDREN
from guilds.record.agent_rows import AgentRefused

REPO_MB = 100
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
GIT_ENV = {"GIT_AUTHOR_NAME": "f", "GIT_AUTHOR_EMAIL": "f@f", "GIT_COMMITTER_NAME": "f", "GIT_COMMITTER_EMAIL": "f@f"}
SERVER = '''
[agent]
id = "fork-server"
home = "own-home"
sandbox = "{own}"
checkpoints = true

[templates.repo.agent]
home = "{repo}"
sandbox = "{backend}"
checkpoints = true
[templates.repo.docker]
image = "{image}"
memory = "256m"

[agents]
max = {max}
max_per_owner = {per_owner}
'''


def git(home: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(home), *argv], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A git repository of about 100 MB: whole packages of this venv's site-packages, committed,
    with an executable, a read-only file, links (relative, dangling, to a folder)."""
    home = tmp_path_factory.mktemp("fork") / "repo"
    home.mkdir()
    source = Path(next(p for p in site.getsitepackages() if p.endswith("site-packages")))
    total = 0
    for package in sorted(source.iterdir()):
        if total >= REPO_MB << 20 or not package.is_dir() or package.name.startswith(("_", ".")):
            continue
        size = sum(f.stat().st_size for f in package.rglob("*") if f.is_file() and not f.is_symlink())
        if total + size <= (REPO_MB << 20) * 1.1:
            shutil.copytree(package, home / package.name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
            total += size
    (home / "run.sh").write_text("#!/bin/sh\necho run\n")
    (home / "run.sh").chmod(0o755)
    (home / "fixed.txt").write_text("read only\n")
    (home / "fixed.txt").chmod(0o444)
    os.symlink("run.sh", home / "link-rel")
    os.symlink("nowhere", home / "link-dangling")
    os.symlink(next(p.name for p in home.iterdir() if p.is_dir()), home / "link-dir")
    git(home, "init", "-q")
    git(home, "config", "gc.auto", "0")  # no packing behind the test's back (a detached gc --auto)
    git(home, "config", "maintenance.auto", "false")
    git(home, "add", "-A")
    git(home, "-c", "core.compression=0", "commit", "-qm", "the repository")
    return home


def picture(root: Path) -> dict[str, tuple]:
    """Every path under root but the calls' own record (.runs): kind, mode, mtime, and a file's
    bytes or a link's target; owners apart (each home's files are its own uid's)."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        if folder == str(root) and ".runs" in dirs:
            dirs.remove(".runs")
        for name in [*dirs, *files]:
            path = Path(folder, name)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                seen[rel] = ("d", stat.S_IMODE(st.st_mode))
            else:
                seen[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_mtime_ns, path.read_bytes())
    return seen


def owners(root: Path) -> set[int]:
    return {p.lstat().st_uid for p in root.rglob("*") if ".runs" not in p.parts}


def settings_file(tmp_path: Path, repo: Path, backend: str, *, own: str = "local", max: int = 20,
                  per_owner: int = 10) -> Path:
    (tmp_path / "own-home").mkdir(exist_ok=True)
    path = tmp_path / "server.toml"
    path.write_text(SERVER.format(own=own, repo=repo, backend=backend, image=IMAGE, max=max, per_owner=per_owner))
    path.chmod(0o600)
    return path


def opened(tmp_path: Path, settings: Path) -> guilds.fronts.agent.Agent:
    data = tmp_path / "data"
    return guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)})


def fork_layers_of(data: Path) -> list[str]:
    folder = data / "agent-layers"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(FORK_PREFIX)) if folder.is_dir() else []


def overlay_data(tmp_path: Path) -> Path:
    """The test's data folder, made; the test skipped where overlay homes cannot be mounted."""
    data = tmp_path / "data"
    data.mkdir()
    why = overlay_unavailable(data, (1_500_000_201, 1_500_000_201))
    if why is not None:
        pytest.skip(why)
    return data


EDITS = ("set -e; sed -i 's/^/# edited\\n/' run.sh; chmod 700 run.sh; rm fixed.txt; "
         "d=$(ls -d */ | head -1); mv \"$d\" moved-dir; rm -rf \"$(ls -d */ | sed -n 2p)\"; "
         "mkdir -p new/deep; printf 'x%.0s' $(seq 1000) > new/deep/file; ln -sfn new link-dir; "
         "cat > notes.md <<'EOF'\nnotes\nEOF\n git add -A >/dev/null; "
         "git -c user.name=f -c user.email=f@f commit -qm edits; git status --porcelain")


@pytest.mark.backends("bwrap", "docker")
async def test_each_child_is_the_source_byte_for_byte_and_writes_stay_apart(tmp_path, repo, backend):
    data = overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, backend)) as server:
        source = await server.make_agent("repo", owner="alice")
        edited = await source.call("r", "shell", {"command": EDITS})
        assert "exit_code" not in edited.text, edited.text
        home = Path(source.record.home)
        before = picture(home)
        assert "moved-dir" in before and "fixed.txt" not in before and "new/deep/file" in before
        done = await server.fork(source.id, 3)
        children = done.agents
        assert done.forked.how == "overlay" and len(fork_layers_of(data)) == 1
        assert [c.record.owner for c in children] == ["alice"] * 3
        assert [c.record.template for c in children] == ["repo"] * 3
        for child in children:
            child_home = Path(child.record.home)
            assert mounts.mounted(child_home) and picture(child_home) == before
            assert owners(child_home) == {os.stat(child_home).st_uid}
            assert os.listdir(data / "agent-overlays" / child.id / "upper") == []  # starts empty
        if backend == "bwrap":  # a uid of each agent's own (docker: one uid, a container each)
            assert len({os.stat(c.record.home).st_uid for c in children} | {os.stat(home).st_uid}) == 4
        status = await children[0].call("c0", "shell", {"command": "git status --porcelain; git log --format=%s"})
        assert "edits\nthe repository" in status.text, status.text
        first, second = Path(children[0].record.home), Path(children[1].record.home)
        await children[0].call("c0", "shell", {"command": "echo child0 >> run.sh; rm -rf moved-dir; echo mine > only0"})
        await children[1].call("c1", "shell", {"command": "chmod 600 notes.md; mv new new2"})
        await source.call("r", "shell", {"command": "echo later > after-fork"})
        assert picture(home) == {**before, "after-fork": picture(home)["after-fork"]}
        assert "only0" not in picture(second) and "moved-dir" in picture(second)
        assert picture(Path(children[2].record.home)) == before
        assert (first / "run.sh").read_text().endswith("child0\n") and not (first / "moved-dir").exists()
        assert stat.S_IMODE((second / "notes.md").stat().st_mode) == 0o600 and (second / "new2").is_dir()

        grandchild = (await server.fork(children[1].id, 1)).agents[0]  # a fork of a fork: two fork layers
        assert picture(Path(grandchild.record.home)) == picture(second)
        assert len(fork_layers_of(data)) == 2

        wiped = await source.call("r", "shell", {"command": "rm -rf ./* ./.[!.]* ; ls -A | grep -v .runs | wc -l"})
        assert "0" in wiped.text.split()
        await server.remove_agent(source.id)
        assert not home.exists()
        assert picture(Path(children[2].record.home)) == before  # the source gone: the children whole
        again = await children[2].call("c2", "shell", {"command": "git status --porcelain | wc -l; cat notes.md"})
        assert again.text.split()[-2:] == ["0", "notes"] or "notes" in again.text, again.text
        for child in [*children, grandchild]:
            await server.remove_agent(child.id)
    assert fork_layers_of(data) == [] and os.listdir(data / "agent-overlays") == []


@pytest.mark.backends("bwrap")
async def test_a_fork_from_a_checkpoint_is_the_home_as_it_kept_it(tmp_path, repo, backend):
    data = overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, backend)) as server:
        source = await server.make_agent("repo")
        await source.call("r", "shell", {"command": "echo kept > kept.txt; chmod 640 kept.txt"})
        point = await source.checkpoint("good")
        kept = picture(Path(source.record.home))
        await source.call("r", "shell", {"command": "rm -rf ./*; echo broken > broken.txt"})
        with pytest.raises(BadInput, match=r"^checkpoint: no checkpoint 'nope' is kept for agent .* \(named: good\)$"):
            await server.fork(source.id, 1, checkpoint="nope")
        done = await server.fork(source.id, 2, checkpoint="good")
        assert done.forked.checkpoint == point.id
        [layer] = fork_layers_of(data)
        objects = {os.stat(p).st_ino for p in (data / "checkpoints" / source.id / "objects").iterdir()}
        linked = data / "agent-layers" / layer / "kept.txt"
        assert os.stat(linked).st_ino in objects  # a link to the checkpoint's object, no copy
        for child in done.agents:
            assert picture(Path(child.record.home)) == kept
        seen = await done.agents[0].call("c", "shell", {"command": "cat kept.txt; ls broken.txt 2>&1; "
                                                                   "echo over > kept.txt"})
        assert "kept" in seen.text and "No such file" in seen.text
        assert linked.read_text() == "kept\n"  # the child's write went to its own upper
        for made in (source, *done.agents):
            await server.remove_agent(made.id)
    assert fork_layers_of(data) == []


@pytest.mark.backends("bwrap")
async def test_a_child_cannot_reach_the_layers_or_another_child_s_upper(tmp_path, repo, backend):
    data = overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, backend)) as server:
        source = await server.make_agent("repo")
        await source.call("r", "shell", {"command": "echo secret-of-source > mine.txt"})
        a, b = (await server.fork(source.id, 2)).agents
        await b.call("b", "shell", {"command": "echo b-private > b.txt"})
        [layer] = fork_layers_of(data)
        frozen = picture(data / "agent-layers" / layer)
        reach = (f"ls {data}/agent-layers {data}/agent-layers/{layer} {data}/agent-overlays/{b.id}/upper "
                 f"{b.record.home} /proc/1/root{data}/agent-layers 2>&1; cat {data}/agent-overlays/{b.id}/upper/b.txt "
                 f"{data}/agent-layers/{layer}/mine.txt 2>&1; echo x > {data}/agent-layers/{layer}/mine.txt 2>&1; "
                 "grep -o 'lowerdir[^,]*\\|upperdir=[^,]*' /proc/self/mountinfo | cut -d= -f2 | tr : '\\n' "
                 "| xargs -r ls 2>&1; echo done")
        tried = await a.call("a", "shell", {"command": reach})
        assert "b-private" not in tried.text and "secret-of-source" not in tried.text, tried.text
        assert "done" in tried.text and f"cannot access '{data}/agent-layers'" in tried.text, tried.text
        assert picture(data / "agent-layers" / layer) == frozen
        assert (Path(b.record.home) / "b.txt").read_text() == "b-private\n"
        for made in (source, a, b):
            await server.remove_agent(made.id)


@pytest.mark.backends("bwrap")
async def test_caps_and_bad_counts_refuse_a_fork_and_leave_nothing(tmp_path, repo, backend):
    data = overlay_data(tmp_path)
    async with opened(tmp_path, settings_file(tmp_path, repo, backend, max=4, per_owner=3)) as server:
        source = await server.make_agent("repo", owner="alice")
        await source.call("r", "shell", {"command": "echo changed > changed.txt"})
        homes = sorted(os.listdir(data / "agent-homes"))
        for n, line in ((0, "^n: the number of agents to fork, 1 to 100, got 0$"),
                        (FORK_MAX_CHILDREN + 1, "got 101$"), (True, "got True$"), ("2", "got '2'$")):
            with pytest.raises(BadInput, match=line):
                await server.fork(source.id, n)
        with pytest.raises(AgentRefused, match="max_per_owner"):
            await server.fork(source.id, 3)  # alice holds 1: 3 more pass her cap of 3
        with pytest.raises(AgentRefused, match=r"agents\.max\b"):
            await server.fork(source.id, 4, owner="bob")  # 1 + 4 pass the server's cap of 4
        with pytest.raises(BadInput, match="no such agent"):
            await server.fork("repo-000000000000", 1)
        assert [a.id for a in await server.list_agents()] == [source.id]
        assert sorted(os.listdir(data / "agent-homes")) == homes and fork_layers_of(data) == []
        assert os.listdir(data / "agent-overlays") == [source.id]
        done = await server.fork(source.id, 2)  # at the cap's edge: 1 + 2 = 3
        assert len(done.agents) == 2 and len(fork_layers_of(data)) == 1
        for made in (source, *done.agents):
            await server.remove_agent(made.id)


async def test_a_running_call_delays_the_fork_which_says_so(tmp_path, repo):
    async with opened(tmp_path, settings_file(tmp_path, repo, "local")) as server:
        source = await server.make_agent("repo")
        running = asyncio.create_task(source.call("r", "shell", {"command": "sleep 1; echo done > slow.txt"}))
        await asyncio.sleep(0.3)
        done = await server.fork(source.id, 1)
        assert "done" in (await running).text or running.done()
        assert done.forked.waited >= 0.4 and "waited" in done.forked.lines()[0]
        assert (Path(done.agents[0].record.home) / "slow.txt").read_text() == "done\n"  # the call's end, forked
        for made in (source, *done.agents):
            await server.remove_agent(made.id)


def test_copies_where_no_overlay_is_and_the_cli_forks_the_settings_own_agent(tmp_path, repo, capsys):
    """The local sandbox gives its home to no uid: children's homes are copies (of the source's
    now, and of a checkpoint written out); `guilds agent fork self N` from the command line."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["cp", "-a", *(str(repo / name) for name in ("run.sh", "fixed.txt", "link-rel", "link-dangling")),
                    str(small)], check=True)
    own = tmp_path / "own-home"
    settings = settings_file(tmp_path, small, "local")
    shutil.copytree(small, own, symlinks=True, dirs_exist_ok=True)
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    assert cli_main(["checkpoint", "--config", str(settings), "start"], env=env) == 0
    assert capsys.readouterr().out.startswith("kept k")
    (own / "later.txt").write_text("after the checkpoint\n")
    at_start = {k: v for k, v in picture(own).items() if k != "later.txt"}
    now = picture(own)
    assert cli_main(["agent", "fork", "self", "2", "--config", str(settings), "--owner", "carol"], env=env) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("forked fork-server into 2 agents, homes by copy") and "no running process" in out[0]
    homes = [Path(line.split(" home ")[1].split()[0]) for line in out[1:]]
    assert len(homes) == 2 and all("owner carol" in line for line in out[1:])
    assert [picture(h) for h in homes] == [now, now]
    assert cli_main(["agent", "fork", "self", "1", "--checkpoint", "start", "--config", str(settings)], env=env) == 0
    out = capsys.readouterr().out.splitlines()
    assert "at checkpoint k" in out[0] and "owner local" in out[1]
    assert picture(Path(out[1].split(" home ")[1].split()[0])) == at_start
    assert cli_main(["agent", "fork", "self", "0", "--config", str(settings)], env=env) == 2
    assert capsys.readouterr().err.strip().endswith("n: the number of agents to fork, 1 to 100, got 0")


def waiting_workers(init_pid: int, server_pid: int) -> set[int]:
    """The pids of a bwrap sandbox's resident helper's children (its workers), as the sandbox
    numbers them; init_pid is the host's pid of the sandbox's init, server_pid the sandbox's of
    the helper."""
    def inside(pid: str) -> int:
        with open(f"/proc/{pid}/status") as status:
            return int(next(line for line in status if line.startswith("NSpid:")).split()[-1])

    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, StopIteration):
            if os.readlink(f"/proc/{pid}/ns/pid") == namespace and inside(pid) == server_pid:
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    return {inside(child) for child in children.read().split()}
    return set()


@pytest.mark.backends("bwrap")
async def test_a_fork_takes_children_from_the_warm_pool_their_sandboxes_and_helpers_as_they_run(
        tmp_path, repo, backend):
    data = overlay_data(tmp_path)
    settings = settings_file(tmp_path, repo, backend)
    settings.write_text(settings.read_text() + "\n[templates.repo.pool]\nspare = 2\nmax = 2\n")
    async with guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)}, pool=True) as server:
        agents = await server.agents()
        pool = agents.pools.pools["repo"]

        async def filled() -> None:
            deadline = asyncio.get_running_loop().time() + 60
            while len(pool.ready) < 2 or pool.making:
                assert asyncio.get_running_loop().time() < deadline, "the pool did not fill"
                await asyncio.sleep(0.05)

        await filled()
        source = await server.make_agent("repo", owner="alice")  # one of the pool's: the pool refills
        edited = await source.call("r", "shell", {"command": EDITS})
        assert "exit_code" not in edited.text, edited.text
        before = picture(Path(source.record.home))
        await filled()
        ready = {p.id: p for p in pool.ready}
        inits = {agent_id: p.toolbox.sandbox.init_pid() for agent_id, p in ready.items()}
        helpers = {agent_id: p.toolbox.transport.channel.pid for agent_id, p in ready.items()}
        workers = {agent_id: waiting_workers(inits[agent_id], helpers[agent_id]) for agent_id in ready}
        assert all(workers.values()), workers  # each pooled helper has a worker waiting for the first call
        for p in ready.values():  # what a pooled agent's home held goes with its old tree
            (Path(p.record.home) / "pool-marker").write_text("the pool's\n")

        done = await server.fork(source.id, 3)
        children = {child.id: child for child in done.agents}
        assert set(ready) < set(children) and len(children) == 3  # two from the pool, one made anew
        assert [c.record.owner for c in done.agents] == ["alice"] * 3
        for agent_id, child in children.items():
            home = Path(child.record.home)
            assert picture(home) == before and owners(home) == {os.stat(home).st_uid}
            seen = await child.call(f"c-{agent_id}", "shell", {"command": "head -1 run.sh; ls pool-marker 2>&1; "
                                                              "git log --format=%s | head -2; echo $PPID"})
            gone = "ls: cannot access 'pool-marker': No such file or directory"
            assert seen.text.split("\n")[:4] == ["# edited", gone, "edits", "the repository"], seen.text
            if agent_id in ready:  # its sandbox and resident helper were not started again
                assert child.toolbox.sandbox.init_pid() == inits[agent_id]
                assert child.toolbox.transport.channel.pid == helpers[agent_id]
                assert int(seen.text.split("\n")[4]) in workers[agent_id]  # the call forked no worker
        first, second = (Path(children[i].record.home) for i in sorted(ready))
        await children[sorted(ready)[0]].call(f"c-{sorted(ready)[0]}", "shell",
                                              {"command": "echo mine > only-first; rm run.sh"})
        assert (first / "only-first").exists() and not (second / "only-first").exists()
        assert (second / "run.sh").read_text().startswith("# edited") and not (first / "run.sh").exists()
        for agent_id in children:
            await server.remove_agent(agent_id)
        await server.remove_agent(source.id)
