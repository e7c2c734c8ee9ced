"""Secrets that stay outside the sandbox: the placeholder swap and its way back.

Inside the sandbox a secret's variable holds a placeholder of the same length.
On a request to a host the secret is for, ``swap_headers`` puts the real value
in place of the placeholder in the request's header values, also inside
``Authorization: Basic base64(user:pass)`` (what git and pip send); bodies and
request lines are left as they are. What comes back passes ``Scrubber``, which
puts the placeholder back in place of the value, in headers and in the body as
it streams (a value cut across two reads is still found). Value and placeholder
have the same length, so a Content-Length stays true.
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


def _swap_text(text: str, secrets: Sequence[Secret]) -> str:
    for secret in secrets:
        text = text.replace(secret.placeholder, secret.value)
    return text


def _swap_basic(value: str, secrets: Sequence[Secret]) -> str:
    scheme, _, encoded = value.partition(" ")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("latin-1")
    except (binascii.Error, ValueError):
        return value
    swapped = _swap_text(decoded, secrets)
    if swapped == decoded:
        return value
    return f"{scheme} {base64.b64encode(swapped.encode('latin-1')).decode()}"


def swap_headers(headers: list[tuple[str, str]],
                 secrets: Sequence[Secret]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """headers with each placeholder of secrets replaced by its value (Basic auth decoded
    first), and the (sent, as written) pairs of each Basic credential swapped, so that an
    answer echoing the encoded credential can be scrubbed back too."""
    out, encoded = [], []
    for name, value in headers:
        swapped = value
        if name.lower() == "authorization" and value[:6].lower() == "basic ":
            swapped = _swap_basic(value, secrets)
            if swapped != value:
                encoded.append((swapped.partition(" ")[2], value.partition(" ")[2]))
        out.append((name, _swap_text(swapped, secrets)))
    return out, encoded


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
