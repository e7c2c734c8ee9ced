"""What a bwrap sandbox hides of the agents a data folder knows: the rules on real folders
(a temporary folder standing for a bound system folder), then from inside a real
sandbox with agents kept under /opt, as an agent's commands would try to read them."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from guilds.config.agents import KnownAgent, forget, known, remember
from guilds.config.settings import parse_settings
from guilds.fronts.wiring import open_toolbox, resolve
from guilds.sandbox.bwrap.bwrap_argv import agent_uid, unavailable
from guilds.sandbox.bwrap.bwrap_hide import Hiding, hiding, stamp

NO_BWRAP = unavailable()
SECRET_A, SECRET_B = "a-secret-5d1e77c0", "b-secret-93c1f0aa"


def folders(root: Path, *names: str) -> list[str]:
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    return [str(root / name) for name in names]


def test_other_homes_and_settings_folders_are_hidden_the_own_home_is_not(tmp_path):
    opt = tmp_path / "opt"
    a_home, b_home, b_folder = folders(opt, "agents/a/home", "agents/b/home", "conf/b")
    (opt / "agents/a/agent.toml").write_text("")
    (opt / "conf/b/agent.toml").write_text("")
    agents = [KnownAgent("a", a_home, str(opt / "agents/a/agent.toml")),
              KnownAgent("b", b_home, str(opt / "conf/b/agent.toml"))]
    hidden = hiding(a_home, "/data", agents, [(str(opt), None)])
    assert hidden == Hiding(("/data", b_home, str(opt / "agents/a"), b_folder), ())


def test_a_settings_file_right_in_a_system_folder_is_hidden_alone(tmp_path):
    opt = tmp_path / "opt"
    (a_home,) = folders(opt, "a/home")
    (opt / "b.toml").write_text("")
    agents = [KnownAgent("b", str(opt / "b-home-never-made"), str(opt / "b.toml"))]
    assert hiding(a_home, "/data", agents, [(str(opt), None)]) == Hiding(("/data",), (str(opt / "b.toml"),))


def test_nothing_out_of_reach_and_nothing_above_a_system_folder_is_hidden(tmp_path):
    opt, elsewhere = tmp_path / "opt", tmp_path / "srv"
    (a_home,) = folders(opt, "a/home")
    folders(elsewhere, "b/home")
    (elsewhere / "b/agent.toml").write_text("")
    agents = [KnownAgent("b", str(elsewhere / "b/home"), str(elsewhere / "b/agent.toml")),
              KnownAgent("c", str(tmp_path), None)]  # a home above /opt: hiding it would hide the toolchain
    assert hiding(a_home, "/data", agents, [(str(opt), None)]) == Hiding(("/data",), ())


def test_a_settings_file_in_the_home_is_hidden_alone_and_an_agent_inside_the_home_too(tmp_path):
    opt = tmp_path / "opt"
    a_home, b_home = folders(opt, "a/home", "a/home/b")
    (opt / "a/home/agent.toml").write_text("")
    agents = [KnownAgent("a", a_home, str(opt / "a/home/agent.toml")), KnownAgent("b", b_home, None)]
    assert hiding(a_home, str(opt / "a"), agents, [(str(opt), None)]) == Hiding(
        (str(opt / "a"), b_home), (str(opt / "a/home/agent.toml"),))


def test_a_replaced_file_changes_the_stamp(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text("one")
    before = stamp(Hiding((), (str(path),)))
    path.with_name("new").write_text("two")
    os.replace(path.with_name("new"), path)
    assert stamp(Hiding((), (str(path),))) != before
    path.unlink()
    assert stamp(Hiding((), (str(path),))) == [(str(path), 0)]


def test_the_data_folder_remembers_each_agent_once(tmp_path):
    settings = parse_settings({"agent": {"id": "a7", "home": "h"}}, tmp_path, env={})
    remember(tmp_path, settings, tmp_path / "a7.toml")
    remember(tmp_path, settings, tmp_path / "a7.toml")
    (tmp_path / "agents" / "broken.json").write_text("{not json")
    assert known(tmp_path) == (KnownAgent("a7", str(tmp_path / "h"), str(tmp_path / "a7.toml")),)
    assert (tmp_path / "agents" / "a7.json").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path / "agents")) == ["a7.json", "broken.json"]


def test_the_known_list_follows_each_entry_written_again_removed_or_added(tmp_path):
    first = parse_settings({"agent": {"id": "a7", "home": "h"}}, tmp_path, env={})
    remember(tmp_path, first, None)
    assert known(tmp_path) == (KnownAgent("a7", str(tmp_path / "h"), None),)
    moved = parse_settings({"agent": {"id": "a7", "home": "elsewhere"}}, tmp_path, env={})
    remember(tmp_path, moved, tmp_path / "a7.toml")  # the same entry written again: read again
    other = parse_settings({"agent": {"id": "b8", "home": "g"}}, tmp_path, env={})
    remember(tmp_path, other, None)
    assert known(tmp_path) == (KnownAgent("a7", str(tmp_path / "elsewhere"), str(tmp_path / "a7.toml")),
                               KnownAgent("b8", str(tmp_path / "g"), None))
    forget(tmp_path, "a7")
    assert known(tmp_path) == (KnownAgent("b8", str(tmp_path / "g"), None),)


def test_homes_in_the_data_folder_hide_with_it_unless_the_home_puts_them_back(tmp_path):
    opt = tmp_path / "opt"
    a_home, b_home, c_home = folders(opt, "data/agent-homes/a", "data/agent-homes/b", "data/agent-homes/a/c")
    agents = [KnownAgent(i, h, None) for i, h in (("a", a_home), ("b", b_home), ("c", c_home))]
    assert hiding(a_home, str(opt / "data"), agents, [(str(opt), None)]) == Hiding((str(opt / "data"), c_home), ())


# --- from inside a real sandbox ------------------------------------------------------------
@pytest.fixture
def under_opt():
    """Folders made under the host's /opt (bound whole into every bwrap sandbox), removed after."""
    if not os.access("/opt", os.W_OK):
        pytest.skip("/opt is not writable here")
    made: list[Path] = []

    def make(suffix: str = "") -> Path:
        path = Path(tempfile.mkdtemp(dir="/opt", prefix="guilds-hide-", suffix=suffix))
        path.chmod(0o755)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def agent_file(path: Path, agent: str, home: Path, secret: str, owner: int) -> Path:
    """A settings file 0600, owned by owner: the uid of the agent's commands, as every agent's
    is when the orchestrator is not root (one uid in a user namespace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f'[agent]\nid = "{agent}"\nhome = "{home}"\nsandbox = "bwrap"\n[secrets]\nSECRET = "{secret}"\n')
    os.chown(path, owner, owner)
    return path


@pytest.mark.bwrap
@pytest.mark.skipif(NO_BWRAP is not None or os.geteuid() != 0, reason=f"needs root and bwrap ({NO_BWRAP})")
async def test_an_agent_reads_neither_its_own_settings_nor_another_agents_files(tmp_path, under_opt):
    root = under_opt()
    a_id, b_id = f"hide-a-{os.getpid()}", f"hide-b-{os.getpid()}"
    uid = agent_uid(a_id)
    b_home = root / "b" / "home"
    b_home.mkdir(parents=True)
    (b_home / "notes.txt").write_text(f"b's work {SECRET_B}\n")
    for path in (root / "b", b_home, b_home / "notes.txt"):
        os.chown(path, uid, uid)  # readable to A's uid, were it not hidden
    b_file = agent_file(Path(f"{root}-b.toml"), b_id, b_home, SECRET_B, uid)  # right in /opt: hidden alone
    a_file = agent_file(root / "a" / "agent.toml", a_id, root / "a" / "home", SECRET_A, uid)
    data = tmp_path / "data"
    sizes = f"for f in {a_file} {b_file} {b_home}/notes.txt; do cat $f 2>/dev/null | wc -c; done"
    try:
        async with open_toolbox(resolve(b_file, data_dir=data, env={})):
            pass  # B's server opened once: the data folder knows B
        async with open_toolbox(resolve(a_file, data_dir=data, env={})) as toolbox:
            script = f"{sizes}; ls -A {root}/a {b_home}; grep -rs secret {root} {b_file}; echo done"
            first = await toolbox.call("r1", "shell", {"command": script})
            replaced = a_file.with_name("agent.toml.new")  # an editor's save: a new file renamed over it
            agent_file(replaced, a_id, root / "a" / "home", SECRET_A, uid)
            os.replace(replaced, a_file)  # its folder is hidden, not the file: the new one is hidden too
            again = await toolbox.call("r1", "shell", {"command": f"{sizes}; echo done"})
            await toolbox.sandbox.stop()
    finally:
        b_file.unlink(missing_ok=True)
    assert first.text.splitlines()[:7] == ["0", "0", "0", f"{root}/a:", "home", "", f"{b_home}:"], first.text
    assert again.text.splitlines()[:4] == ["0", "0", "0", "done"], again.text
    for result in (first, again):
        assert SECRET_A not in result.text and SECRET_B not in result.text, result.text
