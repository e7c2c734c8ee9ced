"""The app's rewind: the files of a run's agent as they were before one of its calls.

``app_rewinder(toolbox, toolbox_of)`` is what ``guilds serve`` hands the app (the
button on a call row that has a checkpoint, ``guilds.web.rewind``): an async
``(run_id, seq) -> line`` that rewinds through the run's agent's own checkpoints
(``guilds.toolbox.checkpointing``): the server's agent, or, with ``toolbox_of``, a
live agent made on demand. What cannot be done (no such run, an agent not served
here, a backend without checkpoints, no checkpoint before that call, a full disk)
is a GuildsError whose text is its one line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..errors import BadInput
from .toolbox import Toolbox, check_run_id

Rewind = Callable[[str, int], Awaitable[str]]
"""``(run_id, seq) -> line``: what ``guilds.web.rewind`` calls."""


def app_rewinder(toolbox: Toolbox, toolbox_of: Callable[[str], Awaitable[Toolbox]] | None = None) -> Rewind:
    """The app's rewind of this toolbox's agent's runs and, with ``toolbox_of`` (a live agent made
    on demand's toolbox by its id; BadInput for one not live), those of the agents made on demand."""
    async def rewind(run_id: str, seq: int) -> str:
        run = await toolbox.store.get_run(check_run_id(run_id))
        if run is None:
            raise BadInput(f"no run {run_id!r}")
        owner = await _toolbox_of_agent(run.agent_id)
        if owner.checkpoints is None:
            raise BadInput(f"checkpoints: not served on {owner.settings.sandbox}")
        return (await owner.checkpoints.rewind(run.id, seq)).line(run.id, seq)

    async def _toolbox_of_agent(agent_id: str) -> Toolbox:
        if agent_id == toolbox.settings.id:
            return toolbox
        if toolbox_of is not None:
            return await toolbox_of(agent_id)
        raise BadInput(f"the files of agent {agent_id} are not served here")

    return rewind
