"""E2B sandboxes' network options against the agent's egress allowlist, with the real
Python SDK and a real `guilds serve --e2b`, on bwrap and docker (local refuses them).

Two test hosts, each an HTTP server in a network namespace of its own on a 10.x/30
(tests/egress_kit.py), are the operator's list with their ranges. An E2B sandbox
asking for one of them (``allow_out`` with ``deny_out`` everything) reaches it and
not the other; ``allow_internet_access=False`` reaches neither; a host outside the
operator's list is refused at create. Every sandbox is an agent of its own: a
narrowed one is an agent whose network is narrowed, with its own sandbox, egress
proxy and home (what it writes never runs with a wider network), removed with it,
and it keeps its network across a pause. Each command's connections are recorded under its call. Every
command start keeps the sandbox's egress proxy running: one killed between two
commands is started again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException
from e2b.sandbox.network import ALL_TRAFFIC

import egress_kit
from e2b_kit import BACKENDS, E2BServer, e2b_server, home_of, made_sandboxes  # noqa: F401 - the client fixture of this module
from guilds.record import Store, database_url
from guilds.sandbox.egress_side.files import egress_files
from guilds.sandbox.egress_side.proxy_process import proxy_pid

pytestmark = [pytest.mark.slow, pytest.mark.backends(*[name for name in BACKENDS if name != "local"])]
NO_HOSTS = None if egress_kit.netns_usable() else "test hosts need network namespaces (root and ip)"
A, B, ELSEWHERE, LOOP = "a.e2b.test", "b.e2b.test", "elsewhere.e2b.test", "loop.e2b.test"
FETCH = (
    "python3 -c 'import sys, urllib.request as u\n"
    "try: print(u.urlopen(sys.argv[1], timeout=10).status)\n"
    "except u.HTTPError as e: print(e.code, e.read().decode())\n"
    "except Exception as e: print(type(e).__name__, e)' "
)
"""A command that fetches the URL after it (through the proxy variables, as urllib does)
and prints the status, or the refusal's status and body, or why it failed."""
DIRECT = "python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], 80), 3)' {} 2>&1 | tail -1"


def _range(address: str) -> str:
    return str(ipaddress.ip_network(f"{address}/30", strict=False))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """{name: address} of the two test hosts (HTTP on port 80), each in its own namespace."""
    if NO_HOSTS:
        pytest.skip(NO_HOSTS)
    folder = tmp_path_factory.mktemp("hosts")
    (folder / "a").mkdir()
    (folder / "b").mkdir()
    with egress_kit.namespace() as a, egress_kit.namespace() as b, \
            egress_kit.upstream(a, folder / "a", cert=None, port=80), \
            egress_kit.upstream(b, folder / "b", cert=None, port=80):
        yield {A: a.address, B: b.address}


@pytest.fixture(scope="module")
def server(backend, hosts, tmp_path_factory):
    """`guilds serve --e2b` for an agent whose network is the two hosts (names and ranges)."""
    listed = ", ".join(f'"{entry}"' for entry in (A, B, LOOP, _range(hosts[A]), _range(hosts[B])))
    resolve = "\n".join(f'"{name}" = "{address}"' for name, address in {**hosts, LOOP: "127.0.0.1"}.items())
    settings = f"network = [{listed}]\n[egress.resolve]\n{resolve}"
    with e2b_server(tmp_path_factory.mktemp(f"e2b-egress-{backend}"), backend, settings) as served:
        yield served


def fetch(box: Sandbox, name: str) -> str:
    return box.commands.run(f"{FETCH}http://{name}/echo", timeout=30).stdout.strip()


def decisions(server: E2BServer, box: Sandbox) -> dict[str, list[tuple[str, bool]]]:
    """Each command of the box's run (its command line) -> its egress decisions (host, allowed)."""
    async def read() -> dict[str, list[tuple[str, bool]]]:
        run = f"e2b-{box.sandbox_id}"
        async with Store(database_url(server.data, {})) as store:
            return {c.args["command"]: [(d["host"], d["allowed"]) for d in await store.egress_of_call(run, c.call_id)]
                    for c in await store.calls(run) if c.tool == "shell"}

    time.sleep(0.5)  # a command's record is written when its end arrives
    return asyncio.run(read())


def only(hosts: dict[str, str], name: str) -> dict:
    """The network option asking for that host alone (its name and its range)."""
    return {"allow_out": [name, _range(hosts[name])], "deny_out": [ALL_TRAFFIC]}


def test_a_sandbox_without_options_has_the_agents_list(client):
    box = client()
    assert (fetch(box, A), fetch(box, B)) == ("200", "200")
    assert fetch(box, ELSEWHERE).startswith("403"), fetch(box, ELSEWHERE)


def test_allow_out_reaches_its_host_and_not_another(client, server, hosts):
    box = client(network=only(hosts, A))
    assert box.get_info().network == {"allow_out": only(hosts, A)["allow_out"], "deny_out": [ALL_TRAFFIC]}
    assert fetch(box, A) == "200"
    refused = fetch(box, B)
    assert refused == f"403 guilds egress: {B}:80 is not in agent.network", refused
    assert "Network is unreachable" in box.commands.run(DIRECT.format(hosts[B])).stdout
    recorded = decisions(server, box)  # each command's connections under its own call
    assert recorded[f"{FETCH}http://{A}/echo"] == [(A, True)]
    assert recorded[f"{FETCH}http://{B}/echo"] == [(B, False)]
    plain = client()  # the template's own list, beside it
    assert fetch(plain, B) == "200"
    home = home_of(box, server.data)
    agent_id = home.name
    assert (server.data / "egress" / agent_id).is_dir()  # its agent's own sandbox and proxy...
    box.kill()  # ...stopped and removed with it, its home too (torn down once the kill is answered)
    deadline = time.monotonic() + 30
    while list(server.data.glob(f"*/{agent_id}*")):  # its proxy, sandbox, home and agent file
        assert time.monotonic() < deadline, list(server.data.glob(f"*/{agent_id}*"))
        time.sleep(0.1)
    assert not home.exists() and not (server.data / "agents" / f"{agent_id}.json").exists()


def test_a_narrowed_sandbox_has_a_home_of_its_own(server, client, hosts):
    """Nothing it writes runs where the network is wider (a login profile: bash -l reads it)."""
    box, plain = client(network=only(hosts, A)), client()
    plain.files.write("agents.txt", "the agent's")
    box.commands.run("echo 'echo PLANTED' > ~/.bash_profile; echo mine > planted.txt")
    profile, home, *listed = box.commands.run("echo $HOME; ls -A").stdout.split()
    assert (profile, listed) == ("PLANTED", [".bash_profile", "planted.txt"])  # its own profile, its own home
    assert home == "/home/user" and home_of(box, server.data) != home_of(plain, server.data)
    assert plain.commands.run("true").stdout == ""
    assert "planted.txt" not in plain.commands.run("ls -A").stdout


def test_no_internet_access_reaches_nothing(client, hosts):
    for box in (client(allow_internet_access=False), client(network={"deny_out": [ALL_TRAFFIC]})):
        for name in (A, B):
            assert not fetch(box, name).startswith(("200", "403")), fetch(box, name)
        assert "Network is unreachable" in box.commands.run(DIRECT.format(hosts[A])).stdout


def test_deny_out_a_range_refuses_its_host_and_keeps_the_others(client, hosts):
    box = client(network={"deny_out": [hosts[B]]})
    assert box.get_info().network["deny_out"] == [f"{hosts[B]}/32"]
    assert fetch(box, A) == "200"
    assert fetch(box, B) == f"403 guilds egress: {B}:80 resolves to {hosts[B]}, in a range agent.network denies"
    assert fetch(box, ELSEWHERE) == f"403 guilds egress: {ELSEWHERE}:80 is not in agent.network"
    assert "a loopback address" in fetch(box, LOOP)  # a listed name resolving to loopback: still refused
    assert "Network is unreachable" in box.commands.run(DIRECT.format(hosts[A])).stdout  # the proxy or nothing
    assert fetch(client(), B) == "200"  # the template's own network, beside it


def test_allow_out_wins_over_a_deny_out_range(client, hosts):
    box = client(network={"allow_out": [hosts[A]], "deny_out": [_range(hosts[A]), _range(hosts[B])]})
    assert fetch(box, A) == "200"
    assert fetch(box, B).startswith(f"403 guilds egress: {B}:80 resolves to {hosts[B]}, in a range")


HELD = """python3 -c '
import os, socket, time
s = socket.create_connection(("127.0.0.1", 3128), 5)
s.sendall(b"CONNECT {host}:80 HTTP/1.1\\r\\nHost: {host}:80\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode(), flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
try:
    s.sendall(b"GET /echo HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n")
    print("after:", s.recv(200).split(b"\\r\\n")[0].decode() or "closed", flush=True)
except OSError as e:
    print("after:", type(e).__name__, flush=True)
' > held.txt 2>&1"""
"""A connection to host through the proxy, opened now and used once the file go exists."""


def test_update_network_changes_a_running_sandbox_live_and_fails_closed(client, hosts):
    box = client()  # the template's own list, its own proxy
    assert (fetch(box, A), fetch(box, B)) == ("200", "200")
    box.commands.run(HELD.format(host=B), background=True, timeout=0)
    deadline = time.monotonic() + 10
    while "200" not in box.commands.run("cat held.txt 2>/dev/null || true").stdout:
        assert time.monotonic() < deadline, box.commands.run("cat held.txt").stdout
        time.sleep(0.1)
    box.update_network({"deny_out": [hosts[B]]})
    assert fetch(box, B) == f"403 guilds egress: {B}:80 resolves to {hosts[B]}, in a range agent.network denies"
    assert fetch(box, A) == "200"
    box.files.write("go", "")
    time.sleep(1)
    held = box.commands.run("cat held.txt").stdout
    assert "after: HTTP/1.1 200" not in held and "after:" in held, held  # the old proxy's connection ended
    assert box.get_info().network["deny_out"] == [f"{hosts[B]}/32"]
    box.update_network(only(hosts, A))
    assert (fetch(box, A), fetch(box, B)) == ("200", f"403 guilds egress: {B}:80 is not in agent.network")
    box.update_network({})  # omitted fields cleared: the template's own network again
    assert (fetch(box, A), fetch(box, B)) == ("200", "200")
    box.update_network({"allow_internet_access": False})
    assert fetch(box, A).startswith("403"), fetch(box, A)


def test_update_network_is_bounded_as_a_create_is(client, hosts):
    box = client(network=only(hosts, A))
    with pytest.raises(SandboxException, match=f"network.allowOut: '{ELSEWHERE}' is not in"):
        box.update_network({"allow_out": [ELSEWHERE], "deny_out": [ALL_TRAFFIC]})
    assert fetch(box, A) == "200" and fetch(box, B).startswith("403")  # unchanged
    box.update_network({})
    assert fetch(box, B) == "200"  # the template's network: its own proxy, now on the template's list
    off = client(allow_internet_access=False)  # no proxy at all: nothing to change live
    with pytest.raises(SandboxException, match="was made without an egress proxy"):
        off.update_network({})
    off.update_network({"allow_internet_access": False})  # what it has: served


@pytest.mark.parametrize("network, says", [
    ({"allow_out": [ELSEWHERE], "deny_out": [ALL_TRAFFIC]}, f"network.allowOut: '{ELSEWHERE}' is not in"),
    ({"allow_out": ["10.0.0.0/8"], "deny_out": [ALL_TRAFFIC]}, "network.allowOut: '10.0.0.0/8' is not in"),
    ({"allow_out": ["*.e2b.test"], "deny_out": [ALL_TRAFFIC]}, "network.allowOut: '*.e2b.test' is not in"),
    ({"deny_out": [A]}, f"network.denyOut: '{A}' is no address range"),
    ({"allow_out": [A], "deny_out": ["10.0.0.0/8"]}, f"network.allowOut: '{A}': with a denyOut short"),
    ({"allow_out": ["a b"], "deny_out": [ALL_TRAFFIC]}, "network.allowOut: 'a b' is not a host name"),
])
def test_what_the_operator_did_not_allow_is_refused(client, network, says):
    with pytest.raises(SandboxException) as refused:
        client(network=network)
    assert "400" in str(refused.value) or says in str(refused.value)
    assert says in str(refused.value), str(refused.value)


def test_each_command_start_keeps_the_egress_proxy(client, server, hosts):
    plain, narrowed = client(), client(network=only(hosts, A))
    for box in (plain, narrowed):
        assert fetch(box, A) == "200"
    proxies = [egress_files(str(server.data), folder.name) for folder in (server.data / "egress").iterdir()
               if folder.name != "ca"]
    killed = [pid for pid in map(proxy_pid, proxies) if pid is not None]
    assert killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(map(proxy_pid, proxies)) and time.monotonic() < deadline:  # gone, as a proxy that died is
        time.sleep(0.05)
    for box in (plain, narrowed):
        assert fetch(box, A) == "200"


def test_local_refuses_what_it_cannot_confine(tmp_path, monkeypatch):
    with e2b_server(tmp_path, "local") as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        for options in ({"allow_internet_access": False}, {"network": {"deny_out": [ALL_TRAFFIC]}}):
            with pytest.raises(SandboxException) as refused:
                Sandbox.create(**options)
            assert "the local sandbox confines no network" in str(refused.value), str(refused.value)
        box = Sandbox.create(allow_internet_access=True)
        assert box.commands.run("echo ok").stdout == "ok\n"
        box.kill()


def test_a_narrowed_sandbox_paused_and_resumed_keeps_its_network_and_home(client, hosts):
    box = client(network=only(hosts, A))
    box.files.write("kept.txt", "still here")
    box.beta_pause()
    again = Sandbox.connect(box.sandbox_id)
    assert again.files.read("kept.txt") == "still here"
    assert (fetch(again, A), fetch(again, B)) == ("200", f"403 guilds egress: {B}:80 is not in agent.network")
