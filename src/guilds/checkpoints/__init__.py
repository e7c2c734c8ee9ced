"""Checkpoints of an agent's files (its home and repositories), and rewind.

    home_tree    a home's files as a checkpoint holds them, and putting them back
    point_store  an agent's checkpoints in the private data folder, pruned by count and size
    call_gate    calls share the sandbox, a rewind holds it alone (across processes)

The toolbox's hook, checkpoints by name and the rewind of a run are
``guilds.toolbox.checkpointing`` (docs/checkpoints.md).
"""

from .point_store import Checkpoint, CheckpointError, CheckpointStore

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore"]
