"""What `guilds serve` takes besides the agent: HTTPS (``Tls``) and the E2B front (``E2BServing``).

    tls = Tls.checked("cert.pem", "key.pem")     # ConfigError naming what is wrong, before anything starts
    e2b = E2BServing(keys=("ci",), domain=checked_domain("guilds.localhost"))
    e2b.domain_at(8765, tls is not None)         # "guilds.localhost:8765": E2B_DOMAIN, the sandboxes' domain
    e2b.host_names()                             # ("guilds.localhost", "api.guilds.localhost")

With a domain, E2B programs reach the server by E2B's host names, as the SDKs do with
``E2B_DOMAIN`` alone: ``api.<domain>`` (the control plane), ``<port>-<sandbox id>.<domain>``
(a sandbox's port; 49983 its in-sandbox API), always over HTTPS, served here with ``Tls`` or
by a TLS front before the server (docs/e2b.md, "By host names").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN = re.compile(rf"({_LABEL}(?:\.{_LABEL})*)(?::([0-9]{{1,5}}))?")
_ADDRESS = re.compile(r"[0-9.]+")


@dataclass(frozen=True)
class Tls:
    """The server's certificate chain and private key (PEM files): uvicorn serves HTTPS with them."""

    cert: Path
    key: Path

    @classmethod
    def checked(cls, cert: str, key: str) -> Tls:
        """The pair, loaded once as the server will load them: ConfigError naming the file or
        the mismatch when they cannot serve."""
        for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
            if not Path(path).is_file():
                raise ConfigError(f"{flag}: no such file: {path}")
        import ssl  # only for a server that serves HTTPS

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(f"--tls-cert/--tls-key: {cert} and {key} are not a certificate and its key "
                              f"({exc.reason or exc})") from None
        except OSError as exc:
            raise ConfigError(f"--tls-cert/--tls-key: cannot read {cert} or {key}: {exc.strerror or exc}") from None
        return cls(Path(cert), Path(key))

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's keyword arguments for HTTPS."""
        return {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}


def checked_domain(text: str) -> str:
    """--e2b-domain's value, lowercased: a host name of one or more labels, an optional port
    (1..65535); an address is refused (E2B's host names put a label before the domain)."""
    domain = text.strip().lower()
    matched = _DOMAIN.fullmatch(domain)
    if matched is None or _ADDRESS.fullmatch(matched[1]) or len(matched[1]) > 253 \
            or (matched[2] is not None and not 0 < int(matched[2]) < 65536):
        raise ConfigError(f"--e2b-domain: {text!r} is not a host name (NAME or NAME:PORT, e.g. sandboxes.example.com)")
    return domain


@dataclass(frozen=True)
class E2BServing:
    """`guilds serve --e2b`'s options: ``keys``, the key names besides ``default``;
    ``sleep_idle``, seconds before an idle process service sleeps (None: the default, 0: never);
    ``shared``, the sandboxes are every server's on the run record (docs/deploy.md);
    ``domain``, the name E2B programs reach the server by (``E2B_DOMAIN``; None: by URL,
    ``E2B_API_URL`` and ``E2B_SANDBOX_URL``)."""

    keys: tuple[str, ...] = ()
    sleep_idle: int | None = None
    shared: bool = False
    domain: str | None = None

    def host_names(self) -> tuple[str, ...]:
        """The Host names the domain adds to the server's: its own and its control plane's."""
        if self.domain is None:
            return ()
        name = self.domain.rsplit(":", 1)[0]
        return name, f"api.{name}"

    def domain_at(self, port: int, tls: bool) -> str | None:
        """``E2B_DOMAIN`` for a server listening on port: the domain as given when it names a
        port; with the server's own TLS, clients reach it at its port; without, a TLS front
        before it answers on HTTPS's port, so the domain stays without one."""
        if self.domain is None or ":" in self.domain or not tls:
            return self.domain
        return f"{self.domain}:{port}"
