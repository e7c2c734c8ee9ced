"""E2B sandboxes that several servers on one run record serve: ``guilds serve --e2b --e2b-shared``.

The replicas of a deployment (docs/deploy.md) share the run record and the
cluster, so an E2B sandbox's agent and its sandbox are every replica's already;
what one server held only in its memory is written to the record too, one row
of ``e2b_sandboxes`` a sandbox (``row``): its agent, key, template, metadata,
environment variables, network, lifecycle, start, end and state. Its access
token is not stored: it is derived from the servers' shared token and the
sandbox's id (``access_token``), so every replica checks it alike.

A request that names a sandbox (its path, or the in-sandbox API's
``E2b-Sandbox-Id``) is preceded by ``Sandboxes.refresh``: the row read, and the
sandbox taken up by this server when it does not hold it (its own process
service opened in the sandbox), its end and state brought up to date when it
does, forgotten when the row is gone (killed elsewhere). Each server that holds a
sandbox arms its timer; when it fires, the row's end is read again first
(``due``): a timeout set through another replica moves it. A server's stop ends
only its own process services: the sandboxes live on, served by the others,
until their end; at its start nothing is removed (another replica's sandboxes
are live). Each server's process service in a sandbox is its own; its commands are
reached through any server all the same (``shared_commands``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .lifecycle import Lifecycle

if TYPE_CHECKING:
    from ...record.store import Store
    from .sandboxes import E2BSandbox


def access_token(secret: str, sandbox_id: str) -> str:
    """A sandbox's access token: the same on every server of that secret (pure)."""
    return hmac.new(secret.encode(), f"guilds e2b access {sandbox_id}".encode(), hashlib.sha256).hexdigest()


def row(box: E2BSandbox) -> dict[str, Any]:
    """The sandbox's ``e2b_sandboxes`` row (pure)."""
    return {"id": box.id, "agent_id": box.agent_id, "key_name": box.key_name, "template": box.template,
            "metadata": box.metadata, "env_vars": box.env_vars,
            "network": None if box.network is None else list(box.network),
            "lifecycle": asdict(box.lifecycle), "started_at": box.started_at, "end_at": box.end_at,
            "state": box.state}


def lifecycle_of(found: dict[str, Any]) -> Lifecycle:
    return Lifecycle(**found["lifecycle"])


def network_of(found: dict[str, Any]) -> tuple[str, ...] | None:
    return None if found["network"] is None else tuple(found["network"])


class SharedRecord:
    """The shared sandboxes' rows, through the record; ``secret``: the servers' token."""

    def __init__(self, store: Store, secret: str):
        self.store, self.secret = store, secret

    def access_token(self, sandbox_id: str) -> str:
        return access_token(self.secret, sandbox_id)

    async def put(self, box: E2BSandbox) -> None:
        await self.store.put_e2b_sandbox(row(box))

    async def changed(self, box: E2BSandbox) -> None:
        await self.store.update_e2b_sandbox(box.id, end_at=box.end_at, state=box.state)
        if box.state != "running":  # paused: its commands ended with their process services
            await self.store.forget_e2b_commands(box.id)

    async def gone(self, sandbox_id: str) -> None:
        await self.store.forget_e2b_sandbox(sandbox_id)

    async def found(self, sandbox_id: str) -> dict[str, Any] | None:
        return await self.store.e2b_sandbox(sandbox_id)

    async def of_key(self, key_name: str) -> list[dict[str, Any]]:
        return await self.store.e2b_sandboxes_of(key_name)

    async def due(self, box: E2BSandbox) -> bool:
        """Whether the sandbox's end has come by its row (a later end, set elsewhere, taken
        into box.end_at); False when its row is gone (killed elsewhere)."""
        found = await self.found(box.id)
        if found is None:
            return False
        box.end_at = found["end_at"]
        return box.end_at <= datetime.now(UTC)
