"""The E2B front's API keys: each one made from the endpoint's token and a key name.

    api_key(token, "default") == "e2b_" + HMAC-SHA256(token, "guilds e2b key:default")[:40 hex digits]

So a key is bound to the token of the ``guilds serve`` that prints it (a new
token makes new keys) and is never stored. ``guilds serve --e2b`` serves the
key named ``default`` and one more per ``--e2b-key NAME``; a sandbox belongs to
the key that created it, and no other key sees it.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from ...errors import ConfigError

DEFAULT_KEY_NAME = "default"
KEY_PREFIX = "e2b_"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def api_key(token: str, name: str) -> str:
    digest = hmac.new(token.encode(), f"guilds e2b key:{name}".encode(), hashlib.sha256).hexdigest()
    return KEY_PREFIX + digest[:40]


class Keys:
    """The keys served: key -> its name; ``name_of`` compares in constant time."""

    def __init__(self, token: str, names: tuple[str, ...] = ()):
        for name in names:
            if not _NAME.fullmatch(name):
                raise ConfigError(f"--e2b-key {name!r}: a key name is 1-64 of A-Z a-z 0-9 . _ -")
        self.names = tuple(dict.fromkeys((DEFAULT_KEY_NAME, *names)))
        self.by_name = {name: api_key(token, name) for name in self.names}

    def name_of(self, given: str | None) -> str | None:
        """The name of the key given (an X-API-KEY header), or None for no key or a wrong one."""
        if not given:
            return None
        found = None
        for name, key in self.by_name.items():
            if hmac.compare_digest(given.encode(), key.encode()):
                found = name
        return found
