"""The proxy's config (``guilds.egress``'s contract), the one holder of the real values,
and the digest of the settings it was made from."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import EGRESS_LINGER_SECONDS
from .files import BUNDLE_NAME, SOCKET_NAME, EgressFiles
from .placeholders import Bound


@dataclass(frozen=True)
class Listen:
    """Where a proxy listens on TCP: the address, the port asked for (0: any) and the
    credential each connection must send first."""

    address: str
    port: int
    credential: str


def proxy_config(settings: AgentSettings, files: EgressFiles, bound: Mapping[str, Bound], *,
                 clock: str, idle_seconds: float, resolve: Mapping[str, str] | None = None,
                 listen: Listen | None = None) -> dict[str, Any]:
    """The proxy's config (guilds.egress's contract): the only holder of the real values.
    listen: a TCP address with a credential (kubernetes) in place of the Unix socket; on
    the socket the proxy sleeps after EGRESS_LINGER_SECONDS without a connection."""
    where = ({"listen": f"{listen.address}:{listen.port}", "credential": listen.credential} if listen
             else {"socket": os.path.join(files.shared, SOCKET_NAME), "linger_seconds": EGRESS_LINGER_SECONDS})
    return {
        **where,
        "allow": list(settings.egress),
        "secrets": [{"name": b.name, "placeholder": b.placeholder, "value": b.value, "hosts": list(b.hosts)}
                    for b in bound.values() if b.hosts],
        **({"headers": {host: [list(h) for h in headers] for host, headers in settings.egress_headers.items()}}
           if settings.egress_headers else {}),
        "ca_dir": files.ca_dir,
        "decisions": files.path("decisions.jsonl"),
        "resolve": dict(resolve or {}),
        "idle_clock": clock,
        "idle_seconds": idle_seconds,
        "pidfile": files.path("proxy.pid"),
    }


def settings_digest(settings: AgentSettings, *parts: Any) -> str:
    """What the running proxy must have been started from: the allowlist, the
    secrets, repositories and header rules (and any parts given, as the idle time)."""
    data = [settings.egress, sorted(settings.secrets.items()), sorted(settings.secret_hosts.items()),
            [(r.name, r.path, r.token, r.token_hosts) for r in settings.repos],
            sorted(settings.egress_headers.items()), *parts]
    return hashlib.sha256(json.dumps(data, default=list).encode()).hexdigest()


def write_trust_bundle(files: EgressFiles) -> None:
    """``run/trust.pem``: the orchestrator's authority (made on first use) plus the host's roots."""
    from ...egress.ca import CertificateAuthority

    try:
        CertificateAuthority.open(files.ca_dir).trust_bundle(os.path.join(files.shared, BUNDLE_NAME))
    except (OSError, ValueError) as exc:
        raise SandboxError(f"the egress proxy's certificate authority: {exc}") from exc
