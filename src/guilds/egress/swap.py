"""Secrets that stay outside the sandbox: the placeholder swap and its way back.

Inside the sandbox a secret's variable holds a placeholder of the same length.
On a request to a host the secret is for, ``swap_headers`` puts the real value
in place of the placeholder where a credential goes and nowhere else: the
``Authorization`` header whose credential is the placeholder whole
(``Bearer P``, ``token P``, what gh sends), or ``Basic base64(user:pass)``
whose user or password is it (what git and pip send). Every other header, the
request line and the body keep the placeholder, so a host that stores what it
is sent and shows it back (a note, a user agent, an issue) shows the
placeholder. What comes back passes ``Scrubber``, which puts the placeholder
back in place of the value, in the head (before it is parsed, so an error
quoting a malformed line quotes the placeholder) and in the body as it streams
(a value cut across two reads is still found); ``scrub_text`` does the same for
any line the proxy writes. Value and placeholder have the same length, so a
Content-Length stays true.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .policy import Allowlist, HostPattern


@dataclass(frozen=True)
class Secret:
    """One secret of a sandbox: its ``name``, the ``placeholder`` the sandbox sees, the real
    ``value``, and the ``hosts`` it is for (names, ``*.domain``, ``host:port``)."""

    name: str
    placeholder: str
    value: str
    hosts: tuple[HostPattern, ...]

    def is_for(self, host: str, port: int) -> bool:
        return any(pattern.matches(host, port) for pattern in self.hosts)


def secret_hosts(entries: Iterable[str]) -> tuple[HostPattern, ...]:
    """A secret's host entries as patterns (an address range is no host of a secret)."""
    listed = Allowlist.parse(entries)
    if listed.networks:
        raise ValueError(f"a secret's hosts name hosts, not address ranges: {listed.networks[0]}")
    return listed.patterns


CREDENTIAL_HEADER = "authorization"
"""The one header a secret's value is put into (its name in lower case)."""
WHOLE_SCHEMES = frozenset({"bearer", "token"})
"""Authorization schemes whose credential is the placeholder whole."""


def _value_of(placeholder: str, secrets: Sequence[Secret]) -> str | None:
    return next((s.value for s in secrets if s.placeholder == placeholder), None)


def _swap_basic(encoded: str, secrets: Sequence[Secret]) -> str | None:
    """A Basic credential with its user or password (a placeholder) swapped; None if neither is one."""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("latin-1")
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(":")
    real_user, real_password = _value_of(user, secrets), _value_of(password, secrets)
    if not colon or (real_user is None and real_password is None):
        return None
    swapped = f"{real_user or user}:{real_password or password}"
    return base64.b64encode(swapped.encode("latin-1")).decode()


def _swap_credential(value: str, secrets: Sequence[Secret]) -> str | None:
    """An Authorization value with its credential swapped, or None when it holds no placeholder
    where the credential goes."""
    scheme, _, credential = value.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() in WHOLE_SCHEMES:
        real = _value_of(credential, secrets)
        return None if real is None else f"{scheme} {real}"
    if scheme.lower() == "basic":
        real = _swap_basic(credential, secrets)
        return None if real is None else f"{scheme} {real}"
    return None


def swap_headers(headers: list[tuple[str, str]],
                 secrets: Sequence[Secret]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """headers with the Authorization credential that is a placeholder of secrets replaced
    by its value (every other header as it was), and the (sent, as written) pairs of each
    Basic credential swapped, so that an answer echoing the encoded credential can be
    scrubbed back too."""
    out, encoded = [], []
    for name, value in headers:
        swapped = _swap_credential(value, secrets) if name.lower() == CREDENTIAL_HEADER else None
        if swapped is None:
            out.append((name, value))
            continue
        if swapped[:6].lower() == "basic ":
            encoded.append((swapped.partition(" ")[2], value.strip().partition(" ")[2].strip()))
        out.append((name, swapped))
    return out, encoded


def scrub_text(text: str, secrets: Sequence[Secret]) -> str:
    """text with each secret's value replaced by its placeholder (a line the proxy writes)."""
    for secret in secrets:
        text = text.replace(secret.value, secret.placeholder)
    return text


class Scrubber:
    """Streams bytes, replacing each secret's value by its placeholder (and each pair of
    ``also``, real to shown: the encoded credentials a request was sent with).

    ``feed`` returns what is safe to pass on; up to the longest value's length
    less one byte is held back, in case a value begins there; ``flush`` returns it.
    """

    def __init__(self, secrets: Sequence[Secret], also: Sequence[tuple[str, str]] = ()) -> None:
        pairs = [(s.value, s.placeholder) for s in secrets] + list(also)
        self._pairs = [(real.encode("latin-1"), shown.encode("latin-1")) for real, shown in pairs if real]
        self._keep = max((len(value) for value, _ in self._pairs), default=1) - 1
        self._tail = b""

    def scrub(self, data: bytes) -> bytes:
        """data with every whole value replaced (no carry: for a header value)."""
        for value, placeholder in self._pairs:
            data = data.replace(value, placeholder)
        return data

    def feed(self, data: bytes) -> bytes:
        if not self._pairs:
            return data
        data = self.scrub(self._tail + data)
        cut = max(len(data) - self._keep, 0)
        self._tail = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail
