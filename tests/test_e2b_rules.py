"""E2B sandboxes' ``network.rules`` (headers the egress proxy sets for a host), with the real
Python SDK and a real `guilds serve --e2b`, on bwrap and docker (local refuses them).

Two test hosts, each HTTPS (a leaf of a test authority the server's proxies verify by) and
plain HTTP in a network namespace of its own (tests/egress_kit.py), are the operator's list.
A sandbox made with a rule for one of them runs curl: the host gets the header, the other
host none; the value is nowhere the sandbox can read (its environment, its processes'
files, its files, the proxy's answers), and a host echoing it shows a placeholder. A fork
and a resumed sandbox keep the rules; ``update_network`` replaces them.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import sqlite3
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

import egress_kit
from e2b_kit import BACKENDS, e2b_server, made_sandboxes  # noqa: F401 - the client fixture of this module
from guilds.limits import EGRESS_RULE_HEADERS_MAX, EGRESS_RULE_VALUE_MAX_CHARS

pytestmark = [pytest.mark.slow, pytest.mark.backends(*[name for name in BACKENDS if name != "local"])]
NO_HOSTS = None if egress_kit.netns_usable() else "test hosts need network namespaces (root and ip)"
A, B, ELSEWHERE = "a.rules.test", "b.rules.test", "elsewhere.rules.test"
VALUE = "x-test-token-value-held-outside-7f3a"
HEADER = "X-Test-Token"
GET = """if command -v curl >/dev/null; then curl -sS -i --max-time 20 {curl_headers} '{url}'; else
python3 - '{url}' {python_headers} <<'EOF'
import sys, urllib.request as u
request = u.Request(sys.argv[1], headers=dict(h.split(": ", 1) for h in sys.argv[2:]))
try:
    answer = u.urlopen(request, timeout=20)
    status, text = "%d OK" % answer.status, answer.read().decode()
except u.HTTPError as e:
    status, text = "%d %s" % (e.code, e.reason), e.read().decode()
print("HTTP/1.1", status)
print()
print(text)
EOF
fi"""
"""curl where the sandbox has it (bwrap: the host's), else Python's urllib (the docker image
has no curl): both through the proxy variables, trusting the sandbox's bundle; the answer's
status line, then its body after a blank line."""
LOOK = """python3 - {encoded} <<'EOF'
import base64, os, sys
value = base64.b64decode(sys.argv[1])
hits = [name for name, v in os.environ.items() if value in v.encode()]
def look(path):
    try:
        with open(path, "rb") as f:
            if value in f.read(1 << 20):
                hits.append(path)
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for part in ("environ", "cmdline"):
            look(f"/proc/{pid}/{part}")
for root in (os.path.expanduser("~"), "/tmp", "/etc", "/run", "/var/tmp", "/dev/shm", "/opt"):
    for folder, _, names in os.walk(root):
        for name in names:
            look(os.path.join(folder, name))
print("hits:", hits)
EOF"""
"""A command looking for the value (given encoded, so that its own command line does not
hold it) in the sandbox's environment, every process's environment and command line, and
every file a program would keep one in."""


def _range(address: str) -> str:
    return str(ipaddress.ip_network(f"{address}/30", strict=False))


def rule(value: str = VALUE, name: str = HEADER) -> list[dict]:
    return [{"transform": {"headers": {name: value}}}]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """{name: (address, the HTTPS host's seen-log, the HTTP host's)}; the authority's PEM at "root"."""
    if NO_HOSTS:
        pytest.skip(NO_HOSTS)
    folder = tmp_path_factory.mktemp("rule-hosts")
    authority = egress_kit.HostsAuthority(folder)
    with egress_kit.namespace() as a, egress_kit.namespace() as b:
        found: dict = {"root": authority.pem}
        with (egress_kit.upstream(a, _made(folder / "a"), cert=authority.leaf(A)) as a_tls,
              egress_kit.upstream(a, folder / "a", cert=None, port=80) as a_plain,
              egress_kit.upstream(b, _made(folder / "b"), cert=authority.leaf(B)) as b_tls,
              egress_kit.upstream(b, folder / "b", cert=None, port=80) as b_plain):
            found.update({A: (a.address, a_tls, a_plain), B: (b.address, b_tls, b_plain)})
            yield found


def _made(folder: Path) -> Path:
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def server(backend, hosts, tmp_path_factory):
    """`guilds serve --e2b` for an agent whose network is the two hosts; its proxies verify
    the test hosts by the test authority."""
    addresses = {name: hosts[name][0] for name in (A, B)}
    listed = ", ".join(f'"{entry}"' for entry in (A, B, *map(_range, addresses.values())))
    resolve = "\n".join(f'"{name}" = "{address}"' for name, address in addresses.items())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(hosts["root"]))
        with e2b_server(tmp_path_factory.mktemp(f"e2b-rules-{backend}"), backend,
                        f"network = [{listed}]\n[egress.resolve]\n{resolve}") as served:
            yield served


def kept(seen: Path) -> dict[str, str]:
    """The headers of the last request a host kept (``/keep``), as the host got them."""
    last = [line for line in seen.read_text().splitlines() if line.startswith("KEEP ")][-1]
    return json.loads(last[5:])["headers"]


def run(box: Sandbox, command: str) -> str:
    done = box.commands.run(command, timeout=60)
    return done.stdout


def get(box: Sandbox, url: str, header: str = "") -> str:
    """The answer to GET url from inside box (header: one more, ``Name: value``)."""
    return run(box, GET.format(url=url, curl_headers=f"-H '{header}'" if header else "",
                               python_headers=f"'{header}'" if header else ""))


def body(answer: str) -> str:
    """The body of an answer (curl shows the proxy's CONNECT answer first: the last head ends it)."""
    return answer.replace("\r\n", "\n").rpartition("\n\n")[2]


def test_a_rule_sets_its_header_and_the_sandbox_never_holds_it(client, hosts):
    box = client(network={"rules": {A: rule()}})
    get(box, f"https://{A}/keep", f"{HEADER}: the-sandbox-own")
    assert kept(hosts[A][1])[HEADER] == VALUE  # the rule's, over the sandbox's own
    echoed = json.loads(body(get(box, f"https://{A}/echo")))
    assert echoed[HEADER] != VALUE and len(echoed[HEADER]) == len(VALUE)  # a placeholder comes back
    get(box, f"http://{A}/keep")  # plain HTTP in absolute form, through the proxy too
    assert kept(hosts[A][2])[HEADER] == VALUE
    get(box, f"https://{B}/keep")  # another host: nothing set
    assert HEADER not in kept(hosts[B][1])
    refused = get(box, f"http://{VALUE}.{A}/")  # a refusal naming it shows the placeholder
    assert "403" in refused and VALUE not in refused, refused
    found = run(box, LOOK.replace("{encoded}", base64.b64encode(VALUE.encode()).decode()))
    assert found.strip() == "hits: []", found
    box.files.write("planted.txt", "planted-control-value")  # the look finds what is there
    found = run(box, LOOK.replace("{encoded}", base64.b64encode(b"planted-control-value").decode()))
    assert "planted.txt" in found, found


def test_a_sandbox_without_rules_beside_it_sets_nothing(client, hosts):
    client(network={"rules": {A: rule()}})
    plain = client()
    get(plain, f"https://{A}/keep")
    assert HEADER not in kept(hosts[A][1])


def test_update_network_sets_and_clears_rules(client, hosts):
    box = client(network={"rules": {B: rule()}})
    box.update_network({"rules": {A: rule()}})
    get(box, f"https://{A}/keep")
    assert kept(hosts[A][1])[HEADER] == VALUE
    get(box, f"https://{B}/keep")
    assert HEADER not in kept(hosts[B][1])  # the update replaced the rules whole
    box.update_network({})
    get(box, f"https://{A}/keep")
    assert HEADER not in kept(hosts[A][1])
    with pytest.raises(SandboxException, match=f"network.rules: '{ELSEWHERE}' is not in"):
        box.update_network({"rules": {ELSEWHERE: rule()}})


def recorded(server, text: str) -> list[str]:
    """The args and text of each call the record holds that mentions text (its redacted form
    is [REDACTED], so a call whose value was redacted is not among them)."""
    with sqlite3.connect(server.data / "guilds.db") as conn:
        return [f"{args} {out}" for args, out in conn.execute("SELECT args, text FROM calls")
                if text in f"{args} {out}"]


def test_a_value_set_by_update_network_is_redacted_from_the_record(client, server, hosts):
    later = "x-later-token-value-set-by-update-3c9e"
    box = client(network={"rules": {B: rule()}})
    assert run(box, f"echo before {later}") == f"before {later}\n"
    assert len(recorded(server, later)) == 1  # not a secret yet: recorded as it is
    box.update_network({"rules": {A: rule(value=later)}})
    get(box, f"https://{A}/keep")
    assert kept(hosts[A][1])[HEADER] == later
    run(box, f"echo after {later}")
    assert len(recorded(server, later)) == 1, "the value of a rule set while the sandbox runs was recorded"
    assert recorded(server, "echo after"), "the call after the update was not recorded"


def test_a_fork_and_a_resumed_sandbox_keep_the_rules(client, hosts):
    box = client(network={"rules": {A: rule()}})
    [child] = box.fork(count=1, timeout=120)
    try:
        get(child, f"https://{A}/keep")
        assert kept(hosts[A][1])[HEADER] == VALUE
    finally:
        child.kill()
    box.beta_pause()
    again = Sandbox.connect(box.sandbox_id)
    get(again, f"https://{A}/keep")
    assert kept(hosts[A][1])[HEADER] == VALUE


@pytest.mark.parametrize("rules, says", [
    ({ELSEWHERE: rule()}, f"network.rules: '{ELSEWHERE}' is not in the agent's network"),
    ({"*.test": rule()}, "network.rules: '*.test' is not in the agent's network"),
    ({"10.1.2.3": rule()}, "network.rules: '10.1.2.3' is not a host name or *.domain"),
    ({A: rule(name="Host")}, f"network.rules: {A}: header 'Host' cannot be set"),
    ({A: rule(value="short")}, f"network.rules: {A}: header '{HEADER}': the value must be 8 to"),
    ({A: rule(value="v" * (EGRESS_RULE_VALUE_MAX_CHARS + 1))}, "the value must be 8 to"),
    ({A: [{"transform": {"headers": {f"X-{n}": VALUE for n in range(EGRESS_RULE_HEADERS_MAX + 1)}}}]},
     f"at most {EGRESS_RULE_HEADERS_MAX} a host"),
])
def test_what_cannot_be_served_is_refused_at_create_in_one_line(client, rules, says):
    with pytest.raises(SandboxException) as refused:
        client(network={"rules": rules})
    message = str(refused.value)
    assert says in message and VALUE not in message, message


def test_each_bound_is_served_at_its_edge(client, hosts):
    headers = {f"X-{n}": f"edge-value-{n:04d}" for n in range(EGRESS_RULE_HEADERS_MAX - 1)}
    headers[HEADER] = "v" * EGRESS_RULE_VALUE_MAX_CHARS
    box = client(network={"rules": {A: [{"transform": {"headers": headers}}]}})
    get(box, f"https://{A}/keep")
    assert kept(hosts[A][1]) | headers == kept(hosts[A][1])


def test_local_refuses_rules(tmp_path, monkeypatch):
    with e2b_server(tmp_path, "local", "network = true") as served:
        served.export(monkeypatch)
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(network={"rules": {A: rule()}})
        assert "network.rules: the local sandbox has no egress proxy of its own" in str(refused.value)
