"""The agent's job through the egress allowlist, end to end, with real clients.

A test forge (git smart HTTP and a stand-in of GitHub's API, over TLS, requiring
the token) runs in a network namespace of its own (tests/forge_kit.py). From
inside the bwrap sandbox, through ``shell``: clone, commit, push and ``gh pr
create`` succeed, the forge sees the real token, and the token is nowhere the
sandbox can read. Then it fails closed, each way caused: a direct connection, a
client that ignores the proxy variables, an unlisted host, the proxy killed mid-call.
"""

from __future__ import annotations

import asyncio
import os

import pytest

import forge_kit
from guilds.config.settings import parse_settings
from guilds.record.store import Store
from guilds.sandbox.bubblewrap import BwrapSandbox
from guilds.sandbox.bwrap_argv import unavailable
from guilds.sandbox.egress_side import proxy_pid
from guilds.toolbox import Toolbox

WHY_NOT = unavailable() or forge_kit.unavailable()
pytestmark = [pytest.mark.bwrap, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]
RUN = "egress-run"
URL = f"https://{forge_kit.HOST_NAME}/owner/repo.git"
CREDENTIAL = "-c credential.helper='!f() { echo username=agent; echo \"password=$GH_TOKEN\"; }; f'"


@pytest.fixture(scope="module")
def forge(tmp_path_factory):
    host = forge_kit.ForgeHost(tmp_path_factory.mktemp("forge"))
    try:
        yield host.open()
    finally:
        host.close()


@pytest.fixture
async def agent(forge, tmp_path, monkeypatch):
    """A Toolbox over the bwrap sandbox with agent.network the forge's name and subnet."""
    monkeypatch.setenv("SSL_CERT_FILE", forge.ca)  # the proxy verifies the forge by the test authority
    data = {
        "agent": {"id": "egress1", "home": str(tmp_path / "home"), "sandbox": "bwrap",
                  "network": [forge_kit.HOST_NAME, forge.subnet]},
        "repos": {"work": {"path": "repos/work", "token": forge.token,
                           "token_hosts": [forge_kit.HOST_NAME]}},
        "egress": {"resolve": {forge_kit.HOST_NAME: forge.address}},
    }
    settings = parse_settings(data, tmp_path, env={})
    (tmp_path / "home" / "repos" / "work").mkdir(parents=True)
    sandbox = BwrapSandbox(settings, tmp_path / "data", idle_seconds=120)
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        toolbox = Toolbox(settings, sandbox, store)
        try:
            yield toolbox
        finally:
            await toolbox.close()
            await sandbox.stop()


async def shell(toolbox: Toolbox, command: str, timeout: int = 60):
    return await toolbox.call(RUN, "shell", {"command": command, "timeout_seconds": timeout})


def split(value: str) -> str:
    """A shell expression that makes value at run time, so that no argv or file holds it whole."""
    half = len(value) // 2
    return f'"{value[:half]}""{value[half:]}"'


async def test_clone_push_and_pull_request_with_a_token_the_sandbox_never_holds(agent, forge, tmp_path):
    cloned = await shell(agent, f"git {CREDENTIAL} clone -q {URL} . && git log --oneline | wc -l")
    assert not cloned.is_error and cloned.text.startswith("1\n"), cloned.text
    pushed = await shell(agent, (
        "git config credential.helper '!f() { echo username=agent; echo \"password=$GH_TOKEN\"; }; f' && "
        "git checkout -q -b feature && echo change > CHANGE && git add CHANGE && "
        "git -c user.name=agent -c user.email=agent@example.org commit -qm change && "
        "git push -q origin HEAD:refs/heads/feature && echo pushed"))
    assert "pushed" in pushed.text, pushed.text
    opened = await shell(agent, "gh pr create --title 'A change' --body 'Made in the sandbox' "
                                "--head feature --base main")
    assert not opened.is_error and "/pull/1" in opened.text, opened.text

    seen = forge.requests()
    # git asks first without a credential (401), then with the one its helper gives
    assert {r["credential"] for r in seen if "credential" in r} - {""} == {forge.token}  # the real one only
    assert [r["pull_request"]["title"] for r in seen if "pull_request" in r] == ["A change"]
    branch = (forge.root / "owner" / "repo.git" / "refs" / "heads" / "feature")
    assert branch.exists() or "refs/heads/feature" in (forge.root / "owner" / "repo.git" / "packed-refs").read_text()

    found = await shell(agent, (
        f"t={split(forge.token)}; for f in /proc/[0-9]*/environ; do grep -lF \"$t\" \"$f\" 2>/dev/null; done; "
        f"grep -rlF \"$t\" \"$HOME\" /run/guilds /run/guilds-egress /tmp 2>/dev/null; "
        "echo \"placeholder length: ${#GH_TOKEN}\"; echo searched"))
    assert found.text.splitlines()[:2] == [f"placeholder length: {len(forge.token)}", "searched"], found.text
    for result in (cloned, pushed, opened, found):
        assert forge.token not in result.text

    holders = [p for p in (tmp_path / "data").rglob("*") if p.is_file() and forge.token.encode() in p.read_bytes()]
    assert [p.name for p in holders] == ["proxy.json"] and holders[0].stat().st_mode & 0o777 == 0o600

    counts = await agent.store.egress_counts(RUN)
    assert counts["allowed"] >= 3 and counts["refused"] == 0
    push_call = pushed.meta["call"]
    hosts = {(d["host"], d["port"], d["allowed"]) for d in await agent.store.egress_of_call(RUN, push_call)}
    assert hosts == {(forge_kit.HOST_NAME, 443, True)}


async def test_a_direct_connection_and_a_client_ignoring_the_proxy_get_no_network(agent, forge):
    before = len(forge.requests())
    direct = await shell(agent, (
        f"python3 -c \"import socket; socket.create_connection(('{forge.address}', 443), 3)\" 2>&1 | tail -1; "
        f"env -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy curl -sS -m 5 "
        f"--resolve {forge_kit.HOST_NAME}:443:{forge.address} https://{forge_kit.HOST_NAME}/ 2>&1; "
        f"echo curl=$?"))
    lines = direct.text.splitlines()
    assert "Network is unreachable" in lines[0], direct.text
    assert "curl=7" in direct.text, direct.text  # could not connect: there is no network to try
    assert len(forge.requests()) == before  # nothing reached the forge
    assert await agent.store.egress_counts(RUN) == {"allowed": 0, "refused": 0}  # nor even the proxy


async def test_an_unlisted_host_is_refused_with_a_reason_and_recorded(agent):
    refused = await shell(agent, "curl -sS -m 10 http://elsewhere.test/; echo; "
                                 "curl -sS -m 10 https://elsewhere.test/ 2>&1; echo curl=$?")
    assert "guilds egress: elsewhere.test:80 is not in agent.network" in refused.text, refused.text
    assert "403" in refused.text and "curl=56" in refused.text, refused.text
    counts = await agent.store.egress_counts(RUN)
    assert counts["refused"] == 2


async def test_the_proxy_killed_mid_call_fails_closed_and_the_next_call_starts_it(agent, forge):
    first = await shell(agent, f"curl -sS -o /dev/null -w '%{{http_code}}' -m 10 https://{forge_kit.HOST_NAME}/api/v3/")
    assert first.text.startswith("401"), first.text  # reached the forge (no token: refused there)
    files = agent.sandbox.egress
    pid = proxy_pid(files)
    assert pid is not None

    async def kill_soon() -> None:
        await asyncio.sleep(1.5)
        os.kill(pid, 9)

    killer = asyncio.ensure_future(kill_soon())
    during = await shell(agent, (
        f"sleep 3; curl -sS -m 10 -o /dev/null https://{forge_kit.HOST_NAME}/api/v3/ 2>&1; echo curl=$?; "
        f"python3 -c \"import socket; socket.create_connection(('{forge.address}', 443), 3)\" 2>&1 | tail -1"))
    await killer
    assert "curl=0" not in during.text and "curl=" in during.text, during.text
    assert "Network is unreachable" in during.text, during.text
    after = await shell(agent, f"curl -sS -o /dev/null -w '%{{http_code}}' -m 10 https://{forge_kit.HOST_NAME}/api/v3/")
    assert after.text.startswith("401"), after.text
    assert proxy_pid(files) not in (None, pid)

