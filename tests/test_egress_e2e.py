"""The agent's job through the egress allowlist, end to end, with real clients, on
the bwrap, docker and kubernetes sandboxes (kubernetes: the test cluster, its
policy controller holding the pod to the proxy's port).

A test forge (git smart HTTP and a stand-in of GitHub's API, over TLS, requiring
the token) runs in a network namespace of its own (tests/forge_kit.py). From
inside the sandbox, through ``shell``: clone, commit, push and ``gh pr create``
succeed, the forge sees the real token, and the token is nowhere the sandbox can
read. Then it fails closed, each way caused: a direct connection, a client that
ignores the proxy variables, an unlisted host, the proxy killed mid-call.
Fetches are python3's urllib, which honours the proxy variables and is in both
sandboxes (the docker and kubernetes test images get the host's gh, which needs only libc).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import backend_kit
import forge_kit
import kube_kit
from guilds.config.settings import parse_settings
from guilds.sandbox.egress_side import proxy_setup
from guilds.sandbox.egress_side.proxy_process import proxy_pid
from guilds.toolbox import Toolbox
from toolbox_kit import sandbox_toolbox

NO_HOSTS = forge_kit.unavailable()
pytestmark = [pytest.mark.skipif(NO_HOSTS is not None, reason=str(NO_HOSTS)),
              pytest.mark.backends(*backend_kit.ISOLATING)]
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
TEST_IMAGE = "guilds-sandbox-egress-test:latest"
RUN = "egress-run"
URL = f"https://{forge_kit.HOST_NAME}/owner/repo.git"
CREDENTIAL = "-c credential.helper='!f() { echo username=agent; echo \"password=$GH_TOKEN\"; }; f'"
FETCH = (
    "python3 -c 'import sys, urllib.request as u\n"
    "try: print(u.urlopen(sys.argv[1], timeout=10).status)\n"
    "except u.HTTPError as e: print(e.code, e.read().decode())\n"
    "except Exception as e: print(type(e).__name__, e)' "
)
"""A command that fetches the URL after it and prints the status (and body of an error) or why it failed."""
CONNECT = "python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], 443), 3)' {} 2>&1 | tail -1"


@pytest.fixture(scope="module")
def forge(tmp_path_factory):
    host = forge_kit.ForgeHost(tmp_path_factory.mktemp("forge"))
    try:
        yield host.open()
    finally:
        host.close()


@pytest.fixture(scope="module")
def test_image():
    """The docker sandbox image with the host's gh in /usr/local/bin (built once)."""
    return forge_kit.image_with_gh(IMAGE, TEST_IMAGE)


@pytest.fixture(scope="module")
def kube_image():
    """The test cluster's image with the host's gh, on the node (built once)."""
    return kube_kit.image_with_gh()


@pytest.fixture
async def agent(backend, request, forge, tmp_path, monkeypatch):
    """A Toolbox over the sandbox with agent.network the forge's name and subnet."""
    monkeypatch.setenv("SSL_CERT_FILE", forge.ca)  # the proxy verifies the forge by the test authority
    kube = backend == "kubernetes"
    home = "/home/agent" if kube else str(tmp_path / "home")  # kubernetes: the home is in the pod
    data = {
        "agent": {"id": f"egress-{backend}", "home": home, "sandbox": backend,
                  "network": [forge_kit.HOST_NAME, forge.subnet]},
        "repos": {"work": {"path": "repos/work", "token": forge.token,
                           "token_hosts": [forge_kit.HOST_NAME]}},
        "egress": {"resolve": {forge_kit.HOST_NAME: forge.address}},
    }
    if backend == "docker":
        data["docker"] = {"image": request.getfixturevalue("test_image"), "memory": "512m"}
    if kube:
        data["kubernetes"] = kube_kit.settings_table(image=request.getfixturevalue("kube_image"), memory="512Mi")
    settings = parse_settings(data, tmp_path, env={})
    (tmp_path / "home" / "repos" / "work").mkdir(parents=True)
    async with sandbox_toolbox(settings, tmp_path / "data", idle_seconds=120) as toolbox:
        if kube:
            made = await toolbox.sandbox.exec(["mkdir", "-p", f"{home}/repos/work"], timeout=120)
            assert made.exit_code == 0, made
        yield toolbox


async def shell(toolbox: Toolbox, command: str, timeout: int = 60):
    return await toolbox.call(RUN, "shell", {"command": command, "timeout_seconds": timeout})


def split(value: str) -> str:
    """A shell expression that makes value at run time, so that no argv or file holds it whole."""
    half = len(value) // 2
    return f'"{value[:half]}""{value[half:]}"'


async def test_clone_push_and_pull_request_with_a_token_the_sandbox_never_holds(agent, forge, tmp_path):
    branch, title = f"feature-{agent.settings.sandbox}", f"A change on {agent.settings.sandbox}"
    cloned = await shell(agent, f"git {CREDENTIAL} clone -q {URL} . && git log --oneline | wc -l")
    assert not cloned.is_error and cloned.text.startswith("1\n"), cloned.text
    pushed = await shell(agent, (
        "git config credential.helper '!f() { echo username=agent; echo \"password=$GH_TOKEN\"; }; f' && "
        f"git checkout -q -b {branch} && echo change > CHANGE && git add CHANGE && "
        "git -c user.name=agent -c user.email=agent@example.org commit -qm change && "
        f"git push -q origin HEAD:refs/heads/{branch} && echo pushed"))
    assert "pushed" in pushed.text, pushed.text
    opened = await shell(agent, f"gh pr create --title '{title}' --body 'Made in the sandbox' "
                                f"--head {branch} --base main")
    assert not opened.is_error and "https://forge/pull/" in opened.text, opened.text

    seen = forge.requests()
    # git asks first without a credential (401), then with the one its helper gives
    assert {r["credential"] for r in seen if "credential" in r} - {""} == {forge.token}  # the real one only
    assert title in [r["pull_request"]["title"] for r in seen if "pull_request" in r]
    refs = subprocess.run(["git", "-C", str(forge.root / "owner" / "repo.git"), "branch", "--list", branch],
                          capture_output=True, text=True, check=True).stdout
    assert refs.split() == [branch]

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
    for result in (cloned, pushed, opened):  # each connection under the call that made it (git and gh alike)
        made = await agent.store.egress_of_call(RUN, result.meta["call"])
        assert {(d["host"], d["port"], d["allowed"]) for d in made} == {(forge_kit.HOST_NAME, 443, True)}


async def test_a_direct_connection_and_a_client_ignoring_the_proxy_get_no_network(agent, forge):
    before = len(forge.requests())
    direct = await shell(agent, (
        f"{CONNECT.format(forge.address)}; "
        f"env -u HTTPS_PROXY -u https_proxy -u ALL_PROXY -u all_proxy {FETCH} https://{forge.address}/"))
    unreachable, ignoring = direct.text.splitlines()[:2]
    assert "Network is unreachable" in unreachable, direct.text
    assert ignoring.startswith("URLError") and "Network is unreachable" in ignoring, direct.text
    assert len(forge.requests()) == before  # nothing reached the forge
    assert await agent.store.egress_counts(RUN) == {"allowed": 0, "refused": 0}  # nor even the proxy


async def test_an_unlisted_host_is_refused_with_a_reason_and_recorded(agent):
    refused = await shell(agent, f"{FETCH} http://elsewhere.test/; {FETCH} https://elsewhere.test/")
    plain, tunnel = [line for line in refused.text.splitlines() if line][:2]
    assert plain == "403 guilds egress: elsewhere.test:80 is not in agent.network", refused.text
    assert tunnel == ("URLError <urlopen error Tunnel connection failed: 403 guilds egress: "
                      "elsewhere.test:443 is not in agent.network>"), refused.text
    assert await agent.store.egress_counts(RUN) == {"allowed": 0, "refused": 2}
    decisions = await agent.store.egress_of_call(RUN, refused.meta["call"])
    assert [(d["host"], d["port"], d["allowed"]) for d in decisions] == [
        ("elsewhere.test", 80, False), ("elsewhere.test", 443, False)]


async def test_the_proxy_killed_mid_call_fails_closed_and_the_next_call_starts_it(agent, forge):
    api = f"https://{forge_kit.HOST_NAME}/api/v3/"
    first = await shell(agent, f"{FETCH} {api}")
    assert first.text.startswith("401"), first.text  # reached the forge (no token: refused there)
    pid = proxy_pid(agent.sandbox.egress.files)
    assert pid is not None

    async def kill_soon() -> None:
        await asyncio.sleep(1.5)
        os.kill(pid, 9)

    killer = asyncio.ensure_future(kill_soon())
    during = await shell(agent, f"sleep 4; {FETCH} {api}; {CONNECT.format(forge.address)}")
    await killer
    fetched, direct = during.text.splitlines()[:2]
    assert fetched.startswith(("URLError", "RemoteDisconnected", "ConnectionResetError")), during.text
    assert "Network is unreachable" in direct, during.text
    after = await shell(agent, f"{FETCH} {api}")
    assert after.text.startswith("401"), after.text
    assert proxy_pid(agent.sandbox.egress.files) not in (None, pid)


async def test_an_idle_proxy_sleeps_and_the_sandboxs_next_connection_wakes_it(agent, backend, monkeypatch):
    if backend == "kubernetes":
        pytest.skip("on kubernetes the proxy listens on TCP and never sleeps")
    monkeypatch.setattr(proxy_setup, "EGRESS_LINGER_SECONDS", 1.0)
    api = f"https://{forge_kit.HOST_NAME}/api/v3/"
    first = await shell(agent, f"{FETCH} {api}")
    assert first.text.startswith("401"), first.text
    pid = proxy_pid(agent.sandbox.egress.files)
    assert pid is not None

    def asleep() -> bool:
        return b"waiter.py" in Path(f"/proc/{pid}/cmdline").read_bytes()

    deadline = time.monotonic() + 15
    while not asleep():
        assert time.monotonic() < deadline, "the proxy never slept"
        await asyncio.sleep(0.1)
    after = await shell(agent, f"{FETCH} {api}")
    assert after.text.startswith("401"), after.text  # woken by the sandbox's connection, and served
    assert proxy_pid(agent.sandbox.egress.files) == pid  # the same process: woken, not started anew


TEMPLATE_SERVER = """
[agent]
id = "server1"
home = "home"
sandbox = "local"

[templates.work.agent]
home = "work-home"
sandbox = "{backend}"
network = ["{host}", "{subnet}"]
[templates.work.repos.work]
path = "repos/work"
token = "{token}"
[templates.work.egress.resolve]
"{host}" = "{address}"
{docker}
"""
"""A server whose template ``work`` holds a clone of the forge's repository, its token
without token_hosts: the token goes to the clone's origin host only."""


def push(branch: str, remote: str) -> str:
    """A command that fetches main from remote, commits on a new branch and pushes it there."""
    return (f"git {CREDENTIAL} fetch -q {remote} main && git checkout -q -b {branch} FETCH_HEAD && "
            "echo change > CHANGE && git add CHANGE && "
            "git -c user.name=agent -c user.email=agent@example.org commit -qm change && "
            f"git {CREDENTIAL} push -q {remote} HEAD:refs/heads/{branch} && echo pushed")


def template_server(tmp_path: Path, backend: str, forge, image: str | None) -> Path:
    """The settings of a server serving ``work``, its home a clone whose origin is the forge."""
    clone = tmp_path / "work-home" / "repos" / "work"
    subprocess.run(["git", "clone", "-q", str(forge.root / "owner" / "repo.git"), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", URL], check=True)
    docker = "" if image is None else f"[templates.work.docker]\nimage = '{image}'\nmemory = '512m'\n"
    path = tmp_path / "server.toml"
    path.write_text(TEMPLATE_SERVER.format(backend=backend, host=forge_kit.HOST_NAME, subnet=forge.subnet,
                                           token=forge.token, address=forge.address, docker=docker))
    path.chmod(0o600)
    return path


def pushed_to(forge, branch: str) -> bool:
    refs = subprocess.run(["git", "-C", str(forge.root / "owner" / "repo.git"), "branch", "--list", branch],
                          capture_output=True, text=True, check=True).stdout
    return refs.split() == [branch]


@pytest.mark.backends("bwrap", "docker")
async def test_an_agent_made_from_a_template_gets_its_token_pinned_to_its_origin(backend, request, forge, tmp_path,
                                                                                 monkeypatch):
    """Its sandbox's object is made before its home: the origin is read once the home is made,
    not pinned empty before. A fork's child keeps the source's pin, whatever the source's
    agent wrote in .git/config since."""
    import guilds

    monkeypatch.setenv("SSL_CERT_FILE", forge.ca)
    image = request.getfixturevalue("test_image") if backend == "docker" else None
    settings = template_server(tmp_path, backend, forge, image)
    data = tmp_path / "data"
    async with guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)}) as server:
        made = await server.make_agent("work")
        try:
            branch = f"template-{backend}"
            pushed = await made.toolbox.call(RUN, "shell", {"command": push(branch, "origin"),
                                                            "timeout_seconds": 60})
            assert "pushed" in pushed.text, pushed.text
            assert pushed_to(forge, branch)
            origins = data / "egress" / made.id / "origins.json"
            assert json.loads(origins.read_text()) == {"work": {"path": "repos/work", "origin": forge_kit.HOST_NAME}}

            found = await made.toolbox.call(RUN, "shell", {"command": (
                f"t={split(forge.token)}; for f in /proc/[0-9]*/environ; do grep -lF \"$t\" \"$f\" 2>/dev/null; "
                "done; grep -rlF \"$t\" \"$HOME\" /run/guilds /run/guilds-egress /tmp 2>/dev/null; echo searched")})
            assert found.text.splitlines()[:1] == ["searched"], found.text
            assert forge.token not in pushed.text + found.text

            moved = await made.toolbox.call(RUN, "shell", {
                "command": "git remote set-url origin https://elsewhere.test/owner/repo.git && echo moved"})
            assert "moved" in moved.text, moved.text
            forked = await server.fork(made.id, 1)
            child = forked.agents[0]
            try:
                child_branch = f"fork-{backend}"
                again = await child.toolbox.call(RUN + "-child", "shell", {
                    "command": push(child_branch, URL), "timeout_seconds": 60})
                assert "pushed" in again.text, again.text  # the token still goes to the forge, pinned by the source
                assert pushed_to(forge, child_branch)
                assert (data / "egress" / child.id / "origins.json").read_bytes() == origins.read_bytes()
            finally:
                await server.remove_agent(child.id)
        finally:
            await server.remove_agent(made.id)
    assert {r["credential"] for r in forge.requests() if "credential" in r} - {""} == {forge.token}
