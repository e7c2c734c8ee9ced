"""An agent's default host uid under a root orchestrator, derived from its id: the sandbox
gives its commands this uid, and the run record keeps it unique among the running agents."""

from __future__ import annotations

import hashlib

AGENT_UID_BASE = 1_500_000_000
AGENT_UID_SPAN = 100_000_000
"""A root orchestrator's default uid for an agent: AGENT_UID_BASE + (sha256 of the
id mod AGENT_UID_SPAN), far above the uids of users, of subordinate-id ranges
(100000 + 65536 per user) and of systemd's dynamic users."""


def agent_uid(agent_id: str) -> int:
    """The default host uid (and gid) of the agent's commands under a root orchestrator."""
    digest = hashlib.sha256(agent_id.encode()).digest()
    return AGENT_UID_BASE + int.from_bytes(digest[:8], "big") % AGENT_UID_SPAN
