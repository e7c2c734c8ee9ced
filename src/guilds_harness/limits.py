"""Every number of code_task, named, with the reason beside it.

The orchestrator may import this module (tool schema, its own wait), so it
stays standard-library only and free of work at import time. The grace and
drain times are guilds_code.limits' (one module for the sandbox's side), named
here again for code_task.
"""

from guilds_code import limits as _code_limits

TIMEOUT_MINUTES_DEFAULT = 30
"""A harness working on one change rarely needs longer; the model can resume."""
TIMEOUT_MINUTES_MIN = 1
TIMEOUT_MINUTES_MAX = 120
"""Longer than this holds a run (and the orchestrator's wait) for too long."""
KILL_GRACE_SECONDS = _code_limits.TASK_KILL_GRACE_SECONDS
"""guilds_code.limits.TASK_KILL_GRACE_SECONDS."""
FINAL_EXIT_GRACE_SECONDS = _code_limits.TASK_FINAL_EXIT_GRACE_SECONDS
"""guilds_code.limits.TASK_FINAL_EXIT_GRACE_SECONDS."""
DRAIN_SECONDS = _code_limits.TASK_DRAIN_SECONDS
"""guilds_code.limits.TASK_DRAIN_SECONDS."""
WAIT_EXTRA_SECONDS = 180
"""The orchestrator waits timeout_minutes * 60 plus this: the kill grace, the
drain, and the two repository snapshots of the diffstat (each at most
SNAPSHOT_TIMEOUT_SECONDS), with room to spare."""

BRIEF_MAX_CHARS = 100_000
"""brief plus notes travel as one argv string to the harness; the kernel caps
one argv string at 128 KiB (MAX_ARG_STRLEN)."""
SESSION_ID_MAX_CHARS = 128

LINE_MAX_BYTES = 8 * 1024 * 1024
"""NDJSON size guard: one event line longer than this is not parsed, and the
log keeps only its size and start. Memory per stream stays under this."""
OVERSIZED_HEAD_BYTES = 4096
"""How much of an oversized line the log keeps."""
STDERR_LINE_MAX_BYTES = 64 * 1024
"""A stderr line longer than this is clipped in the log."""
STDERR_TAIL_LINES = 20
"""Lines of the harness's stderr kept in memory to explain a crash."""
ERROR_MAX_CHARS = 600
"""The error line of a result is clipped to this many characters."""

SNAPSHOT_TIMEOUT_SECONDS = 60
"""A repository snapshot (git add -A into a temporary index) that takes
longer is given up: the result says the diffstat is unavailable."""
DIFFSTAT_FILES_MAX = 40
"""git diff --stat lists at most this many files, then its summary line."""
DIFFSTAT_WIDTH = 100
"""git diff --stat=<width>: paths are shortened to fit lines this wide."""
