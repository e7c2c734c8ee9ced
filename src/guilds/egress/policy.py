"""The allowlist of an agent's network (``agent.network = [...]``) and its decisions.

An entry is one of:

- ``"github.com"``: that exact name, on ports 443 and 80;
- ``"*.example.org"``: any name under example.org (not example.org itself), ports 443 and 80;
- ``"host:port"`` / ``"*.example.org:8443"`` / ``"[::1]:8080"``: that port only;
- an address range, ``"10.1.2.0/24"``, ``"127.0.0.1/32"``, ``"fd00::/8"`` (a bare
  address is its own range): those addresses, on every port.
- a denied range, ``"!10.1.2.0/24"``, ``"!8.8.8.8"``: no connection to an address in
  it, whatever else the list allows (the name listed, or a wider range listed).

A connection is decided on its CONNECT target (or an absolute URL's host), never
on a ``Host`` header, and on every address its name resolves to: it is allowed
when the name is listed (or every address is in a listed range) and no address is
loopback, link-local, private, a cloud metadata address or otherwise not global,
unless a listed range holds it. A range is the only way to reach such addresses.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = frozenset({80, 443})
"""The ports a name listed without one allows: HTTP and HTTPS."""
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})
"""The cloud instance-metadata services (they hand out the machine's credentials)."""
SETTING = "agent.network"
"""The setting a refusal names, so the reader knows what to change."""

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


class AllowlistError(ValueError):
    """An entry of the allowlist that is none of the forms above; the message is one line naming it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a connection may go out, and the one-line reason a refusal shows the client."""

    allowed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A name entry: ``name`` exact, or any name under it when ``wildcard``; ``ports`` it allows."""

    name: str
    wildcard: bool
    ports: frozenset[int]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        return host.endswith("." + self.name) if self.wildcard else host == self.name


def normalize_host(host: str) -> str | None:
    """host lowercased, without a trailing dot or IPv6 brackets; None if it is no name or address."""
    host = host.strip().lower().removesuffix(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if address_of(host) is not None:
        return str(ipaddress.ip_address(host))
    labels = host.split(".")
    if not host or len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    return host


def address_of(text: str) -> IPAddress | None:
    """text as an IP address, or None. An IPv4-mapped IPv6 address is its IPv4 address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host:port`` / ``[v6]:port`` / ``host`` split; a port that is no number in 1..65535 is an error."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(text)
        return host, _port(rest[1:]) if rest else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(port)
    return text, None


def _port(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(text)
    return int(text)


def _parse_entry(entry: object) -> HostPattern | IPNetwork:
    if not isinstance(entry, str):
        raise AllowlistError(f"{SETTING}: {entry!r} is not a string")
    text = entry.strip()
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    try:
        host, port = split_host_port(text)
    except ValueError:
        raise AllowlistError(f"{SETTING}: {entry!r} has a port that is not a number from 1 to 65535") from None
    wildcard = host.startswith("*.")
    name = normalize_host(host[2:] if wildcard else host)
    if name is None or "*" in host[2 if wildcard else 0:]:
        raise AllowlistError(
            f"{SETTING}: {entry!r} is not a host name, *.domain, host:port or address range")
    return HostPattern(name, wildcard, frozenset({port}) if port else DEFAULT_PORTS)


def _parse_denied(entry: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(entry.strip()[1:].strip(), strict=False)
    except ValueError:
        raise AllowlistError(f"{SETTING}: {entry!r} is no denied address range (!10.0.0.0/8, !8.8.8.8)") from None


def _kind(address: IPAddress) -> str | None:
    """What makes address one a listed range must hold (None for a global address)."""
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "an unspecified address (this host)"
    if address.is_link_local:
        return "a link-local address"
    if address.is_private:
        return "a private address"
    if not address.is_global or address.is_multicast:
        return "not a public address"
    return None


@dataclass(frozen=True)
class Allowlist:
    """The parsed ``agent.network`` list: name patterns and address ranges."""

    patterns: tuple[HostPattern, ...] = ()
    networks: tuple[IPNetwork, ...] = ()
    denied: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[object]) -> Allowlist:
        """The allowlist of entries; AllowlistError (a ValueError) names the first bad one."""
        if isinstance(entries, str):
            raise AllowlistError(f"{SETTING}: a list of hosts is expected, not the string {entries!r}")
        entries = list(entries)
        denied = tuple(_parse_denied(e) for e in entries if isinstance(e, str) and e.strip().startswith("!"))
        parsed = [_parse_entry(e) for e in entries if not (isinstance(e, str) and e.strip().startswith("!"))]
        return cls(tuple(p for p in parsed if isinstance(p, HostPattern)),
                   tuple(p for p in parsed if not isinstance(p, HostPattern)), denied)

    def name_listed(self, host: str, port: int) -> bool:
        return any(pattern.matches(host, port) for pattern in self.patterns)

    def in_ranges(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)

    def decide(self, host: str, port: int, addresses: Sequence[IPAddress]) -> Decision:
        """May a connection to host:port, whose name resolved to addresses, go out?

        host is normalized (``normalize_host``); addresses are every address it
        resolved to (the address itself for an address), all of which the caller
        then connects to only.
        """
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        addresses = [address_of(str(a)) or a for a in addresses]
        listed = self.name_listed(host, port) or (bool(addresses) and all(self.in_ranges(a) for a in addresses))
        if not listed:
            return Decision(False, f"guilds egress: {target} is not in {SETTING}")
        if not addresses:
            return Decision(False, f"guilds egress: {target} does not resolve to any address")
        for address in addresses:
            if any(address in network for network in self.denied):
                return Decision(False, f"guilds egress: {target} resolves to {address}, in a range "
                                       f"{SETTING} denies")
            kind = _kind(address)
            if kind is not None and not self.in_ranges(address):
                return Decision(False, f"guilds egress: {target} resolves to {address}, {kind}; "
                                       f"list its range in {SETTING} to allow it")
        return Decision(True, f"{target} is in {SETTING}")
