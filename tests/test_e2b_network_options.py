"""The E2B create body's network options read against the operator's agent.network
(guilds.fronts.e2b.network_options): what narrows, what is refused, and the own sandbox's settings.
The SDKs against real sandboxes and test hosts: tests/test_e2b_egress.py."""

from __future__ import annotations

import pytest

from guilds.config.settings import parse_settings
from guilds.fronts.e2b.connect import ConnectError
from guilds.fronts.e2b.network_options import asked, same_as_agent
from guilds.fronts.e2b.own_sandbox import own_settings
from toolbox_kit import FakeSandbox

EVERYTHING = {"denyOut": ["0.0.0.0/0"]}
LIST = ["api.example.org", "*.pkg.example.org", "git.example.org:8443", "10.1.0.0/16"]


def settings(tmp_path, network, **more):
    sandbox = "bwrap" if isinstance(network, list) else "local"
    return parse_settings({"agent": {"home": str(tmp_path / "home"), "sandbox": sandbox, "network": network},
                           **more}, tmp_path, env={})


def body(*allow, internet=None, **network):
    out: dict = {"network": {**({"allowOut": list(allow)} if allow else {}), **network}}
    if internet is not None:
        out["allow_internet_access"] = internet
    return out


@pytest.mark.parametrize("request_body, entries", [
    ({}, None),
    ({"allow_internet_access": True}, None),
    (body("api.example.org"), None),  # allowOut without a deny of everything narrows nothing, as in E2B
    ({"allow_internet_access": False}, ()),
    (body(**EVERYTHING), ()),
    (body(internet=False, dnsServers=["10.1.0.53"], allowPublicTraffic=False), ()),
    (body("api.example.org", **EVERYTHING), ("api.example.org",)),
    (body("a.pkg.example.org", "*.b.pkg.example.org", **EVERYTHING), ("a.pkg.example.org", "*.b.pkg.example.org")),
    (body("*.pkg.example.org", "git.example.org:8443", internet=False),
     ("*.pkg.example.org", "git.example.org:8443")),
    (body("10.1.2.0/24", "10.1.3.4", denyOut=["0.0.0.0/0", "10.9.9.9"]), ("10.1.2.0/24", "10.1.3.4")),
    (body("api.example.org:443", **EVERYTHING), ("api.example.org:443",)),
])
def test_what_narrows(tmp_path, request_body, entries):
    assert asked(request_body, settings(tmp_path, LIST)) == entries


@pytest.mark.parametrize("request_body, says", [
    (body("other.example.org", **EVERYTHING), "network.allowOut: 'other.example.org' is not in the agent's network"),
    (body("pkg.example.org", **EVERYTHING), "'pkg.example.org' is not in"),  # *.domain is not the domain
    (body("*.example.org", **EVERYTHING), "'*.example.org' is not in"),  # wider than *.pkg.example.org
    (body("api.example.org:22", **EVERYTHING), "'api.example.org:22' is not in"),  # another port
    (body("git.example.org", **EVERYTHING), "'git.example.org' is not in"),  # 80 and 443, not 8443
    (body("10.0.0.0/8", **EVERYTHING), "'10.0.0.0/8' is not in"),
    (body("0.0.0.0/0", **EVERYTHING), "'0.0.0.0/0' is not in"),
    (body("other.example.org"), "is not in"),  # checked even when it would narrow nothing
    (body("a b", **EVERYTHING), "network.allowOut: 'a b' is not a host name"),
    (body(denyOut=["10.0.0.0/8"]), "network.denyOut: only everything (0.0.0.0/0) can be denied here"),
    (body(denyOut=["example.org"]), "network.denyOut: only everything"),
    (body(rules={"api.example.org": [{}]}), "network.rules: per-host transforms are not served"),
    (body(egressProxy={"address": "proxy.example.org:1080"}), "network.egressProxy:"),
    (body(somethingNew=True), "network.somethingNew: not served"),
    ({"allow_internet_access": "no"}, "allow_internet_access: true or false"),
    ({"network": ["api.example.org"]}, "network: an object"),
    (body(allowOut="api.example.org"), "network.allowOut: a list of strings"),
])
def test_what_is_refused(tmp_path, request_body, says):
    with pytest.raises(ConnectError) as refused:
        asked(request_body, settings(tmp_path, LIST))
    assert refused.value.code == "invalid_argument" and says in str(refused.value), str(refused.value)


def test_the_operators_true_and_false_bound_everything_and_nothing(tmp_path):
    anything = body("anything.example.com", "192.0.2.0/24", **EVERYTHING)
    assert asked(anything, settings(tmp_path, True)) == ("anything.example.com", "192.0.2.0/24")
    with pytest.raises(ConnectError, match=r"is not in the agent's network \(agent.network = false\)"):
        asked(anything, settings(tmp_path, False))
    assert asked({"allow_internet_access": False}, settings(tmp_path, False)) == ()


def test_what_is_the_agents_own_network(tmp_path):
    listed, off, on = settings(tmp_path, LIST), settings(tmp_path, False), settings(tmp_path, True)
    assert same_as_agent(None, listed) and same_as_agent(tuple(reversed(LIST)), listed)
    assert not same_as_agent(("api.example.org",), listed) and not same_as_agent((), listed)
    assert same_as_agent((), off) and not same_as_agent((), on)


def test_an_own_sandbox_without_network_holds_no_value_meant_for_a_host(tmp_path):
    agent = settings(tmp_path, LIST, secrets={"PLAIN": "p-value", "BOUND": {"value": "b-value",
                                                                              "hosts": ["api.example.org"]}},
                     repos={"web": {"path": "web", "token": "t-value"}})
    fake = FakeSandbox(answer=lambda request: None)
    off = own_settings(agent, fake, (), "i0123456789abcdef0123")
    assert (off.id, off.egress, off.network) == (f"{agent.id}-e2b-cdef0123", (), False)
    assert dict(off.secrets) == {"PLAIN": "p-value"} and not off.secret_hosts
    assert [r.token for r in off.repos] == [""]
    narrowed = own_settings(agent, fake, ("api.example.org",), "i0123456789abcdef0123")
    assert narrowed.egress == ("api.example.org",) and narrowed.secret_hosts == agent.secret_hosts
    assert narrowed.home == tmp_path / "home.e2b" / narrowed.id and narrowed.repos == agent.repos
