"""Every grace and drain time of the orchestrator's side, named, with the reason beside it.

The sandbox's side has its own in ``guilds_code.limits`` ("process control");
the two are tied by name below and checked against each other in
tests/test_layout.py.
"""

EXEC_KILL_GRACE_SECONDS = 2.0
"""A helper (or any exec) past its wait: SIGTERM to its group, then SIGKILL this much
later. A cancelled helper stops its own command's group within
guilds_code.limits.CANCEL_KILL_GRACE_SECONDS, which must be shorter."""
EXEC_DRAIN_SECONDS = 0.5
"""After an exec's process exited, how long to keep reading pipes a grandchild holds
(the helper's own drain, guilds_code.limits.SHELL_DRAIN_SECONDS, comes first)."""
