"""guilds: the orchestrator side of the code tools (toolbox, sandboxes, record, fronts).

    async with guilds.open("agent.toml") as agent: ...      (guilds.fronts.agent)

Importing the package costs nothing more: ``open`` loads its module when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fronts.agent import Agent

__all__ = ["__version__", "open"]
__version__ = "0.1.0"
"""The package's version: pyproject.toml reads it from here."""


def open(*args: Any, **kwargs: Any) -> Agent:
    """An agent's tools, to enter with ``async with``: see ``guilds.fronts.agent.open``."""
    from .fronts.agent import open as open_agent

    return open_agent(*args, **kwargs)
