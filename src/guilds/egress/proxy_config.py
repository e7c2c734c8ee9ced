"""The egress proxy's config file: what the orchestrator writes for one sandbox's proxy.

A JSON object (the file 0600: it holds the secrets' real values)::

    {
      "socket": "/…/egress/proxy.sock",      the Unix socket to listen on (made 0666), or
      "listen": "10.244.0.1:0",              a TCP address to listen on (port 0: any; a port
                                               taken falls back to any), with
      "credential": "…64 hex digits…",       what each TCP connection sends first
                                               (CREDENTIAL_PREFIX, it, a newline)
      "allow": ["github.com", "10.1.2.0/24"],  the agent.network list (guilds.egress.policy)
      "secrets": [{"name": "GH_TOKEN", "placeholder": "…", "value": "…",
                   "hosts": ["github.com", "api.github.com"]}],
      "headers": {"api.test": [["X-Api-Key", "…"]]},  optional: headers set on each request
                                               to a host (guilds.egress.rules); needs ca_dir
      "ca_dir": "/…/data/egress",            the certificate authority's folder (guilds.egress.ca)
      "decisions": "/…/decisions.jsonl",     where each decision is appended (guilds.egress.decisions)
      "resolve": {"git.test": "10.1.2.3"},   optional: names pinned to an address, never looked up
      "idle_clock": "/…/clock",              optional: the proxy exits when this file's mtime
      "idle_seconds": 1800,                    is older than idle_seconds (or it is gone)
      "linger_seconds": 30,                  optional: on a Unix socket, the proxy sleeps after
                                               this long without a connection (guilds.egress.waiter)
      "pidfile": "/…/proxy.pid"              optional: written once the proxy listens
    }

Exactly one of ``socket`` and ``listen``; ``credential`` with ``listen`` only. Unknown
keys are errors; every error is one line naming the key.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .policy import Allowlist, IPAddress, address_of, normalize_host
from .rules import RuleError, Rules, check_rules
from .swap import Secret, secret_hosts

KEYS = frozenset({"socket", "listen", "credential", "allow", "secrets", "headers", "ca_dir", "decisions", "resolve",
                  "idle_clock", "idle_seconds", "linger_seconds", "pidfile"})
SECRET_KEYS = frozenset({"name", "placeholder", "value", "hosts"})
CREDENTIAL_PREFIX = b"GUILDS-EGRESS "
"""What a TCP connection to the proxy sends first, before its credential and a newline."""
_CREDENTIAL = re.compile(r"[0-9a-f]{64}")


class ConfigError(ValueError):
    """The config file is unreadable or wrong; the message is one line."""


@dataclass(frozen=True)
class ProxyConfig:
    """One proxy's settings (see the module's docstring for each key)."""

    socket: Path | None
    allow: Allowlist
    decisions: Path
    ca_dir: Path | None = None
    secrets: tuple[Secret, ...] = ()
    resolve: Mapping[str, IPAddress] = field(default_factory=dict)
    idle_clock: Path | None = None
    idle_seconds: float = math.inf
    linger_seconds: float = math.inf
    """How long a proxy on a Unix socket serves on without a connection before it sleeps."""
    pidfile: Path | None = None
    listen: tuple[str, int] | None = None
    credential: str | None = None
    headers: Rules = field(default_factory=lambda: Rules({}))
    """The headers set on each request to a host (``guilds.egress.rules``)."""


def _path(raw: Mapping[str, object], key: str, required: bool = False) -> Path | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"egress config: {key} must be a path")
    return Path(value)


def _seconds(raw: Mapping[str, object], key: str) -> float:
    value = raw.get(key, math.inf)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"egress config: {key} must be a number above 0")
    return float(value)


def _secret(item: object) -> Secret:
    if not isinstance(item, dict) or set(item) != SECRET_KEYS:
        raise ConfigError(f"egress config: each secret has exactly {sorted(SECRET_KEYS)}")
    name, placeholder, value, hosts = (item[k] for k in ("name", "placeholder", "value", "hosts"))
    if not all(isinstance(v, str) and v for v in (name, placeholder, value)):
        raise ConfigError("egress config: a secret's name, placeholder and value must be non-empty strings")
    if len(placeholder) != len(value) or placeholder == value:
        raise ConfigError(f"egress config: secret {name}: the placeholder must differ from the value, "
                          f"at the same length")
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(f"egress config: secret {name}: hosts must be a non-empty list")
    try:
        return Secret(name, placeholder, value, secret_hosts(hosts))
    except ValueError as bad:
        raise ConfigError(f"egress config: secret {name}: {bad}") from None


def _resolve(raw: object) -> dict[str, IPAddress]:
    if not isinstance(raw, dict):
        raise ConfigError("egress config: resolve must map names to addresses")
    pinned = {}
    for name, address in raw.items():
        host, ip = normalize_host(str(name)), address_of(str(address))
        if host is None or ip is None:
            raise ConfigError(f"egress config: resolve: {name!r} -> {address!r} is not a name and an address")
        pinned[host] = ip
    return pinned


def _headers(raw: Mapping[str, object]) -> Rules:
    value = raw.get("headers", {})
    if not isinstance(value, dict) or not all(isinstance(v, list) and all(
            isinstance(p, list) and len(p) == 2 for p in v) for v in value.values()):
        raise ConfigError("egress config: headers must map hosts to lists of [name, value]")
    try:
        rules = Rules(check_rules({k: [tuple(p) for p in v] for k, v in value.items()}))
    except RuleError as bad:
        raise ConfigError(f"egress config: headers: {bad}") from None
    if rules.hosts and raw.get("ca_dir") is None:
        raise ConfigError("egress config: headers need ca_dir (the proxy ends TLS to set them)")
    return rules


def _listen(raw: Mapping[str, object]) -> tuple[tuple[str, int] | None, str | None]:
    """(listen's address and port, the credential), or (None, None) for a Unix socket."""
    if "listen" not in raw:
        if "credential" in raw:
            raise ConfigError("egress config: credential is only for listen")
        return None, None
    if "socket" in raw:
        raise ConfigError("egress config: socket and listen exclude each other")
    text = raw["listen"]
    address, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    if address_of(address.strip("[]")) is None or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"egress config: listen must be an address and a port, got {text!r}")
    credential = raw.get("credential")
    if not isinstance(credential, str) or not _CREDENTIAL.fullmatch(credential):
        raise ConfigError("egress config: credential must be 64 hex digits with listen")
    return (address.strip("[]"), int(port)), credential


def parse_config(raw: object) -> ProxyConfig:
    """The config of a parsed JSON object; ConfigError names the first wrong key."""
    if not isinstance(raw, dict):
        raise ConfigError("egress config: a JSON object is expected")
    unknown = set(raw) - KEYS
    if unknown:
        raise ConfigError(f"egress config: unknown key {sorted(unknown)[0]!r}")
    idle, linger = (_seconds(raw, key) for key in ("idle_seconds", "linger_seconds"))
    secrets = raw.get("secrets", [])
    if not isinstance(secrets, list):
        raise ConfigError("egress config: secrets must be a list")
    try:
        allow = Allowlist.parse(raw.get("allow", []))
    except ValueError as bad:
        raise ConfigError(f"egress config: {bad}") from None
    listen, credential = _listen(raw)
    return ProxyConfig(
        socket=None if listen else _path(raw, "socket", required=True), listen=listen, credential=credential,
        allow=allow,
        decisions=_path(raw, "decisions", required=True) or Path(), ca_dir=_path(raw, "ca_dir"),
        secrets=tuple(_secret(s) for s in secrets), resolve=_resolve(raw.get("resolve", {})),
        idle_clock=_path(raw, "idle_clock"), idle_seconds=idle, linger_seconds=linger, pidfile=_path(raw, "pidfile"),
        headers=_headers(raw))


def write_config(path: str | Path, raw: Mapping[str, object]) -> Path:
    """Check raw (``parse_config``) and write it to path as the proxy's config: 0600 from
    its first byte (it holds the secrets' values), replaced whole (a proxy starting reads
    the old or the new, never half)."""
    parse_config(dict(raw))
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(raw, out)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_config(path: str | Path) -> ProxyConfig:
    """The config in the JSON file at path."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as bad:
        raise ConfigError(f"egress config: cannot read {path}: {bad}") from None
    return parse_config(raw)
