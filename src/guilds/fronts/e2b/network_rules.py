"""An E2B sandbox's ``network.rules``: headers its egress proxy sets on requests to a host
(docs/e2b.md, "The network"; ``guilds.egress.rules``).

Both SDKs send, at create and in ``update_network``::

    "rules": {"api.example.com": [{"transform": {"headers": {"X-Api-Key": "…"}}}, {}]}

Each host (a name, or ``*.domain``: any name under domain, not domain itself) maps
to its rules in order; their headers are put together, a later one of a name
winning. A rule with no ``transform`` (or one without ``headers``) sets nothing.
Nothing else is taken: a key besides ``transform`` or ``headers``, an address or a
port as the host, a workload identity placeholder (``${e2b.identity.…}``: no
identity is minted here) are refused with ``invalid_argument``, one line naming the
entry, as is what ``guilds.egress.rules`` bounds.

A rule grants no network (as on E2B): its host must lie within the operator's
``agent.network`` (a name listed, or under a listed ``*.domain``; anything with
``true``), or the create is refused; a sandbox whose own network leaves the host out
keeps the rule, unused. The values are secrets: never in the sandbox (not in its
environment, its files or the proxy's refusals), scrubbed from the answers.
"""

from __future__ import annotations

from typing import Any

from ...config.settings import AgentSettings
from ...egress.policy import Allowlist, HostPattern
from ...egress.rules import RuleError, RuleSet, check_rules
from .connect import ConnectError

IDENTITY_MARK = "${e2b.identity."
"""What a workload identity placeholder begins with (the SDK's ``ctx.iam.tokens``)."""


def bad(message: str) -> ConnectError:
    return ConnectError("invalid_argument", f"network.rules: {message}")


def asked(network: dict[str, Any], settings: AgentSettings) -> RuleSet:
    """The header rules network (a create's ``network``, or an update's) asks for, checked
    and bounded by the agent's network; empty without ``rules``."""
    raw = network.get("rules")
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise bad("an object mapping hosts to lists of rules")
    try:
        rules = check_rules({host: _headers_of(host, listed) for host, listed in raw.items()})
    except RuleError as exc:
        raise bad(str(exc)) from None
    for host in rules:
        _within(host, settings)
    return rules


def _headers_of(host: object, listed: object) -> list[tuple[object, object]]:
    """The headers of one host's rules, in order."""
    if not isinstance(listed, list):
        raise bad(f"{host!r}: a list of rules")
    pairs: list[tuple[object, object]] = []
    for rule in listed:
        if not isinstance(rule, dict) or set(rule) - {"transform"}:
            raise bad(f"{host!r}: each rule is an object with transform only")
        transform = rule.get("transform") or {}
        if not isinstance(transform, dict) or set(transform) - {"headers"}:
            raise bad(f"{host!r}: a transform sets headers only")
        headers = transform.get("headers") or {}
        if not isinstance(headers, dict):
            raise bad(f"{host!r}: transform.headers maps names to values")
        for name, value in headers.items():
            if isinstance(value, str) and IDENTITY_MARK in value:
                raise bad(f"{host!r}: header {name!r}: workload identity tokens are not served")
            pairs.append((name, value))
    return pairs


def _within(host: str, settings: AgentSettings) -> None:
    """Refuse a rule whose host lies outside the operator's agent.network."""
    if settings.network:
        return
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    listed = Allowlist.parse(settings.egress).patterns
    if not any(_holds(outer, name, wildcard) for outer in listed):
        setting = f"agent.network {list(settings.egress)}" if settings.egress else "agent.network = false"
        raise bad(f"{host!r} is not in the agent's network ({setting}); a rule grants no network")


def _holds(outer: HostPattern, name: str, wildcard: bool) -> bool:
    """Does outer allow every name the rule's host names (on some port)?"""
    if outer.wildcard:
        return name.endswith("." + outer.name) or (wildcard and name == outer.name)
    return not wildcard and name == outer.name
