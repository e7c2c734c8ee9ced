"""Header rules: headers the egress proxy sets on each request to a host (docs/network.md).

A rule set maps a host to the headers set on every request to it::

    {"api.example.com": [["X-Api-Key", "…"]], "*.example.org": [["Authorization", "Bearer …"]]}

A host is a name (that name only) or ``*.domain`` (any name under domain at any depth,
not domain itself); an exact name wins over a wildcard, a longer wildcard over a
shorter one, and sets are never merged. A header replaces any of the same name the
client sent. The values are the sandbox's secrets: the proxy ends the client's TLS to
such a host (as for a host a secret is for) to set them, and scrubs each from every
answer and every line it writes, a placeholder of the same length in its place.

Bounds (``guilds.limits``): at most EGRESS_RULE_HOSTS_MAX hosts and
EGRESS_RULE_HEADERS_MAX headers a host; a name up to EGRESS_RULE_NAME_MAX_CHARS, a
token; a value from EGRESS_RULE_VALUE_MIN_CHARS to EGRESS_RULE_VALUE_MAX_CHARS
printable characters. Names that speak to one hop or frame the body (``Connection``,
``Proxy-*``, ``Host``, ``Content-Length``, …) are refused. ``check_rules`` raises
``RuleError``, one line naming the entry.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..limits import (
    EGRESS_RULE_HEADERS_MAX,
    EGRESS_RULE_HOSTS_MAX,
    EGRESS_RULE_NAME_MAX_CHARS,
    EGRESS_RULE_VALUE_MAX_CHARS,
    EGRESS_RULE_VALUE_MIN_CHARS,
)
from .policy import address_of, normalize_host
from .swap import Secret

Headers = tuple[tuple[str, str], ...]
RuleSet = Mapping[str, Headers]
"""A checked rule set: each host (``name`` or ``*.domain``, normalized) -> its headers."""

REFUSED_NAMES = frozenset({"host", "connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade",
                           "content-length", "expect"})
"""Header names a rule may not set (besides ``Proxy-*``): the target's, one hop's, the body's framing."""
_TOKEN = frozenset("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits)
_PLACEHOLDER_CHARS = string.ascii_letters + string.digits


class RuleError(ValueError):
    """A rule set that cannot be served; the message is one line naming the entry."""


def rule_host(key: object) -> str:
    """A rule's host key normalized (``name`` or ``*.domain``); RuleError for anything else."""
    text = key.strip().lower() if isinstance(key, str) else ""
    wildcard = text.startswith("*.")
    name = normalize_host(text[2:] if wildcard else text) if text else None
    if name is None or "*" in name or address_of(name) is not None:
        raise RuleError(f"{key!r} is not a host name or *.domain (a rule names hosts, not addresses or ports)")
    return f"*.{name}" if wildcard else name


def check_header(host: str, name: object, value: object) -> tuple[str, str]:
    """One header of host's rules checked; RuleError naming it."""
    if not isinstance(name, str) or not name or not set(name) <= _TOKEN:
        raise RuleError(f"{host}: header name {name!r} is not an HTTP token")
    if len(name) > EGRESS_RULE_NAME_MAX_CHARS:
        raise RuleError(f"{host}: header name {name[:40]!r}… is longer than {EGRESS_RULE_NAME_MAX_CHARS} characters")
    lower = name.lower()
    if lower in REFUSED_NAMES or lower.startswith("proxy-"):
        raise RuleError(f"{host}: header {name!r} cannot be set (it names the target, one hop or the body's framing)")
    if not isinstance(value, str):
        raise RuleError(f"{host}: header {name!r}: the value must be a string")
    if not all(c == "\t" or (c.isprintable() and ord(c) < 256) for c in value):
        raise RuleError(f"{host}: header {name!r}: the value holds a control or non-Latin-1 character")
    if not EGRESS_RULE_VALUE_MIN_CHARS <= len(value) <= EGRESS_RULE_VALUE_MAX_CHARS:
        raise RuleError(f"{host}: header {name!r}: the value must be {EGRESS_RULE_VALUE_MIN_CHARS} to "
                        f"{EGRESS_RULE_VALUE_MAX_CHARS} characters (it is {len(value)}); every value is "
                        "scrubbed from answers as a secret")
    return name, value


def check_headers(host: str, pairs: Sequence[tuple[object, object]]) -> Headers:
    """host's headers checked, the last of a name (any case) kept; RuleError naming the first bad one."""
    kept: dict[str, tuple[str, str]] = {}
    for name, value in pairs:
        header = check_header(host, name, value)
        kept.pop(header[0].lower(), None)
        kept[header[0].lower()] = header
    if len(kept) > EGRESS_RULE_HEADERS_MAX:
        raise RuleError(f"{host}: {len(kept)} headers; at most {EGRESS_RULE_HEADERS_MAX} a host")
    return tuple(kept.values())


def check_rules(raw: Mapping[object, Sequence[tuple[object, object]]]) -> dict[str, Headers]:
    """A rule set's hosts and headers checked (see the module docstring)."""
    if len(raw) > EGRESS_RULE_HOSTS_MAX:
        raise RuleError(f"{len(raw)} hosts; at most {EGRESS_RULE_HOSTS_MAX}")
    out: dict[str, Headers] = {}
    for key, pairs in raw.items():
        host = rule_host(key)
        if host in out:
            raise RuleError(f"{key!r}: the host is named twice")
        out[host] = check_headers(host, pairs)
    return out


@dataclass(frozen=True)
class Rules:
    """A checked rule set as the proxy uses it: ``for_host`` and the values' stand-ins."""

    hosts: RuleSet

    def for_host(self, host: str) -> Headers:
        """The headers set on requests to host (normalized): its own rules, else the longest
        ``*.domain`` holding it, else none."""
        exact = self.hosts.get(host)
        if exact is not None:
            return exact
        under = [key for key in self.hosts if key.startswith("*.") and host.endswith(key[1:])]
        return self.hosts[max(under, key=len)] if under else ()

    def hidden(self) -> tuple[Secret, ...]:
        """Each value as a secret for no host (a fresh placeholder of its length): what the
        proxy scrubs from answers and from its own lines, never puts in."""
        return tuple(Secret(f"header {name} of {host}", _stand_in(value), value, ())
                     for host, headers in self.hosts.items() for name, value in headers)


def _stand_in(value: str) -> str:
    """A random stand-in of value's length, never value itself."""
    while True:
        out = "".join(secrets.choice(_PLACEHOLDER_CHARS) for _ in value)
        if out != value:
            return out
