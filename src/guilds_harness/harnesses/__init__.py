"""Harness adapters by short name, imported lazily (see contract.py for the contract).

Adding a harness (aider, opencode, ...): one module with an ``ADAPTER`` that
keeps the contract, one line here, and its event streams in the conformance
suite.
"""

from __future__ import annotations

HARNESSES = {
    "claude-code": "guilds_harness.harnesses.claude_code",
    "codex": "guilds_harness.harnesses.codex",
}
"""Every harness code_task can run, by the name agent.harness gives, and its module."""
DEFAULT_HARNESS = "claude-code"


def get(name: str):
    """The adapter for a harness name of HARNESSES (KeyError otherwise)."""
    return __import__(HARNESSES[name], fromlist=("ADAPTER",)).ADAPTER  # importlib costs an import
