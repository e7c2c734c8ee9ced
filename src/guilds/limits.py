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

# --- a cancelled call, a stopping server ------------------------------------
CALL_CANCEL_WAIT_SECONDS = 15.0
"""How long a cancelled MCP call may take to stop its helper and record itself:
EXEC_KILL_GRACE_SECONDS (the helper's own stop, within
guilds_code.limits.CANCEL_KILL_GRACE_SECONDS, comes first) and the record's write."""
STDIO_STOP_WAIT_SECONDS = CALL_CANCEL_WAIT_SECONDS + 5.0
"""How long a signalled stdio server waits for its connection to end (each running
call has CALL_CANCEL_WAIT_SECONDS of it) before the process ends anyway."""
SERVE_SHUTDOWN_GRACE_SECONDS = 2.0
"""On a stop signal: how long open requests may finish before their calls are cancelled."""
SERVE_CANCEL_WAIT_SECONDS = 20.0
"""At shutdown: how long the cancelled calls may take to stop their commands and be
recorded (more than CALL_CANCEL_WAIT_SECONDS)."""
