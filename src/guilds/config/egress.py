"""The settings of the egress allowlist: ``agent.network`` as a list, secrets and
repository tokens that name the hosts they are for (docs/network.md).

``agent.network`` is ``false`` (no network), ``true`` (the sandbox's whole,
unfiltered network) or a list of allowlist entries (``guilds.egress.policy``):
the sandbox then has no network of its own and its traffic leaves only through
the egress proxy, which allows the listed hosts only. A list is enforced by the
``bwrap``, ``docker`` and ``kubernetes`` sandboxes (kubernetes: with a CNI that
enforces NetworkPolicy); on ``local`` it is refused at load.

With a list, a secret may be a table, ``[secrets.NAME] value = "...", hosts =
[...]``, and a repository's token names its hosts (``token_hosts``, default: the
host of its ``origin`` remote and that host's API host): inside the sandbox the
variable then holds a placeholder, and the proxy puts the value in for those
hosts only.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from . import checks as check

ENFORCING_SANDBOXES = ("bwrap", "docker", "kubernetes")
"""The sandboxes that keep a list's sandbox off the network and run the egress proxy."""
NO_LIST_SANDBOXES = ("local",)
"""Refused with a list at load (``auto`` is checked when it picks its sandbox)."""
LIST_ONLY = "only with agent.network a list of hosts (the egress proxy puts the value in)"


def network(value: Any, sandbox: str) -> tuple[bool, tuple[str, ...]]:
    """agent.network -> (network, allowlist entries): a list gives (False, entries)."""
    if isinstance(value, bool):
        return value, ()
    if not isinstance(value, list):
        raise ConfigError(f"agent.network: must be true, false or a list of hosts, got {value!r}")
    entries = tuple(hosts(value, "agent.network"))
    if not entries:
        raise ConfigError("agent.network: an empty list allows nothing; write false for no network")
    if sandbox in NO_LIST_SANDBOXES:
        raise ConfigError(list_refused(sandbox))
    from ..egress.policy import Allowlist

    try:
        Allowlist.parse(list(entries))
    except ValueError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith("agent.network") else f"agent.network: {text}") from None
    return False, entries


def list_refused(sandbox: str) -> str:
    """The one-line error for a list on a sandbox that cannot enforce it."""
    return (f"agent.network: a list of hosts is enforced only by the "
            f"{', '.join(ENFORCING_SANDBOXES[:-1])} and {ENFORCING_SANDBOXES[-1]} sandboxes, not {sandbox!r}; "
            "use one of them, or true or false")


def hosts(value: Any, key: str) -> list[str]:
    """A list of non-empty host strings (each checked as an allowlist entry by the proxy's policy)."""
    if not isinstance(value, list):
        raise ConfigError(f"{key}: must be a list of hosts, got {value!r}")
    out = []
    for i, entry in enumerate(value):
        text = check.string(entry, f"{key}[{i}]").strip()
        if not text:
            raise ConfigError(f"{key}[{i}]: must not be empty")
        out.append(text)
    return out


def secret_table(entry: dict, key: str, filtered: bool) -> tuple[str, tuple[str, ...]]:
    """``[secrets.NAME] value, hosts`` -> (value, hosts); hosts only with a list."""
    check.known(entry, key, ("value", "hosts"))
    if "value" not in entry:
        raise ConfigError(f"{key}.value: missing")
    value = check.string(entry["value"], f"{key}.value")
    named = _secret_hosts(entry.get("hosts", []), f"{key}.hosts")
    if named and not filtered:
        raise ConfigError(f"{key}.hosts: {LIST_ONLY}")
    return value, named


def _secret_hosts(value: Any, key: str) -> tuple[str, ...]:
    """The hosts a value is for: names, ``*.domain`` or ``host:port`` (no address ranges)."""
    named = tuple(hosts(value, key))
    if named:
        from ..egress.swap import secret_hosts

        try:
            secret_hosts(named)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    return named


def token_hosts(entry: dict, key: str, filtered: bool) -> tuple[str, ...] | None:
    """``[repos.NAME] token_hosts`` (None: the default from the origin remote)."""
    if "token_hosts" not in entry:
        return None
    if not filtered:
        raise ConfigError(f"{key}.token_hosts: {LIST_ONLY}")
    return _secret_hosts(entry["token_hosts"], f"{key}.token_hosts")


def resolve_table(table: dict, filtered: bool) -> dict[str, str]:
    """[egress] resolve = {name = "address"}: each address a literal IP address."""
    import ipaddress

    check.known(table, "egress", ("resolve",))
    if not table:
        return {}
    if not filtered:
        raise ConfigError(f"egress.resolve: {LIST_ONLY.replace('the value in', 'it to use')}")
    out = {}
    for name, address in check.table(table.get("resolve", {}), "egress.resolve").items():
        key = f"egress.resolve.{name}"
        try:
            out[name.lower()] = str(ipaddress.ip_address(check.string(address, key)))
        except ValueError:
            raise ConfigError(f"{key}: must be an IP address, got {address!r}") from None
    return out
