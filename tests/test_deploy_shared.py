"""Two `guilds serve --e2b --e2b-shared` on one run record and one token, as a deployment's
replicas are (docs/deploy.md), on this machine: an E2B sandbox made through one is served
by the other, outlives the stop of the one that made it, and is not removed by a start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2b_kit import _read_exports

TOKEN = "shared-token-of-the-replicas-0123456789"


def servers_files(folder: Path, agent_id: str = "replicated") -> dict[str, str]:
    """What the servers share: their settings file (an agent on local), the record's URL."""
    config = folder / "agent.toml"
    config.write_text(f'[agent]\nid = "{agent_id}"\nhome = "{folder / "home"}"\nsandbox = "local"\n')
    config.chmod(0o600)
    return {"config": str(config), "url": f"sqlite:///{folder / 'shared.db'}", "folder": str(folder)}


@pytest.fixture
def shared(tmp_path: Path) -> dict[str, str]:
    return servers_files(tmp_path)


@contextlib.contextmanager
def replica(shared: dict[str, str], name: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A server of its own data folder (the shared token in it): (its process, its URL)."""
    data = Path(shared["folder"], name)
    data.mkdir(mode=0o700)
    (data / "serve.token").write_text(TOKEN + "\n")
    (data / "serve.token").chmod(0o600)
    env = {**os.environ, "GUILDS_DATA": str(data), "GUILDS_DATABASE_URL": shared["url"]}
    proc = subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--config",
                             shared["config"], "--e2b", "--e2b-shared", "--e2b-key", "other"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        found = _read_exports(proc)
        assert "E2B_API_URL" in found, found["printed"]
        yield proc, found["E2B_API_URL"]
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def on(url: str) -> dict[str, str]:
    return {"api_url": url, "sandbox_url": url}


def test_a_sandbox_made_through_one_server_is_served_by_the_other(shared, monkeypatch):
    from e2b import Sandbox

    from guilds.fronts.e2b.keys import api_key

    monkeypatch.setenv("E2B_API_KEY", api_key(TOKEN, "default"))
    with replica(shared, "a") as (a, url_a):
        made = Sandbox.create(timeout=300, **on(url_a))
        made.files.write("note.txt", "made through a\n")
        with replica(shared, "b") as (_, url_b):  # its start removes nothing of a's
            assert made.sandbox_id in [box.sandbox_id for box in Sandbox.list(**on(url_b)).next_items()]
            there = Sandbox.connect(made.sandbox_id, **on(url_b))
            assert there.commands.run("cat note.txt").stdout == "made through a\n"
            before = Sandbox.get_info(made.sandbox_id, **on(url_a)).end_at
            there.set_timeout(900)
            assert Sandbox.get_info(made.sandbox_id, **on(url_a)).end_at > before
            stop(a)  # the server that made it stops: the sandbox lives on
            assert there.commands.run("cat note.txt").stdout == "made through a\n"
            there.kill()
            assert not there.is_running()
            assert made.sandbox_id not in [box.sandbox_id for box in Sandbox.list(**on(url_b)).next_items()]
            with pytest.raises(Exception, match="not found"):
                Sandbox.connect(made.sandbox_id, **on(url_b))


def test_a_create_repeated_through_the_other_server_answers_the_same_sandbox(shared):
    """An Idempotency-Key is the record's: the repeat, sent together or after, to the other
    server, answers the one sandbox; another body under the key is refused there too."""
    import concurrent.futures

    import httpx

    from guilds.fronts.e2b.keys import api_key

    headers = {"X-API-KEY": api_key(TOKEN, "default"), "Idempotency-Key": "job-42"}

    def create(url: str, body: dict) -> httpx.Response:
        return httpx.post(f"{url}/sandboxes", json=body, headers=headers, timeout=120)

    with replica(shared, "a") as (_, url_a), replica(shared, "b") as (_, url_b):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            together = list(pool.map(create, (url_a, url_b), ({"timeout": 120},) * 2))
        assert sorted(answer.status_code for answer in together) == [201, 201]
        assert len({answer.json()["sandboxID"] for answer in together}) == 1
        assert sorted(answer.headers.get("Idempotent-Replayed", "") for answer in together) == ["", "true"]
        after = create(url_a, {"timeout": 120})
        assert after.json()["sandboxID"] == together[0].json()["sandboxID"]
        assert after.json()["envdAccessToken"] == together[0].json()["envdAccessToken"]
        assert create(url_b, {"timeout": 60}).status_code == 422
        sandbox_id = after.json()["sandboxID"]
        killed = httpx.delete(f"{url_b}/sandboxes/{sandbox_id}", headers=headers, timeout=60)
        assert killed.status_code == 204
        anew = create(url_a, {"timeout": 120})  # its sandbox ended: the key makes another
        assert anew.status_code == 201 and anew.json()["sandboxID"] != sandbox_id
        httpx.delete(f"{url_a}/sandboxes/{anew.json()['sandboxID']}", headers=headers, timeout=60)
