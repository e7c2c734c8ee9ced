"""The E2B create body's network options read against the operator's agent.network
(guilds.fronts.e2b.network_options): what narrows, what is refused, and a narrowed agent's settings.
The SDKs against real sandboxes and test hosts: tests/test_e2b_egress.py."""

from __future__ import annotations

import pytest

from guilds.config.settings import parse_settings
from guilds.fronts.e2b.connect import ConnectError
from guilds.fronts.e2b.network_options import asked, narrowed, narrowing, same_as_agent
from guilds.sandbox import backend

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
    (body(denyOut=["10.1.2.0/24", "8.8.8.8"]), (*LIST, "!10.1.2.0/24", "!8.8.8.8/32")),
    (body("10.1.2.128/25", denyOut=["10.1.2.0/24"]), (*LIST, "!10.1.2.0/25")),  # allowOut wins over denyOut
    (body("10.1.2.0/23", denyOut=["10.1.2.0/24"]), None),  # nothing left denied
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
    (body(denyOut=["example.org"]), "network.denyOut: 'example.org' is no address range"),
    (body(denyOut=["10.0.0.0/33"]), "network.denyOut: '10.0.0.0/33' is no address range"),
    (body("api.example.org", denyOut=["10.0.0.0/8"]), "network.allowOut: 'api.example.org': with a denyOut short"),
    (body("!10.1.0.0/16", **EVERYTHING), "network.allowOut: '!10.1.0.0/16' is not a host name"),
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
    some = body(denyOut=["8.8.8.8", "fd00::/8"])
    assert asked(some, settings(tmp_path, True)) == ("0.0.0.0/0", "::/0", "!8.8.8.8/32", "!fd00::/8")
    assert asked(some, settings(tmp_path, False)) is None  # nothing to deny


def test_what_is_the_agents_own_network(tmp_path):
    listed, off, on = settings(tmp_path, LIST), settings(tmp_path, False), settings(tmp_path, True)
    assert same_as_agent(None, listed) and same_as_agent(tuple(reversed(LIST)), listed)
    assert not same_as_agent(("api.example.org",), listed) and not same_as_agent((), listed)
    assert same_as_agent((), off) and not same_as_agent((), on)


def test_a_narrowed_agent_without_network_holds_no_value_meant_for_a_host(tmp_path):
    agent = settings(tmp_path, LIST, secrets={"PLAIN": "p-value", "BOUND": {"value": "b-value",
                                                                              "hosts": ["api.example.org"]}},
                     repos={"web": {"path": "web", "token": "t-value"}})
    off = narrowed(agent, ())
    assert (off.id, off.home, off.egress, off.network) == (agent.id, agent.home, (), False)
    assert dict(off.secrets) == {"PLAIN": "p-value"} and not off.secret_hosts
    assert [r.token for r in off.repos] == [""]
    some = narrowed(agent, ("api.example.org",))
    assert some.egress == ("api.example.org",) and some.secret_hosts == agent.secret_hosts
    assert some.repos == agent.repos and some.secrets == agent.secrets


def test_a_network_is_narrowed_only_where_the_backend_confines_it(tmp_path):
    listed, bwrap, local, kube = settings(tmp_path, LIST), backend("bwrap"), backend("local"), backend("kubernetes")
    assert narrowing(None, listed, bwrap) is None and narrowing(tuple(LIST), listed, bwrap) is None
    assert narrowing(("api.example.org",), listed, bwrap)(listed).egress == ("api.example.org",)
    assert narrowing(None, listed, local) is None  # nothing asked: the template's own, as the backend gives it
    for entries in ((), tuple(LIST)):  # local confines nothing: any ask is refused, even the template's own
        with pytest.raises(ConnectError, match=r"^network: the local sandbox confines no network"):
            narrowing(entries, listed, local)
    assert narrowing(tuple(LIST), listed, kube) is None
    with pytest.raises(ConnectError, match=r"^network: the kubernetes sandbox serves only the agent's own network"):
        narrowing((), listed, kube)
