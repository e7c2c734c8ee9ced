"""An E2B sandbox's network options, mapped onto the agent's egress (docs/e2b.md, docs/network.md).

Both SDKs send, at create, ``allow_internet_access`` (a bool) and ``network``
(``allowOut``, ``denyOut``, ``rules``, ``egressProxy``, ``dnsServers`` and the
ingress options). E2B's meaning: ``allowOut`` entries win over denied ones, so
nothing is narrowed unless everything is denied (``denyOut`` holding
``0.0.0.0/0``, or ``allow_internet_access: false``, which is that). Here:

- nothing denied: the agent's own network (``None``);
- everything denied: ``allowOut``'s entries alone, read as ``agent.network``
  entries (``guilds.egress.policy``); none: no network at all (``()``).

The operator's ``agent.network`` bounds every entry: each must lie within it (a
name listed, or under a listed ``*.domain``, on ports it allows; a range within a
listed range; anything with ``true``; nothing with ``false``), else the create is
refused with ``invalid_argument``, naming the entry. A client can narrow the
agent's network, never widen it. What cannot be mapped is refused the same way:
a ``denyOut`` that is not everything, ``rules``, ``egressProxy``, unknown keys.
``dnsServers`` and the ingress options (``allowPublicTraffic``, ``maskRequestHost``,
``httpsPorts``) change nothing here: the proxy resolves names, and no sandbox URL
is served.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ...config.settings import AgentSettings
from ...egress.policy import SETTING, Allowlist, AllowlistError, HostPattern
from .connect import ConnectError

Entries = tuple[str, ...] | None
"""None: the agent's own network; a tuple: that allowlist alone (empty: no network)."""
IGNORED = ("dnsServers", "allowPublicTraffic", "maskRequestHost", "httpsPorts")
REFUSED = {"rules": "per-host transforms are not served (host-bound secrets are the agent's [secrets] hosts)",
           "egressProxy": "an egress proxy of the client's is not served"}


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
        if key not in IGNORED and key not in REFUSED and key not in ("allowOut", "denyOut"):
            raise bad(f"network.{key}: not served")
    allow = _strings(network.get("allowOut"), "network.allowOut")
    bound = _Bound(settings)
    for entry in allow:
        bound.check(entry)
    if internet is False or _denies_everything(_strings(network.get("denyOut"), "network.denyOut")):
        return tuple(dict.fromkeys(entry.strip() for entry in allow))
    return None


def _strings(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(f"{name}: a list of strings")
    return value


def _denies_everything(deny: list[str]) -> bool:
    """True when deny holds a /0; other entries alone cannot be mapped onto an allowlist."""
    if not deny:
        return False
    try:
        everything = any(ipaddress.ip_network(entry.strip(), strict=False).prefixlen == 0 for entry in deny)
    except ValueError:
        everything = False
    if not everything:
        raise bad("network.denyOut: only everything (0.0.0.0/0) can be denied here; "
                  "list what may be reached in network.allowOut")
    return True


class _Bound:
    """The operator's agent.network, as the bound of what a client may ask for."""

    def __init__(self, settings: AgentSettings):
        self.everything = settings.network
        self.allowlist = Allowlist.parse(settings.egress)
        self.setting = ("agent.network = true" if settings.network else
                        f"agent.network {list(settings.egress)}" if settings.egress else "agent.network = false")

    def check(self, entry: str) -> None:
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


def same_as_agent(entries: Entries, settings: AgentSettings) -> bool:
    """Is what was asked the agent's own network (no sandbox of its own needed)?"""
    if entries is None:
        return True
    if not entries:
        return not settings.network and not settings.egress
    return set(entries) == set(settings.egress)
