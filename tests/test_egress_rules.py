"""Header rules (guilds.egress.rules): their checks and bounds at each edge, and the egress
proxy as a process setting them on requests to real test hosts in a network namespace of
this machine (HTTPS through CONNECT, plain HTTP in absolute form), driven by curl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egress_kit import HostsAuthority, Namespace, Proxy, Relay, curl, namespace, netns_usable, upstream
from guilds.egress.proxy_config import ConfigError, parse_config
from guilds.egress.rules import RuleError, Rules, check_rules
from guilds.limits import (
    EGRESS_RULE_HEADERS_MAX,
    EGRESS_RULE_HOSTS_MAX,
    EGRESS_RULE_NAME_MAX_CHARS,
    EGRESS_RULE_VALUE_MAX_CHARS,
    EGRESS_RULE_VALUE_MIN_CHARS,
)

SRC = Path(__file__).resolve().parent.parent / "src"
VALUE = "rule-value-that-stays-outside-0001"
WILD = "wild-value-for-every-name-under-0002"


def _one(name: str = "X-Test-Token", value: str = VALUE, host: str = "api.test") -> dict[str, list]:
    return {host: [(name, value)]}


def test_hosts_are_names_or_wildcards_normalized():
    rules = check_rules({"API.Test.": [("X-A", VALUE)], "*.Wild.test": [("X-B", WILD)]})
    assert rules == {"api.test": (("X-A", VALUE),), "*.wild.test": (("X-B", WILD),)}
    for bad in ("10.0.0.1", "10.0.0.0/8", "api.test:443", "*", "*.*.test", "a b", "", 7):
        with pytest.raises(RuleError) as refused:
            check_rules({bad: [("X-A", VALUE)]})
        assert "is not a host name or *.domain" in str(refused.value) and "\n" not in str(refused.value)


def test_exact_wins_then_the_longest_wildcard_and_sets_never_merge():
    rules = Rules(check_rules({"a.x.test": [("X-A", VALUE)], "*.x.test": [("X-W", WILD)],
                               "*.test": [("X-T", WILD)]}))
    assert rules.for_host("a.x.test") == (("X-A", VALUE),)
    assert rules.for_host("b.c.x.test") == (("X-W", WILD),)
    assert rules.for_host("x.test") == (("X-T", WILD),)  # a wildcard holds names under it, not itself
    assert rules.for_host("test") == () and rules.for_host("other.example") == ()


def test_a_later_header_of_a_name_wins():
    assert check_rules({"api.test": [("X-A", VALUE), ("x-a", WILD)]}) == {"api.test": (("x-a", WILD),)}


def test_each_bound_at_its_edge():
    hosts = {f"h{n}.test": [("X-A", VALUE)] for n in range(EGRESS_RULE_HOSTS_MAX)}
    assert len(check_rules(hosts)) == EGRESS_RULE_HOSTS_MAX
    with pytest.raises(RuleError, match=f"at most {EGRESS_RULE_HOSTS_MAX}$"):
        check_rules({**hosts, "one.more.test": [("X-A", VALUE)]})
    headers = [(f"X-{n}", VALUE) for n in range(EGRESS_RULE_HEADERS_MAX)]
    assert len(check_rules({"api.test": headers})["api.test"]) == EGRESS_RULE_HEADERS_MAX
    with pytest.raises(RuleError, match=f"at most {EGRESS_RULE_HEADERS_MAX} a host"):
        check_rules({"api.test": [*headers, ("X-More", VALUE)]})
    check_rules(_one(name="X" * EGRESS_RULE_NAME_MAX_CHARS))
    with pytest.raises(RuleError, match=f"longer than {EGRESS_RULE_NAME_MAX_CHARS} characters"):
        check_rules(_one(name="X" * (EGRESS_RULE_NAME_MAX_CHARS + 1)))
    for size in (EGRESS_RULE_VALUE_MIN_CHARS, EGRESS_RULE_VALUE_MAX_CHARS):
        check_rules(_one(value="v" * size))
    for size in (EGRESS_RULE_VALUE_MIN_CHARS - 1, EGRESS_RULE_VALUE_MAX_CHARS + 1):
        with pytest.raises(RuleError, match=f"must be {EGRESS_RULE_VALUE_MIN_CHARS} to"):
            check_rules(_one(value="v" * size))


@pytest.mark.parametrize("name", ["Host", "Connection", "keep-alive", "TE", "Trailer", "Transfer-Encoding",
                                  "Upgrade", "Content-Length", "Expect", "Proxy-Authorization", "proxy-anything"])
def test_names_of_the_target_a_hop_or_the_framing_are_refused(name):
    with pytest.raises(RuleError, match=f"header '{name}' cannot be set"):
        check_rules(_one(name=name))


@pytest.mark.parametrize("name, value, says", [
    ("X A", VALUE, "is not an HTTP token"),
    ("", VALUE, "is not an HTTP token"),
    (3, VALUE, "is not an HTTP token"),
    ("X-A", 12345678, "the value must be a string"),
    ("X-A", "line\r\nX-Evil: 1", "a control or non-Latin-1 character"),
    ("X-A", "snowman \u2603 here", "a control or non-Latin-1 character"),
])
def test_bad_headers_are_refused_in_one_line(name, value, says):
    with pytest.raises(RuleError) as refused:
        check_rules(_one(name=name, value=value))
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_config_checks_its_headers_and_needs_an_authority(tmp_path):
    base = {"socket": str(tmp_path / "s"), "decisions": str(tmp_path / "d")}
    with pytest.raises(ConfigError, match="headers need ca_dir"):
        parse_config({**base, "headers": {"api.test": [["X-A", VALUE]]}})
    with pytest.raises(ConfigError, match="headers must map hosts to lists of"):
        parse_config({**base, "ca_dir": str(tmp_path), "headers": {"api.test": ["X-A"]}})
    with pytest.raises(ConfigError, match=r"egress config: headers: api\.test: header .Host. cannot be set"):
        parse_config({**base, "ca_dir": str(tmp_path), "headers": {"api.test": [["Host", VALUE]]}})
    config = parse_config({**base, "ca_dir": str(tmp_path), "headers": {"api.test": [["X-A", VALUE]]}})
    assert config.headers.for_host("api.test") == (("X-A", VALUE),)


@dataclass
class Site:
    ns: Namespace
    proxy: Proxy
    relay: Relay
    bundle: Path
    root: Path
    seen: Path
    seen_plain: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Site]:
    if not netns_usable():
        pytest.skip("needs root and ip netns for the test hosts")
    folder = tmp_path_factory.mktemp("rules")
    root = HostsAuthority(folder)
    with namespace() as ns:
        leaf = root.leaf("ruled.test", "other.test", "a.wild.test")
        with upstream(ns, folder, cert=leaf) as seen, upstream(ns, folder, cert=None, port=80) as seen_plain:
            names = ("ruled.test", "other.test", "a.wild.test")
            proxy = Proxy(folder, env={"PYTHONPATH": str(SRC), "SSL_CERT_FILE": str(root.pem)},
                          allow=[*names, f"{ns.address}/32"], resolve=dict.fromkeys(names, ns.address),
                          headers={"ruled.test": [["X-Test-Token", VALUE]], "*.wild.test": [["X-Wild", WILD]]})
            from guilds.egress.ca import CertificateAuthority

            bundle = CertificateAuthority.open(folder / "ca").trust_bundle(folder / "bundle.pem")
            relay = Relay(proxy.socket)
            try:
                yield Site(ns, proxy, relay, bundle, root.pem, seen, seen_plain)
            finally:
                relay.close()
                proxy.stop()


def _kept(seen: Path) -> dict[str, str]:
    """The headers of the last request the host kept (``/keep``), as the host got them."""
    last = [line for line in seen.read_text().splitlines() if line.startswith("KEEP ")][-1]
    return json.loads(last[5:])["headers"]


def test_a_ruled_host_gets_its_header_over_tls_replacing_the_clients(site):
    done = curl(site.relay, "https://ruled.test/keep", "-H", "x-test-token: the-sandbox-own", ca=site.bundle)
    assert done.returncode == 0, done.stderr
    kept = {k.lower(): v for k, v in _kept(site.seen).items()}
    assert kept["x-test-token"] == VALUE  # the rule's, the client's gone
    assert "the-sandbox-own" not in json.dumps(kept)


def test_an_echoed_value_comes_back_as_a_placeholder(site):
    done = curl(site.relay, "https://ruled.test/echo", ca=site.bundle)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["X-Test-Token"]
    assert VALUE not in done.stdout and len(shown) == len(VALUE) and shown != VALUE


def test_a_wildcard_rule_and_another_host(site):
    done = curl(site.relay, "https://a.wild.test/keep", ca=site.bundle)
    assert done.returncode == 0, done.stderr
    assert _kept(site.seen)["X-Wild"] == WILD
    done = curl(site.relay, "https://other.test/keep", ca=site.root)  # no rule: the host's own TLS, as it is
    assert done.returncode == 0, done.stderr
    assert not {"X-Test-Token", "X-Wild"} & set(_kept(site.seen))


def test_plain_http_in_absolute_form_gets_the_header_too(site):
    done = curl(site.relay, "http://ruled.test/keep")
    assert done.returncode == 0, done.stderr
    assert _kept(site.seen_plain)["X-Test-Token"] == VALUE
    echoed = curl(site.relay, "http://ruled.test/echo")
    assert VALUE not in echoed.stdout and "X-Test-Token" in echoed.stdout
    curl(site.relay, "http://other.test/keep")
    assert "X-Test-Token" not in _kept(site.seen_plain)


def test_a_refusal_never_shows_a_value(site):
    done = curl(site.relay, f"http://{VALUE}/", "-i")  # a refusal naming the value, as a host
    said = done.stderr + done.stdout
    assert "is not in agent.network" in said and VALUE not in said
    assert all(VALUE not in str(d["reason"]) for d in site.proxy.decision_lines())
