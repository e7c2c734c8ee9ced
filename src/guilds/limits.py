"""Every grace, drain and wait time of the orchestrator's side (an exec's stop, the
sandboxes' and channels' waits, a cancelled call, a stopping server), named, with
the reason beside it.

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

# --- an exec's stop and the sandboxes' waits ---------------------------------
GROUP_POLL_SECONDS = 0.02
"""While processes are waited for to go (an exec's group in its grace, a bubblewrap
sandbox's last processes leaving its cgroup): how often to look. The helper's own
look, guilds_code.limits.PROCESS_POLL_SECONDS, is slower: it runs beside a command."""
DOCKER_DEADLINE_SLACK_SECONDS = 5.0
"""docker: how long past its timeout plus EXEC_KILL_GRACE_SECONDS an exec may stay
silent before its processes are killed from outside (a second exec). The timeout
itself is enforced inside the container; the helper's own stop
(guilds_code.limits.SHELL_KILL_GRACE_SECONDS, TASK_KILL_GRACE_SECONDS) comes first."""
DOCKER_KILL_WAIT_SECONDS = 30.0
"""docker: how long that killing exec may take before it is given up."""
KUBERNETES_DEADLINE_SLACK_SECONDS = 10.0
"""kubernetes: as DOCKER_DEADLINE_SLACK_SECONDS, longer for the API server's round
trips (each exec is a websocket through it)."""
CGROUP_REMOVE_WAIT_SECONDS = 2.0
"""bubblewrap: after a sandbox's init is killed, how long its last processes may take
to leave its cgroup before the cgroup is left for the next start."""
CHANNEL_CLOSE_WAIT_SECONDS = 2.0
"""A resident helper's channel: after its stdin is closed (the helper's server then
cancels what runs, guilds_code.limits.CANCEL_KILL_GRACE_SECONDS, and exits), how long
it may take to go before SIGKILL to its group."""
CHANNEL_CANCEL_WAIT_SECONDS = 5.0
"""After a cancel frame to a resident helper, how long a call waits for its answer:
the worker's own stop ends within guilds_code.limits.SERVE_WORKER_KILL_SECONDS."""
KUBERNETES_STATUS_WAIT_SECONDS = 10.0
"""kubernetes: after an exec found the pod's container gone, how long the pod's status
may take to say how it ended (the kubelet reports it a moment after the exec saw it)."""

# --- the run record ----------------------------------------------------------
RECORD_BUSY_WAIT_SECONDS = 10.0
"""Another process writing the same SQLite file: how long a write waits for it, in
SQLite's own busy handler and in the retries below together."""
RECORD_BUSY_RETRY_SECONDS = 0.02
"""SQLite answers "database is locked" at once, without waiting, where waiting
could deadlock (two transactions that read, then want to write; the first
process to make a fresh file's schema): the transaction is then run again from
its start after this pause, doubled each time up to 0.32 s, within
RECORD_BUSY_WAIT_SECONDS."""
RECORD_CHECKPOINT_COMMITS = 200
"""A SQLite record: after this many transactions written on the event loop, the
record thread copies the write-ahead log into the database (a passive checkpoint,
which syncs the disk), so the loop never waits on a disk sync."""

# --- the MCP front's tasks ------------------------------------------------------
MCP_TASK_AFTER_SECONDS = 2.0
"""A code_task call of a client that takes tasks becomes a task once it has run this
long without an answer: a quick refusal (bad arguments, no repository) comes back
as an ordinary result."""
MCP_TASK_POLL_SECONDS = 2.0
"""The poll interval a task suggests (``pollIntervalMs``)."""

