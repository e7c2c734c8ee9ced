"""Every E2B sandbox is an agent made on demand: the unmodified E2B Python SDK against a
real `guilds serve --e2b` whose settings serve a template besides their own agent.
Each `Sandbox.create()` (``base``: the default template, the settings file's own agent;
or a template's name) gets an agent of its own: its own home, a copy of the template's,
its own sandbox; kill removes it and everything of it; the key is its owner; its row in
the run record carries the sandbox's end as its expiry; the agents' caps are the
sandboxes' caps, answered 429 in E2B's body; a storm of creates past a cap leaves
nothing half made."""

from __future__ import annotations

import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException

from e2b_kit import BACKENDS, E2BServer, e2b_server, folder_key, home_of, pids_alive, pids_in, services_of
from guilds.web.endpoint_lock import TOKEN_FILE

pytestmark = [pytest.mark.slow, pytest.mark.backends(*BACKENDS)]


def _template_homes(folder: Path) -> str:
    """The default template's home (the agent's) and the template py's, each with a file;
    the settings' lines serving py."""
    (folder / "home").mkdir()
    (folder / "home" / "hello.txt").write_text("from the default template\n")
    (folder / "py-home").mkdir()
    (folder / "py-home" / "app.py").write_text("print('template')\n")
    return f'[templates.py.agent]\nhome = "{folder / "py-home"}"\n'


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"e2b-agents-{backend}")
    settings = _template_homes(folder) + f'sandbox = "{backend}"\n[agents]\nmax_per_owner = 3\nmax = 5\n'
    with e2b_server(folder, backend, settings) as served:
        yield served


@pytest.fixture
def env(server: E2BServer, monkeypatch):
    server.export(monkeypatch)


def _agents(server: E2BServer) -> dict[str, tuple]:
    """Each agent's (template, owner, status, expires_at) as the run record holds them."""
    with sqlite3.connect(server.data / "guilds.db") as conn:
        return {row[0]: row[1:] for row in conn.execute("SELECT id, template, owner, status, expires_at FROM agents")}


def _expiry(server: E2BServer, agent_id: str) -> datetime | None:
    at = _agents(server)[agent_id][3]
    return None if at is None else datetime.fromisoformat(at).replace(tzinfo=UTC)


def _torn_down(data: Path, agent_id: str, seconds: float = 30) -> str:
    """The agent's status once its row is no longer retiring (a kill's teardown runs after its answer)."""
    deadline = time.monotonic() + seconds
    while True:
        with sqlite3.connect(data / "guilds.db") as conn:
            status = conn.execute("SELECT status FROM agents WHERE id = ?", (agent_id,)).fetchone()[0]
        if status != "retiring" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_each_sandbox_is_an_agent_of_its_own_and_kill_removes_it(server, env):
    first, second, named = Sandbox.create(timeout=120), Sandbox.create(timeout=120), \
        Sandbox.create(template="py", timeout=120)
    try:
        homes = [home_of(box, server.data) for box in (first, second, named)]
        assert len(set(homes)) == 3 and all(h.parent == server.data / "agent-homes" for h in homes)
        assert first.files.read("hello.txt") == "from the default template\n"
        first.files.write("note.txt", "first only")
        assert second.commands.run("ls").stdout.split() == ["hello.txt"]
        assert named.commands.run("ls").stdout.split() == ["app.py"]
        assert not (server.data.parent / "home" / "note.txt").exists()  # the template's home is its own
        made = _agents(server)
        assert sorted(made[h.name][:3] for h in homes) == [("default", "e2b:default", "live")] * 2 + [
            ("py", "e2b:default", "live")]
        assert (first.get_info().template_id, named.get_info().template_id) == ("base", "py")
    finally:
        first.kill()
    assert _torn_down(server.data, homes[0].name) == "removed"
    assert not homes[0].exists() and not (server.data / "agents" / f"{homes[0].name}.json").exists()
    assert second.files.read("hello.txt") == "from the default template\n"  # the others run on
    second.kill()
    named.kill()


def test_the_agent_s_expiry_is_the_sandbox_s_end_kept_up_to_date(server, env):
    box = Sandbox.create(timeout=120)
    try:
        agent_id = home_of(box, server.data).name
        assert _expiry(server, agent_id) == box.get_info().end_at
        box.set_timeout(600)
        end = box.get_info().end_at
        assert _expiry(server, agent_id) == end
        assert abs(end - datetime.now(UTC) - timedelta(seconds=600)) < timedelta(seconds=10)
        Sandbox.connect(box.sandbox_id, timeout=60)  # a connect never shortens it: nothing changes
        assert _expiry(server, agent_id) == end
        box.beta_pause()
        assert _expiry(server, agent_id) is None  # a paused sandbox waits to be resumed
        again = Sandbox.connect(box.sandbox_id, timeout=300)
        assert _expiry(server, agent_id) == again.get_info().end_at
    finally:
        box.kill()
    assert _torn_down(server.data, agent_id) == "removed"


def test_a_key_s_sandboxes_and_the_server_s_are_capped_in_e2b_s_own_error_form(server, env):
    boxes = [Sandbox.create(timeout=120) for _ in range(3)]
    try:
        with pytest.raises(RateLimitException, match=r"owner 'e2b:default' holds 3 agents, .*agents\.max_per_owner"):
            Sandbox.create(template="py", timeout=120)
        others = [Sandbox.create(timeout=120, api_key=server.other_key) for _ in range(2)]  # another owner
        raw = httpx.post(f"{server.url}/sandboxes", json={}, headers={"X-API-KEY": server.other_key})
        assert (raw.status_code, raw.json()) == (429, {"code": 429, "message": "sandbox limit reached: this server "
                                                       "holds 5 agents, its most (agents.max); remove one first"})
        for box in others:
            box.kill()
    finally:
        for box in boxes:
            box.kill()
    assert [a for a in _agents(server).values() if a[2] == "live"] == []


def test_an_unknown_template_names_those_served(server, env):
    with pytest.raises(SandboxException, match=r"^404: template 'nope' not found: this server serves 'base' and "
                                               r"'e2b\w+' and 'py'$"):
        Sandbox.create(template="nope")
    with pytest.raises(SandboxException, match=r"^404: template 'default' not found"):
        Sandbox.create(template="default")  # the settings' own name for it is no E2B template id


def test_a_key_never_sees_nor_reaches_another_key_s_sandbox(server, env):
    box = Sandbox.create(timeout=120)
    try:
        other = {"X-API-KEY": server.other_key}
        url = f"{server.url}/sandboxes/{box.sandbox_id}"
        tries = [httpx.get(url, headers=other), httpx.delete(url, headers=other),
                 httpx.post(f"{url}/timeout", json={"timeout": 1}, headers=other),
                 httpx.post(f"{url}/pause", headers=other), httpx.post(f"{url}/resume", json={}, headers=other),
                 httpx.post(f"{url}/connect", json={"timeout": 1}, headers=other)]
        for answer in tries:
            assert (answer.status_code, answer.json()) == (404, {"code": 404,
                                                                 "message": f"sandbox '{box.sandbox_id}' not found"})
        assert box.sandbox_id not in [s["sandboxID"] for s in httpx.get(f"{server.url}/sandboxes",
                                                                         headers=other).json()]
        assert box.is_running() and box.commands.run("echo still").stdout == "still\n"
        assert box.get_info().end_at > datetime.now(UTC) + timedelta(seconds=60)  # its timeout untouched
    finally:
        box.kill()


def _kill_or_connect(sandbox_id: str, turn: int) -> str:
    try:
        if turn == 2:
            Sandbox.kill(sandbox_id)
            return "killed"
        Sandbox.connect(sandbox_id)
        return "resumed"
    except SandboxException as exc:  # SandboxNotFoundException: killed first
        return type(exc).__name__


def test_a_kill_among_resumes_leaves_nothing_of_its_agent(server, env):
    box = Sandbox.create(timeout=120)
    home = home_of(box, server.data)
    key = folder_key(home)
    box.beta_pause()
    with ThreadPoolExecutor(5) as pool:
        tried = list(pool.map(lambda turn: _kill_or_connect(box.sandbox_id, turn), range(5)))
    assert tried[2] == "killed" and set(tried) <= {"killed", "resumed", "SandboxNotFoundException"}, tried
    assert _torn_down(server.data, home.name) == "removed" and not home.exists()
    time.sleep(0.5)  # a sandbox or service started by a late resume would be up by now
    assert pids_in(key) == [] and not list(server.data.glob(f"sandboxes/{home.name}*"))


def _try_create() -> Sandbox | Exception:
    try:
        return Sandbox.create(timeout=120)
    except RateLimitException as exc:
        return exc


def _left_of(data: Path, agent_ids: set[str]) -> list[str]:
    """What of these agents is on disk: homes, entries, sandbox and egress files."""
    found = list((data / "agent-homes").iterdir()) if (data / "agent-homes").exists() else []
    for folder in ("agents", "sandboxes", "egress"):
        found += [p for p in (data / folder).glob("*") if p.name.split(".")[0] in agent_ids] \
            if (data / folder).exists() else []
    return [str(p) for p in found]


@pytest.mark.backends("bwrap")
def test_a_storm_of_creates_past_the_cap_makes_exactly_the_cap_and_leaves_nothing_half_made(tmp_path, backend,
                                                                                              monkeypatch):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hello.txt").write_text("hello\n")
    with e2b_server(tmp_path, backend, 'network = ["example.invalid"]\n[agents]\nmax_per_owner = 10\n') as served:
        served.export(monkeypatch)
        with ThreadPoolExecutor(30) as pool:  # thirty at once, past a cap of ten
            tried = list(pool.map(lambda _: _try_create(), range(30)))
        made = [box for box in tried if isinstance(box, Sandbox)]
        refused = [exc for exc in tried if isinstance(exc, RateLimitException)]
        assert (len(made), len(refused)) == (10, 20), tried
        rows = _agents(served)
        assert sorted(row[:3] for row in rows.values()) == [("default", "e2b:default", "live")] * 10
        homes = sorted(p.name for p in (served.data / "agent-homes").iterdir())
        assert homes == sorted(rows) and all((served.data / "egress" / h).is_dir() for h in homes)
        assert all(box.files.read("hello.txt") == "hello\n" for box in made)
        others = {p.name for p in (served.data / "egress").iterdir()} - set(rows) - {"ca"}
        assert len(others) == 1 and "-" not in others.pop()  # the server's own agent's: none of a refused one
        homes_folder = str(served.data / "agent-homes")
        assert len(pids_alive(homes_folder)) >= 10  # each sandbox's bwrap names its home
        with ThreadPoolExecutor(10) as pool:  # the ten killed at once
            list(pool.map(lambda box: box.kill(), made))
        assert pids_alive(homes_folder) == []  # every kill answered: every sandbox of them ended
        assert [_torn_down(served.data, agent_id) for agent_id in rows] == ["removed"] * 10
        assert _left_of(served.data, set(rows)) == []


@pytest.mark.backends("bwrap")
def test_a_kill_answers_once_every_process_of_its_sandbox_is_ended_and_its_files_go_after(server, env):
    box = Sandbox.create(timeout=120)
    home, marker = home_of(box, server.data), f"killed-{time.monotonic_ns()}"
    box.commands.run(f"bash -c 'sleep 600; :' {marker}", background=True)
    deadline = time.monotonic() + 10
    while not pids_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_alive(marker)
    box.kill()
    assert pids_alive(marker) == [] and pids_alive(str(home)) == []  # at the kill's answer
    assert _agents(server)[home.name][2] in ("retiring", "removed")
    assert box.sandbox_id not in [listed.sandbox_id for listed in Sandbox.list().next_items()]
    with pytest.raises(SandboxException):
        Sandbox.connect(box.sandbox_id)
    assert _torn_down(server.data, home.name) == "removed"
    assert [left for left in _left_of(server.data, {home.name}) if home.name in left] == []


@pytest.mark.backends("local")
def test_a_server_s_start_removes_the_agents_a_killed_server_left(tmp_path, monkeypatch, backend):
    settings = _template_homes(tmp_path) + f'sandbox = "{backend}"\n'
    with e2b_server(tmp_path, backend, settings) as first:
        first.export(monkeypatch)
        homes = [home_of(Sandbox.create(template=name, timeout=120), first.data) for name in ("base", "py")]
        first.proc.kill()  # no shutdown: the agents are left live in the record
        first.proc.wait()
    assert sorted(row[:3] for row in _agents(first).values()) == [("default", "e2b:default", "live"),
                                                                  ("py", "e2b:default", "live")]
    assert all(row[3] is not None for row in _agents(first).values())  # each with its expiry: any reaper's
    with e2b_server(tmp_path, backend, settings) as second:
        assert [row[2] for row in _agents(second).values()] == ["removed"] * 2
        assert not any(home.exists() for home in homes)


def _create_quietly() -> Sandbox | Exception:
    try:
        return Sandbox.create(timeout=120)
    except Exception as exc:  # noqa: BLE001 - the server stops under it: whatever the SDK raises
        return exc


@pytest.mark.backends("bwrap")
def test_a_server_stopped_in_the_middle_of_creates_leaves_nothing_behind(tmp_path, backend, monkeypatch):
    with e2b_server(tmp_path, backend, "[agents]\nmax_per_owner = 20\n") as served:
        served.export(monkeypatch)
        with ThreadPoolExecutor(12) as pool:
            tries = [pool.submit(_create_quietly) for _ in range(12)]
            time.sleep(0.3)  # some made, some being made
            served.proc.send_signal(signal.SIGTERM)
            assert served.proc.wait(60) in (0, -signal.SIGTERM)  # its shutdown done, the signal raised again
            for tried in tries:
                tried.result()
        rows = _agents(served)
        assert rows and all(row[2] == "removed" for row in rows.values()), rows  # begun, then all removed
        assert _left_of(served.data, set(rows)) == [] and pids_alive(str(served.data / "agent-homes")) == []


@pytest.mark.backends("bwrap")
def test_a_sandbox_of_a_pooled_template_finds_its_process_service_started_ahead(tmp_path, backend, monkeypatch):
    (tmp_path / "fast-home").mkdir()
    settings = (f'[templates.fast.agent]\nhome = "{tmp_path / "fast-home"}"\nsandbox = "{backend}"\n'
                "[templates.fast.pool]\nspare = 2\nmax = 4\n")
    with e2b_server(tmp_path, backend, settings) as served:
        served.export(monkeypatch)
        deadline = time.monotonic() + 60
        while len(services_of(served.data)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        ahead = services_of(served.data)
        assert len(ahead) == 2, ahead  # the pool's two, each its service up before any create
        box = Sandbox.create(template="fast", timeout=120)
        home = str(home_of(box, served.data))
        assert ahead.get(home) == services_of(served.data)[home]  # the very service started ahead
        assert box.commands.run("echo taken").stdout == "taken\n"
        key = folder_key(home)
        box.kill()
        assert pids_in(key) == []


def _pool_counts(server: E2BServer, template: str) -> tuple[float, float]:
    """The pool's (ready agents, hits) as the server's /metrics says them."""
    token = (server.data / TOKEN_FILE).read_text().strip()
    text = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {token}"}, timeout=10).text
    found = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line.startswith("guilds_pool_")}
    return (found.get(f'guilds_pool_agents{{state="ready",template="{template}"}}', 0.0),
            found.get(f'guilds_pool_hits_total{{template="{template}"}}', 0.0))


@pytest.mark.backends("bwrap", "docker")
def test_a_create_without_a_template_is_served_from_the_default_template_s_pool(tmp_path, backend, monkeypatch):
    """``[pool]`` at the top of the settings is the default template's (E2B's ``base``): a bare
    ``Sandbox.create()`` adopts one of its agents, each as isolated as any other."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hello.txt").write_text("from the default template\n")
    with e2b_server(tmp_path, backend, "[pool]\nspare = 2\nmax = 4\n") as served:
        served.export(monkeypatch)
        deadline = time.monotonic() + 120
        while _pool_counts(served, "default")[0] < 2:
            assert time.monotonic() < deadline, "the default template's pool never filled"
            time.sleep(0.1)
        pooled = {agent_id for agent_id, row in _agents(served).items() if row[2] == "pooled"}
        assert len(pooled) == 2 and {_agents(served)[i][0] for i in pooled} == {"default"}
        first, second = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
        try:
            homes = [home_of(box, served.data) for box in (first, second)]
            assert {home.name for home in homes} == pooled  # the very agents made ahead
            assert _pool_counts(served, "default")[1] == 2
            assert all(_agents(served)[home.name][:3] == ("default", "e2b:default", "live") for home in homes)
            assert first.get_info().template_id == "base"
            assert first.files.read("hello.txt") == "from the default template\n"
            first.files.write("note.txt", "first only")
            assert second.commands.run("ls").stdout.split() == ["hello.txt"]
            first.commands.run("sleep 300.4242", background=True)
            peek = second.commands.run(f"cat {homes[0]}/note.txt 2>&1; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
            assert "first only" not in peek.stdout and "300.4242" not in peek.stdout  # nor its files, nor its processes
            if backend == "bwrap":  # docker: every container runs its commands as one uid of its own
                assert second.commands.run("id -u").stdout != first.commands.run("id -u").stdout
        finally:
            first.kill()
            second.kill()
        assert [_torn_down(served.data, home.name) for home in homes] == ["removed"] * 2
        assert not any(home.exists() for home in homes)
