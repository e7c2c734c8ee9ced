"""The egress proxy's pure parts: the allowlist's entries and decisions, the placeholder
swap and its scrubber, HTTP heads at their limits, the config file, the authority's files."""

from __future__ import annotations

import base64
import ipaddress
import stat

import pytest

from guilds.egress.ca import CertificateAuthority
from guilds.egress.http_head import BadHead, parse_head
from guilds.egress.policy import Allowlist, AllowlistError
from guilds.egress.proxy_config import ConfigError, load_config, parse_config, write_config
from guilds.egress.swap import Scrubber, Secret, scrub_text, secret_hosts, swap_headers
from guilds.limits import EGRESS_HEAD_MAX_BYTES, EGRESS_HEADER_COUNT_MAX, EGRESS_REQUEST_LINE_MAX_BYTES

PUBLIC = [ipaddress.ip_address("93.184.215.14")]


def ip(text: str):
    return [ipaddress.ip_address(text)]


@pytest.mark.parametrize(("entry", "named"), [
    ("git hub.com", "'git hub.com' is not a host name"),
    ("github.com:0", "'github.com:0' has a port that is not a number"),
    ("github.com:99999", "'github.com:99999' has a port"),
    ("*", "'*' is not a host name"),
    ("*.*.example.org", "'*.*.example.org' is not a host name"),
    ("exa*mple.org", "'exa*mple.org' is not a host name"),
    ("https://github.com", "'https://github.com' has a port"),
    ("", "'' is not a host name"),
    (443, "443 is not a string"),
])
def test_a_bad_entry_is_named_in_one_line(entry, named):
    with pytest.raises(AllowlistError) as bad:
        Allowlist.parse(["github.com", entry])
    assert named in str(bad.value) and "\n" not in str(bad.value)
    assert str(bad.value).startswith("agent.network: ")


def test_a_string_is_no_list():
    with pytest.raises(ValueError, match="a list of hosts is expected"):
        Allowlist.parse("github.com")


def test_a_name_allows_its_default_ports_only():
    allow = Allowlist.parse(["GitHub.com."])
    assert allow.decide("github.com", 443, PUBLIC).allowed
    assert allow.decide("github.com", 80, PUBLIC).allowed
    refused = allow.decide("github.com", 22, PUBLIC)
    assert refused == (refused.__class__(False, "guilds egress: github.com:22 is not in agent.network"))
    assert not allow.decide("api.github.com", 443, PUBLIC).allowed
    assert not allow.decide("evilgithub.com", 443, PUBLIC).allowed


def test_a_wildcard_allows_subdomains_not_the_apex():
    allow = Allowlist.parse(["*.example.org"])
    assert allow.decide("a.b.example.org", 443, PUBLIC).allowed
    assert not allow.decide("example.org", 443, PUBLIC).allowed
    assert not allow.decide("badexample.org", 443, PUBLIC).allowed


def test_a_port_entry_allows_that_port_only():
    allow = Allowlist.parse(["git.example.org:8443", "[2001:db8::1]:22"])
    assert allow.decide("git.example.org", 8443, PUBLIC).allowed
    assert not allow.decide("git.example.org", 443, PUBLIC).allowed
    assert allow.patterns[1].name == "2001:db8::1"


@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "a loopback address"),
    ("::1", "a loopback address"),
    ("::ffff:127.0.0.1", "a loopback address"),
    ("169.254.169.254", "a cloud metadata address"),
    ("fd00:ec2::254", "a cloud metadata address"),
    ("169.254.1.1", "a link-local address"),
    ("10.1.2.3", "a private address"),
    ("192.168.0.10", "a private address"),
    ("100.64.0.1", "not a public address"),
    ("0.0.0.0", "an unspecified address (this host)"),
    ("::", "an unspecified address (this host)"),
])
def test_a_listed_name_that_resolves_inward_is_refused(address, kind):
    allow = Allowlist.parse(["github.com"])
    decision = allow.decide("github.com", 443, [*PUBLIC, *ip(address)])
    assert not decision.allowed
    assert f"resolves to {address.removeprefix('::ffff:')}, {kind}" in decision.reason
    assert "list its range in agent.network" in decision.reason


def test_only_a_listed_range_lets_a_name_reach_inward():
    allow = Allowlist.parse(["git.test", "10.1.2.0/24"])
    assert allow.decide("git.test", 443, ip("10.1.2.3")).allowed
    assert not allow.decide("git.test", 443, ip("10.1.3.3")).allowed
    assert allow.decide("10.1.2.9", 5000, ip("10.1.2.9")).allowed  # a range: every port
    assert allow.decide("pinned.test", 443, ip("10.1.2.9")).allowed  # every address in a range


def test_an_unlisted_name_is_refused_before_it_is_looked_up():
    """With no addresses (not looked up) the reason is the list, not the lookup."""
    decision = Allowlist.parse(["10.0.0.0/8"]).decide("api.example.com", 443, [])
    assert decision.reason == "guilds egress: api.example.com:443 is not in agent.network"



def test_a_denied_range_wins_over_a_listed_name_and_a_wider_range():
    allow = Allowlist.parse(["github.com", "0.0.0.0/0", "!8.8.8.0/24", "! 10.1.2.3"])
    assert allow.decide("github.com", 443, PUBLIC).allowed
    assert allow.decide("1.1.1.1", 443, ip("1.1.1.1")).allowed
    refused = allow.decide("github.com", 443, [*PUBLIC, *ip("8.8.8.8")])  # any address of the name
    assert not refused.allowed
    assert refused.reason == "guilds egress: github.com:443 resolves to 8.8.8.8, in a range agent.network denies"
    assert not allow.decide("10.1.2.3", 80, ip("10.1.2.3")).allowed
    assert allow.decide("10.1.2.4", 80, ip("10.1.2.4")).allowed
    assert not allow.decide("8.8.8.255", 53, ip("::ffff:8.8.8.255")).allowed  # the mapped IPv4 address


def test_a_denied_range_alone_allows_nothing():
    assert not Allowlist.parse(["!8.8.8.8"]).decide("1.1.1.1", 443, ip("1.1.1.1")).allowed


@pytest.mark.parametrize("entry", ["!github.com", "!", "!10.0.0.0/33"])
def test_a_denied_entry_that_is_no_range_is_named(entry):
    with pytest.raises(AllowlistError, match=f"agent.network: '{entry}' is no denied address range"):
        Allowlist.parse([entry])


SECRET = Secret("GH_TOKEN", "PLACEHOLDER_0123456789", "ghp_real_token_abcdefg", secret_hosts(["git.test"]))


def test_the_placeholder_is_swapped_where_the_credential_goes_only():
    basic = base64.b64encode(f"x-access-token:{SECRET.placeholder}".encode()).decode()
    headers, encoded = swap_headers([("Authorization", f"Basic {basic}"), ("X-Other", f"token {SECRET.placeholder}"),
                                     ("Host", "git.test")], [SECRET])
    real = base64.b64encode(f"x-access-token:{SECRET.value}".encode()).decode()
    assert headers == [("Authorization", f"Basic {real}"), ("X-Other", f"token {SECRET.placeholder}"),
                       ("Host", "git.test")]
    assert encoded == [(real, basic)]
    for scheme in ("Bearer", "token", "bearer"):
        swapped, _ = swap_headers([("authorization", f"{scheme} {SECRET.placeholder}")], [SECRET])
        assert swapped == [("authorization", f"{scheme} {SECRET.value}")]
    as_user = base64.b64encode(f"{SECRET.placeholder}:x-oauth-basic".encode()).decode()
    [(_, sent)], _ = swap_headers([("Authorization", f"Basic {as_user}")], [SECRET])
    assert base64.b64decode(sent.split()[1]).decode() == f"{SECRET.value}:x-oauth-basic"


def test_the_scrubbed_text_holds_the_placeholder():
    assert scrub_text(f"bad line 'Bearer {SECRET.value}'", [SECRET]) == f"bad line 'Bearer {SECRET.placeholder}'"


def test_a_secret_is_for_its_hosts_only():
    assert SECRET.is_for("git.test", 443)
    assert not SECRET.is_for("other.test", 443)
    with pytest.raises(ValueError, match="not address ranges"):
        secret_hosts(["10.0.0.0/8"])


@pytest.mark.parametrize("chunk", [1, 2, 5, 21, 22, 23, 64])
def test_the_scrubber_finds_a_value_cut_anywhere(chunk):
    value = SECRET.value.encode()
    data = b"head " + value + b" middle " + value + value + b" tail" + value[:-1]
    scrubber = Scrubber([SECRET])
    out = b"".join(scrubber.feed(data[i:i + chunk]) for i in range(0, len(data), chunk)) + scrubber.flush()
    assert value not in out
    assert len(out) == len(data)
    assert out == data.replace(value, SECRET.placeholder.encode())


def _head(line: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([line, *headers]) + b"\r\n\r\n"


def test_a_request_line_at_its_limit_passes_and_one_byte_more_is_refused():
    prefix, suffix = b"GET http://a.test/", b" HTTP/1.1"
    fill = EGRESS_REQUEST_LINE_MAX_BYTES - len(prefix) - len(suffix)
    assert parse_head(_head(prefix + b"x" * fill + suffix)).first[0] == "GET"
    with pytest.raises(BadHead) as bad:
        parse_head(_head(prefix + b"x" * (fill + 1) + suffix))
    assert bad.value.status == 414


@pytest.mark.parametrize("line", [b"GET", b"GET /", b"GET / HTTP/2.0", b"G ET / HTTP/1.1 x", b"GET /\x01 HTTP/1.1",
                                  b"\xffGET / HTTP/1.1"])
def test_a_malformed_request_line_is_refused(line):
    with pytest.raises(BadHead) as bad:
        parse_head(_head(line))
    assert bad.value.status == 400 and "request line is malformed" in bad.value.reason


def test_too_many_header_lines_are_refused_at_the_limit():
    lines = [b"X-%d: v" % n for n in range(EGRESS_HEADER_COUNT_MAX)]
    assert len(parse_head(_head(b"GET / HTTP/1.1", *lines)).headers) == EGRESS_HEADER_COUNT_MAX
    with pytest.raises(BadHead) as bad:
        parse_head(_head(b"GET / HTTP/1.1", *lines, b"X-One-More: v"))
    assert bad.value.status == 431


@pytest.mark.parametrize("header", [b"No-Colon", b"Bad Name: v", b": empty"])
def test_a_malformed_header_is_refused(header):
    with pytest.raises(BadHead, match="a header line is malformed"):
        parse_head(_head(b"GET / HTTP/1.1", header))


def test_the_head_limit_is_a_named_size():
    assert EGRESS_HEAD_MAX_BYTES >= EGRESS_REQUEST_LINE_MAX_BYTES * 2


GOOD = {"socket": "/run/x/proxy.sock", "decisions": "/run/x/d.jsonl", "allow": ["git.test"]}


@pytest.mark.parametrize(("change", "message"), [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"socket": 3}, "socket must be a path"),
    ({"allow": ["a b"]}, "'a b' is not a host name"),
    ({"idle_seconds": float("nan")}, "idle_seconds must be a number above 0"),
    ({"idle_seconds": True}, "idle_seconds must be a number above 0"),
    ({"resolve": {"git.test": "nowhere"}}, "resolve: 'git.test' -> 'nowhere'"),
    ({"secrets": [{"name": "T", "placeholder": "abc", "value": "abcd", "hosts": ["git.test"]}]},
     "the placeholder must differ from the value, at the same length"),
    ({"secrets": [{"name": "T", "placeholder": "abc", "value": "xyz", "hosts": []}]},
     "hosts must be a non-empty list"),
])
def test_a_wrong_config_is_one_line_naming_the_key(change, message):
    with pytest.raises(ConfigError) as bad:
        parse_config({**GOOD, **change})
    assert message in str(bad.value) and "\n" not in str(bad.value)


def test_the_config_is_written_private_and_checked_first(tmp_path):
    path = write_config(tmp_path / "egress.json", {**GOOD, "secrets": [
        {"name": "T", "placeholder": "abc", "value": "xyz", "hosts": ["git.test"]}]})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_config(path).secrets[0].value == "xyz"
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        write_config(tmp_path / "other.json", {**GOOD, "colour": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["egress.json"]


def test_the_authority_is_made_once_with_a_private_key(tmp_path):
    folder = tmp_path / "egress"
    first = CertificateAuthority.open(folder)
    again = CertificateAuthority.open(folder)
    assert first.cert == again.cert
    assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_trust_bundle_holds_the_authority_and_the_hosts_roots(tmp_path, monkeypatch):
    roots = tmp_path / "roots.pem"
    roots.write_text("-----BEGIN CERTIFICATE-----\nroots of this host\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(roots))
    ca = CertificateAuthority.open(tmp_path / "egress")
    bundle = ca.trust_bundle(tmp_path / "bundle.pem").read_bytes()
    assert bundle.startswith(ca.cert_pem) and b"roots of this host" in bundle
    assert stat.S_IMODE((tmp_path / "bundle.pem").stat().st_mode) == 0o644
