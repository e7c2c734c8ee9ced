"""Idempotent creates: ``POST /sandboxes`` with an ``Idempotency-Key`` header makes one sandbox.

    keys = CreateKeys(sandboxes)
    box, repeated = await keys.once(key_name, request.headers.get(HEADER), body, make)

A key is the API key's (its name) and the header's value together: another API key's
same value is another key. The first create with a key makes the sandbox (``make``);
a repeat with the same body answers that same sandbox (its id, its envd access token)
while it lives, and waits for it while it is being made, so that creates sent together
make one. The same key with another body is refused with 422 (the key was used for
another request: the request can never succeed as sent, whatever the server's state;
409 would say it might after a change). A body is the same when its JSON is the same
object (the order of keys and the spaces aside).

A key is forgotten when its sandbox ends (killed, timed out; a paused one lives), when
its create failed (a repeat tries again: nothing was made), E2B_CREATE_KEY_SECONDS
after its first create, and oldest first past E2B_CREATE_KEYS kept. Keys are held in
this process only: a restart removes every sandbox a stopped server left
(``Sandboxes.remove_left``), so a key kept across it would name a sandbox that is gone.

With shared sandboxes (``shared``, ``--e2b-shared``) the keys are rows of the run record
instead (``e2b_create_keys``), so a repeat sent to another server answers the same
sandbox: the first create makes the key's row and then the sandbox; a repeat finds the
row and answers its sandbox (taken up as any request's), waits for it while the row
names none yet (E2B_SHARED_KEY_WAIT_SECONDS, then ``unavailable``), or, when that sandbox
has ended, its create failed or the key is older than E2B_CREATE_KEY_SECONDS, makes it anew.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...limits import (
    E2B_CREATE_KEY_BYTES,
    E2B_CREATE_KEY_SECONDS,
    E2B_CREATE_KEYS,
    E2B_SHARED_KEY_POLL_SECONDS,
    E2B_SHARED_KEY_WAIT_SECONDS,
)
from .connect import ConnectError

if TYPE_CHECKING:
    from .sandboxes import E2BSandbox, Sandboxes

HEADER = "idempotency-key"
REPLAYED_HEADER = "Idempotent-Replayed"
"""Set to ``true`` on the answer to a repeat."""
REUSED_STATUS = 422


@dataclass
class _Kept:
    digest: str
    """The body's, as ``body_digest`` makes it."""
    made: asyncio.Future[E2BSandbox]
    at: float
    """When its first create came (monotonic)."""


def body_digest(body: dict[str, Any]) -> str:
    """The same for two bodies holding the same JSON object, whatever their keys' order and spaces."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def checked_key(value: str) -> str:
    """The header's value: 1 to E2B_CREATE_KEY_BYTES printable ASCII characters; 400 otherwise."""
    if not 1 <= len(value) <= E2B_CREATE_KEY_BYTES or not all(" " <= c <= "~" for c in value):
        raise ConnectError("invalid_argument", f"Idempotency-Key: 1 to {E2B_CREATE_KEY_BYTES} printable ASCII "
                                               "characters")
    return value


class CreateKeys:
    """The idempotency keys of one server's creates (see the module docstring)."""

    def __init__(self, sandboxes: Sandboxes):
        self.sandboxes = sandboxes
        self._kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()

    async def once(self, key_name: str, key: str | None, body: dict[str, Any],
                   make: Callable[[], Awaitable[E2BSandbox]]) -> tuple[E2BSandbox, bool]:
        """The sandbox of this create: made by make, or the one the same key made (True then)."""
        if key is None:
            return await make(), False
        name = (key_name, checked_key(key))
        digest = body_digest(body)
        if self.sandboxes.shared is not None:
            return await self._once_shared(key_name, name[1], digest, make)
        self._forget_old(time.monotonic())
        kept = self._kept.get(name)
        if kept is not None and not self._lives(kept):
            del self._kept[name]
            kept = None
        if kept is None:
            kept = _Kept(digest, asyncio.ensure_future(make()), time.monotonic())
            kept.made.add_done_callback(lambda made: self._failed(name, made))
            self._kept[name] = kept
            while len(self._kept) > E2B_CREATE_KEYS:
                self._kept.popitem(last=False)
            return await asyncio.shield(kept.made), False
        if kept.digest != digest:
            raise _reused()
        return await asyncio.shield(kept.made), True

    async def _once_shared(self, key_name: str, key: str, digest: str,
                           make: Callable[[], Awaitable[E2BSandbox]]) -> tuple[E2BSandbox, bool]:
        """``once`` with the key a row of the run record (the module docstring)."""
        store = self.sandboxes.agents.store
        deadline = time.monotonic() + E2B_SHARED_KEY_WAIT_SECONDS
        while True:
            now = datetime.now(UTC)
            found = await store.claim_create_key({"key_name": key_name, "key": key, "digest": digest,
                                                  "sandbox_id": None, "at": now})
            if found is None:
                return await self._make_keyed(key_name, key, make), False
            if found["digest"] != digest:
                raise _reused()
            if (now - found["at"]).total_seconds() > E2B_CREATE_KEY_SECONDS:
                await store.keyed_create(key_name, key, None)
                continue
            if found["sandbox_id"] is not None:
                box = await self._alive(key_name, found["sandbox_id"])
                if box is not None:
                    return box, True
                await store.keyed_create(key_name, key, None)
                continue
            if time.monotonic() > deadline:
                raise ConnectError("unavailable", "Idempotency-Key: its sandbox is still being made by another "
                                                  "server; try again")
            await asyncio.sleep(E2B_SHARED_KEY_POLL_SECONDS)

    async def _make_keyed(self, key_name: str, key: str,
                          make: Callable[[], Awaitable[E2BSandbox]]) -> E2BSandbox:
        store = self.sandboxes.agents.store
        try:
            box = await make()
        except BaseException:  # a repeat tries again: nothing was made
            await asyncio.shield(store.keyed_create(key_name, key, None))
            raise
        await store.keyed_create(key_name, key, box.id)
        return box

    async def _alive(self, key_name: str, sandbox_id: str) -> E2BSandbox | None:
        """The key's sandbox while it lives (taken up here when another server holds it)."""
        await self.sandboxes.refresh(sandbox_id)
        try:
            return self.sandboxes.get(key_name, sandbox_id)
        except ConnectError:
            return None

    def _lives(self, kept: _Kept) -> bool:
        """Its create is under way, or made a sandbox not ended yet."""
        if not kept.made.done():
            return True
        if kept.made.cancelled() or kept.made.exception() is not None:
            return False
        box = kept.made.result()
        return any(alive is box for alive in self.sandboxes.of_key(box.key_name))

    def _failed(self, name: tuple[str, str], made: asyncio.Future[E2BSandbox]) -> None:
        """A create that failed keeps no key (a repeat tries again); its error is its requests'."""
        if made.cancelled() or made.exception() is not None:
            kept = self._kept.get(name)
            if kept is not None and kept.made is made:
                del self._kept[name]

    def _forget_old(self, now: float) -> None:
        while self._kept:
            oldest = next(iter(self._kept.values()))
            if now - oldest.at < E2B_CREATE_KEY_SECONDS:
                return
            self._kept.popitem(last=False)


def _reused() -> ConnectError:
    return ConnectError("invalid_argument", "Idempotency-Key: already used for a create with another body; "
                                            "use a new key for another request", status=REUSED_STATUS)
