"""A sandbox's ingress options, as a create asks for them (E2B's ``network`` fields):

- ``allowPublicTraffic`` (default true): false makes the sandbox's ports private:
  every request to one (``ingress``) must carry the header
  ``e2b-traffic-access-token`` with the sandbox's traffic access token, which the
  create answer (and connect's) gives as ``trafficAccessToken`` (null for a public
  sandbox);
- ``maskRequestHost``: the Host header the server in the sandbox sees, ``${PORT}``
  replaced with the port asked for (none: the Host the client sent).

A fork's children keep their source's options, each child of a private one with a
token of its own; a sandbox made from a snapshot has its own create's. With ``--e2b-shared`` (``shared``)
every sandbox is public with the client's Host: the replicas share no options.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

from ...limits import E2B_MASK_HOST_MAX_CHARS
from .connect import ConnectError

PORT_PLACEHOLDER = "${PORT}"
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
"""A Host header value: a name or an address in brackets, and a port (nothing that could
end the header or start another)."""


@dataclass(frozen=True)
class Ingress:
    traffic_token: str | None = None
    """None: anyone who knows a port's host name reaches it (E2B's default)."""
    mask_host: str | None = None
    """The Host header sent in, ``${PORT}`` still in it; None: the client's."""

    def renewed(self) -> Ingress:
        """The same options for another sandbox: a private one gets a new token."""
        return self if self.traffic_token is None else replace(self, traffic_token=_token())

    def host_for(self, port: int, asked: str) -> str:
        """The Host header the server on port sees, the client having sent ``asked``."""
        return asked if self.mask_host is None else self.mask_host.replace(PORT_PLACEHOLDER, str(port))


PUBLIC = Ingress()


def _token() -> str:
    return secrets.token_urlsafe(32)


def asked(body: dict[str, Any], *, shared: bool = False) -> Ingress:
    """The ingress a create body asks for; ``invalid_argument`` (400) naming a bad field.
    shared (``--e2b-shared``): the replicas keep no ingress options in the run record, so
    a sandbox there is public with the client's Host, and asking otherwise is refused."""
    network = body.get("network") or {}
    if not isinstance(network, dict):
        return PUBLIC  # network_options refuses it, naming it
    public = network.get("allowPublicTraffic", True)
    if not isinstance(public, bool):
        raise ConnectError("invalid_argument", "network.allowPublicTraffic: true or false")
    mask = network.get("maskRequestHost")
    if mask is not None and not _is_host(mask):
        raise ConnectError("invalid_argument", "network.maskRequestHost: a host name, or host:port, at most "
                                               f"{E2B_MASK_HOST_MAX_CHARS} characters (${{PORT}}: the port)")
    if shared and (not public or mask is not None):
        raise ConnectError("invalid_argument", "network.allowPublicTraffic false and network.maskRequestHost are "
                                               "not served with --e2b-shared: every replica serves a sandbox's ports, "
                                               "and the run record keeps no ingress options")
    return Ingress(None if public else _token(), mask)


def _is_host(value: Any) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= E2B_MASK_HOST_MAX_CHARS:
        return False
    return _HOST.fullmatch(value.replace(PORT_PLACEHOLDER, "1")) is not None
