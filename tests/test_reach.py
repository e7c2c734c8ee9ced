"""A folder the agent's uid cannot pass: said by name, uid, mode and fix, by the tools
inside a real bwrap sandbox and by ``guilds doctor``; a home under a 0700 folder of
root's that the sandbox makes anew works."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from guilds.config.settings import AgentSettings, Repo
from guilds.fronts import doctor
from guilds.fronts.wiring import Wired
from guilds.sandbox.bwrap.bwrap_argv import sandbox_owner, unavailable
from guilds.sandbox.bwrap.bwrap_reach import out_of_reach
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox
from guilds.sandbox.bwrap.bwrap_users import USER_NAME
from guilds.toolbox.log_reading import read_log
from guilds_code import reach
from toolbox_kit import sandbox_toolbox

NO_BWRAP = unavailable()


def root_bwrap(test):
    """A test of the real bwrap sandbox under a root orchestrator (the agent's uid its own)."""
    for mark in (pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}"),
                 pytest.mark.skipif(os.geteuid() != 0, reason="the agent's uid is its own under root only")):
        test = mark(test)
    return test


def test_blocker_names_the_first_folder_a_uid_cannot_pass(tmp_path):
    way = [str(p) for p in (tmp_path, *tmp_path.parents)]  # pytest's own 0700 folder among them
    outer = tmp_path / "outer"
    (outer / "inner" / "repo").mkdir(parents=True)
    outer.chmod(0o755)
    (outer / "inner").chmod(0o700)
    stop = reach.blocker(str(outer / "inner" / "repo"), 4242, 4242, skip=way)
    assert stop is not None and stop[0] == str(outer / "inner") and stop[1].st_mode & 0o777 == 0o700
    assert reach.blocker(str(outer / "inner" / "repo"), 4242, 4242, skip=[*way, str(outer / "inner")]) is None
    assert reach.blocker(str(outer / "inner" / "repo"), 0, 0) is None  # root passes everything
    (outer / "inner" / "repo").chmod(0o700)
    os.chown(outer / "inner", 4242, 4242)  # its owner passes; the repo, root's 0700, stops it
    assert reach.blocker(str(outer / "inner" / "repo"), 4242, 4242, skip=way)[0] == str(outer / "inner" / "repo")
    os.chown(outer / "inner" / "repo", 4343, 4242)
    (outer / "inner" / "repo").chmod(0o710)  # the group's bits for the group
    assert reach.blocker(str(outer / "inner" / "repo"), 4242, 4242, skip=way) is None
    assert reach.blocker(str(outer / "gone" / "x"), 4242, 4242, skip=way) is None


def test_describe_says_who_what_and_the_two_fixes(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o700)
    st = folder.stat()
    outside = reach.describe(str(folder), st, 4242, home="/elsewhere")
    assert outside == (f"the agent's uid 4242 cannot pass {folder} (drwx------, owned by "
                       f"{reach.owner_name(st.st_uid)}): let it through (chmod o+x {folder}), "
                       "or put the home where that uid can reach it")
    inside = reach.describe(str(folder), st, 4242, home=str(tmp_path))
    assert inside.endswith(f"let it through (chmod o+x {folder}, or chown -R 4242 {folder})")


def _inside_name(uid: int) -> str:
    """The owner's name as the sandbox says it: the host's, or bwrap_users' name for the agent's uid."""
    host = reach.owner_name(uid)
    return USER_NAME if host == f"uid {uid}" else host


def _settings(home: Path, repos: tuple[Repo, ...] = ()) -> AgentSettings:
    return AgentSettings(id="agent1", home=home, sandbox="bwrap", repos=repos)


def _git_init(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)


@root_bwrap
async def test_a_home_under_a_0700_folder_of_roots_in_tmp_works(tmp_path):
    """The home's parents outside the bound system folders are made anew inside (0755)."""
    locked = Path(tempfile.mkdtemp(dir=tmp_path))  # 0700, root's, as mktemp -d makes
    assert locked.stat().st_mode & 0o777 == 0o700
    settings = _settings(locked / "home", (Repo("web", "repos/web", ""),))
    _git_init(locked / "home" / "repos" / "web")
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    assert out_of_reach(settings, data) == []
    async with sandbox_toolbox(settings, data) as toolbox:
        result = await toolbox.call("r1", "shell", {"command": "pwd; id -u"})
        assert not result.is_error, result.text
        assert result.text.splitlines()[:2] == [str(locked / "home" / "repos" / "web"), str(sandbox_owner(settings)[0])]
        read = await toolbox.call("r1", "file_read", {"path": "~/repos/web/.git/HEAD"})
        assert not read.is_error, read.text


def _doctor(tmp_path: Path, home: Path) -> tuple[int, str]:
    """`guilds doctor` on a settings file with this home: its exit status and its reach line."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nhome = "{home}"\nsandbox = "bwrap"\n')
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    env.pop("GUILDS_DATABASE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "doctor", "--config", str(config)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    reach_lines = [line for line in proc.stdout.splitlines() if "agent's reach" in line]
    return proc.returncode, reach_lines[0] if reach_lines else proc.stdout + proc.stderr


@pytest.fixture
def opt_locked() -> Iterator[Path]:
    """A 0700 folder of root's under /opt, a folder the sandbox binds from the host as it is."""
    if not os.access("/opt", os.W_OK):
        pytest.skip("/opt is not writable here")
    locked = Path(tempfile.mkdtemp(dir="/opt", prefix="guilds-reach-"))
    try:
        yield locked
    finally:
        shutil.rmtree(locked, ignore_errors=True)


@root_bwrap
async def test_a_home_under_a_0700_folder_in_opt_is_said_by_every_tool(opt_locked, tmp_path):
    home = opt_locked / "home"
    _git_init(home / "repos" / "web")
    settings = _settings(home, (Repo("web", "repos/web", ""),))
    uid = sandbox_owner(settings)[0]
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    reason = (f"the agent's uid {uid} cannot pass {opt_locked} (drwx------, owned by root): "
              f"let it through (chmod o+x {opt_locked}), or put the home where that uid can reach it")
    assert out_of_reach(settings, data) == [(f"home {home}", *reason.split(": ", 1))]
    async with sandbox_toolbox(settings, data) as toolbox:
        task = await toolbox.call("r1", "code_task", {"brief": "say hi"})
        assert task.is_error and task.text.splitlines()[0] == (
            f"repo: the folder of web, {home}/repos/web, is out of reach: {reason}")
        read = await toolbox.call("r1", "file_read", {"path": "~/repos/web/.git/HEAD"})
        assert read.is_error and read.text.splitlines()[0] == f"home {home} cannot be opened: {reason}"
        shell = await toolbox.call("r1", "shell", {"command": "true"})
        assert shell.is_error and reason in shell.text.splitlines()[0], shell.text
        doctor_line = f"no   agent's reach: home {home}: {reason.replace(': let', ' -> let', 1)}"
        assert _doctor(tmp_path, home) == (1, doctor_line)
        opt_locked.chmod(0o711)  # the fix it names
        assert _doctor(tmp_path, home)[0] == 0
        assert out_of_reach(settings, data) == []
        shell = await toolbox.call("r1", "shell", {"command": "pwd"})
        assert not shell.is_error and shell.text.splitlines()[0] == str(home / "repos" / "web"), shell.text


@root_bwrap
async def test_a_root_folder_inside_the_home_is_said_with_the_uid_and_the_chown(tmp_path):
    home = tmp_path / "home"
    settings = _settings(home, (Repo("web", "work/web", ""),))
    uid = sandbox_owner(settings)[0]
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    async with sandbox_toolbox(settings, data) as toolbox:
        first = await toolbox.call("r1", "shell", {"command": "true"})  # the home is the agent's now
        assert not first.is_error, first.text
        work = home / "work"  # made by root afterwards, 0700
        work.mkdir(mode=0o700)
        _git_init(work / "web")
        (home / "root-only.txt").write_text("secret\n")
        (home / "root-only.txt").chmod(0o600)
        reason = (f"the agent's uid {uid} cannot pass {work} (drwx------, owned by root): "
                  f"let it through (chmod o+x {work}, or chown -R {uid} {work})")
        task = await toolbox.call("r1", "code_task", {"brief": "say hi"})
        assert task.text.splitlines()[0] == f"repo: the folder of web, {work}/web, is out of reach: {reason}"
        read = await toolbox.call("r1", "file_read", {"path": "~/work/web/.git/HEAD"})
        assert read.text.splitlines()[0] == f"path: ~/work/web/.git/HEAD cannot be opened: {reason}"
        denied = await toolbox.call("r1", "file_read", {"path": "~/root-only.txt"})
        assert denied.text.splitlines()[0] == (
            f"path: ~/root-only.txt cannot be opened: the agent's uid {uid} may not read it "
            f"(-rw-------, owned by root): chmod o+r it, or chown it to {uid}")
        run_dir = home / ".runs" / "r9"  # a run's folder made by root: the app's log reader says so
        run_dir.mkdir(mode=0o700, parents=True)
        (run_dir / "c1.log").write_text("out\n")
        envelope = await read_log(toolbox, str(run_dir / "c1.log"))
        assert envelope == {"ok": False, "error": (
            f"The log cannot be read: the agent's uid {uid} cannot pass {run_dir} (drwx------, owned by root): "
            f"let it through (chmod o+x {run_dir}, or chown -R {uid} {run_dir}).")}
        assert out_of_reach(settings, data) == [(f"repos.web {work}/web", *reason.split(": ", 1))]
        wired = Wired(settings=settings, data_dir=data, env={}, coding=lambda: True)
        lines = [c.line() for c in BwrapSandbox.check_agent(settings, data)]
        assert lines == [f"no   agent's reach: repos.web {work}/web: {reason.replace(': let', ' -> let', 1)}"]
        report = await asyncio.to_thread(doctor.examine, wired)  # it runs a loop of its own
        assert not report.ok


@root_bwrap
async def test_code_search_of_a_folder_the_agent_cannot_enter_names_it(tmp_path):
    home = tmp_path / "home"
    settings = _settings(home)
    uid = sandbox_owner(settings)[0]
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    async with sandbox_toolbox(settings, data) as toolbox:
        made = await toolbox.call("r1", "shell",
                                  {"command": "mkdir -p mine/a && echo needle > mine/a/x && chmod 000 mine"})
        assert not made.is_error, made.text
        own = await toolbox.call("r1", "code_search", {"pattern": "needle", "path": "mine"})
        assert own.is_error and own.text.splitlines()[0] == (
            f"path: mine cannot be entered: the agent's uid {uid} cannot pass {home}/mine "
            f"(d---------, owned by {_inside_name(uid)}): let it through (chmod u+rx {home}/mine)")
        roots = home / "roots"  # made by root, 0700
        roots.mkdir(mode=0o700)
        theirs = await toolbox.call("r1", "code_search", {"pattern": "needle", "path": "~/roots", "mode": "content"})
        assert theirs.is_error and theirs.text.splitlines()[0] == (
            f"path: ~/roots cannot be entered: the agent's uid {uid} cannot pass {roots} (drwx------, owned by root): "
            f"let it through (chmod o+x {roots}, or chown -R {uid} {roots})")
        fixed = await toolbox.call("r1", "shell", {"command": "chmod u+rx mine"})
        assert not fixed.is_error
        found = await toolbox.call("r1", "code_search", {"pattern": "needle", "path": "mine"})
        assert not found.is_error and found.text.splitlines()[0] == "mine/a/x: 1 match", found.text
