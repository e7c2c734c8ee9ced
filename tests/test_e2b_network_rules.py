"""The E2B create body's ``network.rules`` read against the operator's agent.network
(guilds.fronts.e2b.network_rules), and an agent made with them (``narrowing``). The SDK
against real sandboxes and test hosts: tests/test_e2b_rules.py."""

from __future__ import annotations

import pytest

from guilds.config.settings import parse_settings
from guilds.fronts.e2b.connect import ConnectError
from guilds.fronts.e2b.network_options import EVERY_ADDRESS, narrowing
from guilds.fronts.e2b.network_rules import asked
from guilds.limits import EGRESS_RULE_HOSTS_MAX
from guilds.sandbox import backend

LIST = ["api.example.org", "*.pkg.example.org", "git.example.org:8443", "10.1.0.0/16"]
VALUE = "a-token-of-the-client-0001"


def settings(tmp_path, network):
    sandbox = "bwrap" if isinstance(network, list) else "local"
    return parse_settings({"agent": {"home": str(tmp_path / "home"), "sandbox": sandbox, "network": network}},
                          tmp_path, env={})


def rule(**headers) -> dict:
    return {"transform": {"headers": headers}}


@pytest.mark.parametrize("rules, expected", [
    (None, {}),
    ({}, {}),
    ({"api.example.org": [rule(**{"X-Test-Token": VALUE})]}, {"api.example.org": (("X-Test-Token", VALUE),)}),
    ({"API.example.org": [rule(A=VALUE), {}, {"transform": {}}, rule(B=VALUE, A=VALUE + "2")]},
     {"api.example.org": (("B", VALUE), ("A", VALUE + "2"))}),  # in order, a later one of a name winning
    ({"*.pkg.example.org": [rule(A=VALUE)], "a.pkg.example.org": [rule(B=VALUE)],
      "*.b.pkg.example.org": [rule(C=VALUE)], "git.example.org": [rule(D=VALUE)]},
     {"*.pkg.example.org": (("A", VALUE),), "a.pkg.example.org": (("B", VALUE),),
      "*.b.pkg.example.org": (("C", VALUE),), "git.example.org": (("D", VALUE),)}),  # any port the list allows
])
def test_what_is_taken(tmp_path, rules, expected):
    assert asked({"rules": rules}, settings(tmp_path, LIST)) == expected


@pytest.mark.parametrize("rules, says", [
    ({"other.example.org": [rule(A=VALUE)]}, "'other.example.org' is not in the agent's network (agent.network ["),
    ({"pkg.example.org": [rule(A=VALUE)]}, "'pkg.example.org' is not in"),  # *.domain is not the domain
    ({"*.example.org": [rule(A=VALUE)]}, "'*.example.org' is not in"),  # wider than the list's
    ({"10.1.2.3": [rule(A=VALUE)]}, "'10.1.2.3' is not a host name or *.domain"),
    ({"10.1.0.0/16": [rule(A=VALUE)]}, "'10.1.0.0/16' is not a host name or *.domain"),
    ({"api.example.org:443": [rule(A=VALUE)]}, "'api.example.org:443' is not a host name or *.domain"),
    ({"*": [rule(A=VALUE)]}, "'*' is not a host name or *.domain"),
    (["api.example.org"], "network.rules: an object mapping hosts to lists of rules"),
    ({"api.example.org": {"transform": {}}}, "'api.example.org': a list of rules"),
    ({"api.example.org": [{"transform": {}, "match": "x"}]}, "each rule is an object with transform only"),
    ({"api.example.org": [{"transform": {"body": "x"}}]}, "a transform sets headers only"),
    ({"api.example.org": [{"transform": {"headers": ["A"]}}]}, "transform.headers maps names to values"),
    ({"api.example.org": [rule(Host=VALUE)]}, "header 'Host' cannot be set"),
    ({"api.example.org": [rule(**{"Proxy-Authorization": VALUE})]}, "header 'Proxy-Authorization' cannot be set"),
    ({"api.example.org": [rule(Connection=VALUE)]}, "header 'Connection' cannot be set"),
    ({"api.example.org": [rule(A="short")]}, "header 'A': the value must be 8 to"),
    ({"api.example.org": [rule(A="Bearer ${e2b.identity.tokens.aws}")]}, "workload identity tokens are not served"),
    ({f"h{n}.pkg.example.org": [rule(A=VALUE)] for n in range(EGRESS_RULE_HOSTS_MAX + 1)},
     f"at most {EGRESS_RULE_HOSTS_MAX}"),
])
def test_what_is_refused_in_one_line(tmp_path, rules, says):
    with pytest.raises(ConnectError) as refused:
        asked({"rules": rules}, settings(tmp_path, LIST))
    message = str(refused.value)
    assert refused.value.code == "invalid_argument" and message.startswith("network.rules: ")
    assert says in message and "\n" not in message, message
    assert VALUE not in message


def test_the_operators_true_and_false_bound_everything_and_nothing(tmp_path):
    anything = {"rules": {"anything.example.com": [rule(A=VALUE)]}}
    assert asked(anything, settings(tmp_path, True)) == {"anything.example.com": (("A", VALUE),)}
    with pytest.raises(ConnectError, match=r"is not in the agent's network \(agent.network = false\)"):
        asked(anything, settings(tmp_path, False))


def test_an_agent_with_rules_has_a_proxy_of_its_own_setting_them(tmp_path):
    listed, everything = settings(tmp_path, LIST), settings(tmp_path, True)
    rules = {"api.example.org": (("A", VALUE),)}
    made = narrowing(None, listed, backend("bwrap"), rules)(listed)
    assert (made.egress, dict(made.egress_headers), made.network) == (tuple(LIST), rules, False)
    assert VALUE in made.secret_values()  # redacted wherever a secret is
    wide = narrowing(None, everything, backend("docker"), rules)(everything)
    assert (wide.egress, dict(wide.egress_headers)) == (EVERY_ADDRESS, rules)  # true: every address, by the proxy
    narrow = narrowing(("api.example.org",), listed, backend("bwrap"), rules)(listed)
    assert (narrow.egress, dict(narrow.egress_headers)) == (("api.example.org",), rules)
    assert not narrowing((), listed, backend("bwrap"), rules)(listed).egress_headers  # no network: no value kept


@pytest.mark.parametrize("name", ["local", "kubernetes"])
def test_a_backend_without_a_proxy_of_the_sandboxs_own_refuses_rules(tmp_path, name):
    listed = settings(tmp_path, LIST)
    with pytest.raises(ConnectError) as refused:
        narrowing(None, listed, backend(name), {"api.example.org": (("A", VALUE),)})
    assert str(refused.value) == (f"network.rules: the {name} sandbox has no egress proxy of its own to set "
                                  "headers with; header rules are served on bwrap and docker")
