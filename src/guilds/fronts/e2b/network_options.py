"""An E2B sandbox's network options, mapped onto the agent's egress (docs/e2b.md, docs/network.md).

Both SDKs send, at create, ``allow_internet_access`` (a bool) and ``network``
(``allowOut``, ``denyOut``, ``rules``, ``egressProxy``, ``dnsServers`` and the
ingress options). E2B's meaning: ``allowOut`` entries win over denied ones, so
a denied range is reached when allowOut lists it. Here:

- nothing denied: the agent's own network (``None``);
- everything denied (``denyOut`` holding ``0.0.0.0/0``, or
  ``allow_internet_access: false``, which is that): ``allowOut``'s entries alone,
  read as ``agent.network`` entries (``guilds.egress.policy``); none: no network at
  all (``()``);
- some ranges denied: the agent's own network (``true`` read as every address)
  with each denied range, less what allowOut's ranges hold, as a ``!range`` entry,
  which the egress proxy enforces; allowOut then holds ranges only.

The operator's ``agent.network`` bounds every entry: each must lie within it (a
name listed, or under a listed ``*.domain``, on ports it allows; a range within a
listed range; anything with ``true``; nothing with ``false``), else the create is
refused with ``invalid_argument``, naming the entry. A client can narrow the
agent's network, never widen it. What cannot be mapped is refused the same way:
a ``denyOut`` entry that is no address range, ``egressProxy``, unknown keys. ``rules``
(headers the proxy sets for a host) are ``network_rules``'.
``dnsServers`` and the ingress options (``allowPublicTraffic``, ``maskRequestHost``,
``httpsPorts``) change nothing here: the proxy resolves names, and the ingress
options are ``ingress_options``' (``httpsPorts``: ports are served over HTTP).

A narrower network is its agent's own (``narrowing``): every E2B sandbox is an
agent with a sandbox, an egress proxy and a network namespace of its own, so its
settings simply say less (``narrowed``): ``agent.network`` the entries asked for.
With no network at all, the values the proxy would have put in (host-bound
secrets, repository tokens) are left out: nothing inside could use them. Where
the backend confines no network (local), any create that denies something is
refused; where it serves only the template's own network (kubernetes), a
narrower one is refused: a sandbox never gets more than it asked for. Header rules
need a proxy of the sandbox's own: with rules, the agent is narrowed to the network
asked (the template's list; every address for ``true``) and its proxy given them;
the backends that cannot (local, kubernetes) refuse them.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
from collections.abc import Callable
from typing import Any

from ...config.settings import AgentSettings
from ...egress.policy import SETTING, Allowlist, AllowlistError, HostPattern, IPNetwork
from ...egress.rules import RuleSet
from ...sandbox.base import Backend
from .connect import ConnectError

Entries = tuple[str, ...] | None
"""None: the agent's own network; a tuple: that allowlist alone (empty: no network)."""
EVERY_ADDRESS = ("0.0.0.0/0", "::/0")
"""``agent.network = true`` as entries of a list, for a proxy that denies some of it."""
IGNORED = ("dnsServers", "allowPublicTraffic", "maskRequestHost", "httpsPorts")
REFUSED = {"egressProxy": "an egress proxy of the client's is not served"}
SERVED = ("allowOut", "denyOut", "rules")


def bad(message: str) -> ConnectError:
    return ConnectError("invalid_argument", message)


def asked(body: dict[str, Any], settings: AgentSettings) -> Entries:
    """The network a create body asks for, bounded by the agent's (see the module docstring)."""
    internet = body.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise bad("allow_internet_access: true or false")
    network = body.get("network") or {}
    if not isinstance(network, dict):
        raise bad("network: an object")
    for key, value in network.items():
        if key in REFUSED and value not in (None, {}, []):
            raise bad(f"network.{key}: {REFUSED[key]}")
        if key not in IGNORED and key not in REFUSED and key not in SERVED:
            raise bad(f"network.{key}: not served")
    allow = _strings(network.get("allowOut"), "network.allowOut")
    bound = _Bound(settings)
    for entry in allow:
        bound.check(entry)
    denied = [_denied_range(entry) for entry in _strings(network.get("denyOut"), "network.denyOut")]
    if internet is False or any(r.prefixlen == 0 for r in denied):
        return tuple(dict.fromkeys(entry.strip() for entry in allow))
    return _denying(denied, allow, settings) if denied else None


def _strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(f"{name}: a list of strings")
    return value


def _denied_range(entry: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise bad(f"network.denyOut: {entry!r} is no address range (10.0.0.0/8, 8.8.8.8)") from None


def _denying(denied: list[IPNetwork], allow: list[str], settings: AgentSettings) -> Entries:
    """The template's network less the denied ranges (``!range`` entries, guilds.egress.policy),
    each less the ranges allowOut lists (allowOut wins, as on E2B); None when that denies
    nothing the template reaches. Everything (``agent.network = true``) is read as every
    address, so that the proxy can deny some."""
    ranges = []
    for entry in allow:
        try:
            ranges.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise bad(f"network.allowOut: {entry!r}: with a denyOut short of everything, allowOut holds "
                      "address ranges only (names are allowed over a deny of everything)") from None
    left = _less(denied, ranges)
    base = EVERY_ADDRESS if settings.network else settings.egress
    if not left or not base:
        return None
    return (*base, *(f"!{r}" for r in dict.fromkeys(left)))


def _less(denied: list[IPNetwork], allowed: list[IPNetwork]) -> list[IPNetwork]:
    """denied, less every address an allowed range holds."""
    for cut in allowed:
        kept: list[IPNetwork] = []
        for r in denied:
            if r.version != cut.version or not r.overlaps(cut):
                kept.append(r)
            elif not r.subnet_of(cut):  # type: ignore[arg-type]
                kept.extend(r.address_exclude(cut))  # type: ignore[arg-type]
        denied = kept
    return denied


class _Bound:
    """The operator's agent.network, as the bound of what a client may ask for."""

    def __init__(self, settings: AgentSettings):
        self.everything = settings.network
        self.allowlist = Allowlist.parse(settings.egress)
        self.setting = ("agent.network = true" if settings.network else
                        f"agent.network {list(settings.egress)}" if settings.egress else "agent.network = false")

    def check(self, entry: str) -> None:
        if entry.strip().startswith("!"):
            raise bad(f"network.allowOut: {entry!r} is not a host name, *.domain, host:port or address range")
        try:
            parsed = Allowlist.parse([entry])
        except AllowlistError as exc:
            raise bad(str(exc).replace(f"{SETTING}: ", "network.allowOut: ", 1)) from None
        if not (self.everything or self._holds(parsed)):
            raise bad(f"network.allowOut: {entry!r} is not in the agent's network ({self.setting}); "
                      "a sandbox may narrow it, never widen it")

    def _holds(self, parsed: Allowlist) -> bool:
        if parsed.networks:
            inner = parsed.networks[0]
            return any(inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]
                       for outer in self.allowlist.networks)
        pattern = parsed.patterns[0]
        return all(any(_holds(outer, pattern, port) for outer in self.allowlist.patterns) for port in pattern.ports)


def _holds(outer: HostPattern, inner: HostPattern, port: int) -> bool:
    """Does outer allow every name inner allows, on port?"""
    if port not in outer.ports:
        return False
    if outer.wildcard:
        return inner.name.endswith("." + outer.name) or (inner.wildcard and inner.name == outer.name)
    return not inner.wildcard and inner.name == outer.name


def network_reported(entries: tuple[str, ...]) -> dict[str, list[str]]:
    """A narrowed sandbox's ``network``, as ``GET /sandboxes/{id}`` reports it."""
    denied = [e[1:] for e in entries if e.startswith("!")]
    if denied:
        return {"allowOut": [], "denyOut": denied}
    return {"allowOut": list(entries), "denyOut": ["0.0.0.0/0"]}


def live_entries(entries: Entries, settings: AgentSettings) -> tuple[str, ...]:
    """What an egress proxy allows for entries: the template's own list for None (every
    address for ``agent.network = true``, none for ``false``)."""
    if entries is not None:
        return entries
    return EVERY_ADDRESS if settings.network else tuple(settings.egress)


def same_as_agent(entries: Entries, settings: AgentSettings) -> bool:
    """Is what was asked the template's own network (nothing to narrow)?"""
    if entries is None:
        return True
    if not entries:
        return not settings.network and not settings.egress
    return set(entries) == set(settings.egress)


def narrowing(entries: Entries, settings: AgentSettings, backend: type[Backend],
              rules: RuleSet | None = None) -> Callable[[AgentSettings], AgentSettings] | None:
    """How an agent of the template (its settings, its backend) is made for what a create
    asked (its network, its header rules): None, as the template gives; else its settings
    narrowed (``narrowed``). ``invalid_argument`` where its backend cannot confine the
    network asked for, or has no egress proxy of the sandbox's own for its rules."""
    if entries is not None and not backend.isolates:
        raise bad(f"network: the {backend.name} sandbox confines no network (its commands have the host's); "
                  "serve the agent on bwrap or docker")
    if rules:
        if not backend.isolates or not backend.own_networks:
            raise bad(f"network.rules: the {backend.name} sandbox has no egress proxy of its own to set headers "
                      "with; header rules are served on bwrap and docker")
        return functools.partial(narrowed, entries=live_entries(entries, settings), rules=rules)
    if entries is None or same_as_agent(entries, settings):
        return None
    if not backend.own_networks:
        raise bad(f"network: the {backend.name} sandbox serves only the agent's own network; narrower networks "
                  "are served on bwrap and docker")
    return functools.partial(narrowed, entries=entries)


def narrowed(settings: AgentSettings, entries: tuple[str, ...], rules: RuleSet | None = None) -> AgentSettings:
    """The settings of an agent whose network is only entries, its proxy setting rules'
    headers (none: no network at all, and no value meant for a host)."""
    own = dataclasses.replace(settings, network=False, egress=entries, egress_headers=dict(rules or {}))
    if entries:
        return own
    return dataclasses.replace(
        own, secrets={k: v for k, v in settings.secrets.items() if k not in settings.secret_hosts},
        secret_hosts={}, egress_resolve={}, egress_headers={},
        repos=tuple(dataclasses.replace(r, token="", token_hosts=None) for r in settings.repos))
