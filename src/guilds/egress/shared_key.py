"""A key that servers sharing one run record share: ``<data>/egress/shared.key``
(written by whoever deploys them; optional). Where it is, an agent's placeholder
key and the egress authority's key are derived from it, so any of those servers
gives an agent's sandbox the same placeholders, and a proxy that sandbox trusts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

SHARED_KEY_NAME = "shared.key"
SHARED_KEY_MIN_BYTES = 16
"""A shared key shorter than this (whitespace stripped) is refused."""


def shared_key(egress_root: str | os.PathLike[str]) -> bytes | None:
    """The key of ``<egress root>/shared.key`` (whitespace stripped), None where there is none;
    ValueError naming the file when it is shorter than SHARED_KEY_MIN_BYTES."""
    path = os.path.join(egress_root, SHARED_KEY_NAME)
    try:
        key = Path(path).read_bytes().strip()
    except FileNotFoundError:
        return None
    if len(key) < SHARED_KEY_MIN_BYTES:
        raise ValueError(f"{path}: a shared egress key has at least {SHARED_KEY_MIN_BYTES} bytes")
    return key


def derived_key(shared: bytes, purpose: str, name: str = "") -> bytes:
    """32 bytes for purpose (and name) from the shared key (pure)."""
    return hmac.new(shared, f"guilds egress {purpose}\0{name}".encode(), hashlib.sha256).digest()
