"""``Sandbox.update_network`` (``PUT /sandboxes/{id}/network``): a running sandbox's network
replaced, live, on its egress proxy (docs/e2b.md, "The network").

The body (``allowOut``, ``denyOut``, ``allow_internet_access``, ``rules``, ``egressProxy``)
replaces the whole network, omitted fields cleared, as on E2B: it is read as a create's
options (``network_options.asked``, ``network_rules.asked``), bounded by the template's
``agent.network``, and an empty body is the template's own network again, without
header rules. The new list and rules become the proxy's:
its settings changed, and the proxy, found started from others, is stopped and started
again on the new list before the answer (``egress_side.proxy_process.ensure_proxy``);
between the two no connection goes out, and every connection the old proxy carried
ends with it (fail closed). No network at all is a proxy that allows nothing.

A sandbox made without a proxy (its template's network ``true`` or ``false`` and no
options, or none at all asked) has no proxy to change: an update that would change
its network is refused with ``failed_precondition`` naming why; one that changes
nothing is served.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ...config.settings import AgentSettings
from ...sandbox.base import Backend
from . import network_options, network_rules
from .connect import ConnectError
from .sandboxes import E2BSandbox

UPDATE_KEYS = ("allowOut", "denyOut", "rules", "egressProxy")
INTERNET = "allow_internet_access"
"""The update's one key in snake case, as the SDKs send it."""


def as_create(body: dict[str, Any]) -> dict[str, Any]:
    """An update's body as a create's network options."""
    unknown = sorted(set(body) - {*UPDATE_KEYS, INTERNET})
    if unknown:
        raise ConnectError("invalid_argument", f"network.{unknown[0]}: not served")
    return {"allow_internet_access": body.get(INTERNET),
            "network": {key: body[key] for key in UPDATE_KEYS if key in body}}


async def update(box: E2BSandbox, body: dict[str, Any], settings: AgentSettings, backend: type[Backend]) -> None:
    """box's network replaced by what body asks (settings: its template's, backend: its own)."""
    asked = as_create(body)
    entries = network_options.asked(asked, settings)
    rules = network_rules.asked(asked["network"], settings)
    network_options.narrowing(entries, settings, backend, rules)  # what the backend cannot serve is refused
    live = network_options.live_entries(entries, settings)
    async with box.changing:
        egress = box.sandbox.egress
        if egress is None:
            if live != network_options.live_entries(box.network, settings) or rules:
                raise ConnectError("failed_precondition", f"sandbox '{box.id}' was made without an egress proxy "
                                   "(its template's network, unfiltered or none), so its network cannot change "
                                   "while it runs; create it with the network options instead")
            return
        egress.settings = dataclasses.replace(egress.settings, egress=live, egress_headers=rules if live else {})
        await asyncio.to_thread(egress.keep)
        box.network = None if network_options.same_as_agent(entries, settings) else live
        box.rules = rules
        box.agent.redact_also([value for headers in rules.values() for _, value in headers])
