"""Every number of the product page, named, with the reason beside it.

Every grace and drain time of the in-sandbox side (guilds-code and
guilds-harness, whose ``guilds_harness.limits`` names them again) is in the
"process control" section; the orchestrator's own are in ``guilds.limits``.

The orchestrator imports this module too (for tool schemas and its own waits),
so it must stay standard-library only and free of work at import time.
"""

# --- the result -----------------------------------------------------------
DEFAULT_MAX_BYTES = 8192
"""CODE_RESULT_MAX_BYTES when unset: a result the model can read in one go."""
MIN_MAX_BYTES = 1024
"""The smallest cap a request may ask for: below it no head/tail shape fits."""
PLATFORM_CAP_BYTES = 64 * 1024
"""The platform pipeline's cap, applied by the orchestrator after redaction."""

# --- redaction ------------------------------------------------------------
ESCAPE_DEPTH = 4
"""Redaction undoes an escape behind up to this many backslashes: one (JSON,
re.escape, Markdown), two (re.escape inside JSON), up to JSON inside JSON
inside JSON (``guilds_code.unescape``)."""

# --- transport ------------------------------------------------------------
REQUEST_ARGV_MAX = 64 * 1024
"""A request whose base64 passes this goes through a request file instead:
one argv string is capped at 128 KiB by the kernel (MAX_ARG_STRLEN)."""
REQUEST_FILE_MAX = 16 * 1024 * 1024
"""A request file larger than this is refused without being parsed."""
OP_WAIT_SECONDS = 120
"""How long the orchestrator waits for any op but shell."""
SHELL_WAIT_EXTRA_SECONDS = 30
"""shell waits its own timeout plus this."""
STDERR_TAIL_LINES = 5
"""Lines of a failed helper's stderr quoted in 'code helper failed'."""

# --- shell ----------------------------------------------------------------
SHELL_TIMEOUT_DEFAULT = 120
SHELL_TIMEOUT_MIN = 1
SHELL_TIMEOUT_MAX = 600
TIMEOUT_EXIT_CODE = 124
"""exit_code of a command stopped at its timeout, as timeout(1) reports it."""
COMMAND_MAX_CHARS = 1024 * 1024
"""A shell command longer than this is refused (it would not fit in argv)."""
READ_CHUNK = 64 * 1024
"""Output is streamed in reads of this size into the log."""
HEAD_BYTES = 2 * 1024
"""An elided output keeps at most this much of its start..."""
TAIL_BYTES = 6 * 1024
"""...and about this much of its end, less room for the trailers."""

# --- background -----------------------------------------------------------
STATUS_TAIL_LINES = 40
"""shell_status with id shows this many last lines of the log."""
BACKGROUND_ID_PREFIX = "b"

# --- file_read ------------------------------------------------------------
READ_LIMIT_DEFAULT = 200
READ_LIMIT_MAX = 500
READ_LINE_MAX_CHARS = 400
"""A longer line is clipped with '… [+N chars]'."""
BINARY_SNIFF_BYTES = 8000
"""A NUL byte within this many first bytes makes a file binary (as git does)."""
READ_FILE_CHUNK = 64 * 1024
"""file_read reads (and hashes) the file in chunks of this size: small enough
that a chunk is still in the CPU's cache when it is hashed (with 1 MiB chunks,
hashing a GiB took 1.5x as long: the copy out of the page cache had evicted each
chunk by then), large enough that the loop's own cost stays under 5%."""
READ_BUILTIN_SHA_MAX_BYTES = 256 * 1024
"""A file under this size is hashed by the interpreter's own SHA-256: importing
hashlib loads OpenSSL, 6 ms of a 30 ms call, while OpenSSL's SHA-256 (with the
CPU's SHA instructions) is 4 to 8 times faster per byte, so it pays from here on."""
READ_COUNT_CHILD_MIN_BYTES = 16 * 1024 * 1024
"""From this size on, file_read has `wc -l` count the lines beside its hashing
pass (Python's own count costs as much as the hash); below it, spawning costs more."""

# --- code_search ----------------------------------------------------------
SEARCH_FILES_MAX = 30
SEARCH_LINES_MAX = 40
SEARCH_MATCHES_PER_FILE = 10
SEARCH_CONTEXT_MAX = 5
SEARCH_LINE_MAX_CHARS = 300
SEARCH_TIMEOUT_SECONDS = 60
SEARCH_PATH_MAX_BYTES = 64 * 1024
"""A path printed by rg longer than this is not a path (paths are at most 4 KiB)."""
SEARCH_STDERR_MAX_BYTES = 4096
"""How much of rg's stderr is kept for an error message."""
SEARCH_COALESCE_SECONDS = 0.002
"""After a small read of rg's output, how long to let more gather before the
next read: rg writes a file's lines at a time, and waking for each (320 times
in a search of the Python standard library) took a tenth of the search's time
from rg's own threads on a 2-CPU machine."""
SEARCH_COALESCE_BELOW_BYTES = 16 * 1024
"""...only after a read smaller than this: output coming faster is read at once."""

# --- log_read (the app's Full output log) ---------------------------------
LOG_HEAD_BYTES = 64 * 1024
"""The start of a log shown: where a command says what it is doing."""
LOG_TAIL_BYTES = 64 * 1024
"""The end of a log shown: where build and test errors are."""

# --- paths ----------------------------------------------------------------
PATH_MAX_LINKS = 40
"""Links followed while resolving one path, as the kernel's ELOOP limit."""
PATH_MAX_DEPTH = 256
"""Folders a resolved path may go below the home: bounds the descriptors held."""

# --- state ----------------------------------------------------------------
RUNS_KEPT = 20
"""Only the most recent runs' folders under .runs/ are kept."""
DEFAULT_STATE_DIR = "/run/guilds"
STATE_DIR_ENV = "GUILDS_STATE_DIR"
STATE_FILE_MAX_BYTES = 64 * 1024
"""A state file (cwd, a record, repos.json) larger than this is treated as corrupt."""
NAME_MAX_CHARS = 128
"""run_id, agent_id and call_id become file names: at most this long."""

# --- shell output shaping and background ----------------------------------
LOG_HOLD_BYTES = 64 * 1024
"""A foreground shell call's raw output held in memory before its log file is made: a call
whose output stays within it and is returned whole makes no file (ops/shell.py, ``_Sink``)."""
ANSI_SEQUENCE_MAX = 4096
"""An escape sequence still open after this many characters is taken as text:
holding it back longer would let one stray ESC swallow the output."""
REDRAW_PENDING_MAX = 256 * 1024
"""A line is held (for a carriage-return redraw) until its newline, up to this
many characters; a longer line is passed on, so one 2 GB line stays bounded."""
STATUS_TAIL_MAX_BYTES = 256 * 1024
"""shell_status reads at most this much of the log's end for its last lines."""
STATUS_COMMAND_MAX_CHARS = 80
"""A command's first line in shell_status is clipped to this many characters."""
RECORD_COMMAND_MAX_CHARS = 4096
"""A background record keeps this much of its command (a record must stay
under STATE_FILE_MAX_BYTES; shell_status shows only the first line)."""
COMMAND_ARGV_MAX = 100 * 1024
"""A shell command longer than this (UTF-8 bytes) is written to a file in the
run folder and sourced: one argv string is capped at 128 KiB (MAX_ARG_STRLEN)."""

# --- process control: every grace and drain time inside the sandbox --------
SHELL_KILL_GRACE_SECONDS = 2
"""shell at its timeout: SIGTERM to the whole process group, SIGKILL this much later."""
SHELL_DRAIN_SECONDS = 0.2
"""After bash exits, how long to keep reading a pipe that a grandchild holds."""
ESCAPED_KILL_GRACE_SECONDS = 1
"""A foreground call's processes that left its group (escaped.py), at the call's
end: SIGTERM, SIGKILL this much later to what is left. Short: the call waits for it."""
ESCAPED_SWEEPS = 5
"""...then look again for what they started meanwhile, at most this many times in all:
a fork loop that escaped is ended in a round or two, and the call's end stays bounded."""
ESCAPED_SETTLE_SECONDS = 0.1
"""When the first look finds no escaped process but the call's group still runs (its
`cmd &` jobs), look once more this much later: a job that was leaving the group as
bash exited (``setsid cmd &``) has left it by then. Only such calls wait for it."""
ESCAPED_PIDS_PER_SECOND_MAX = 1_000_000
"""The most pids a machine is taken to hand out a second (processes and threads
alike). The look for escaped processes reads only the pids handed out since the
call's bash while the call is shorter than pid_max / this (33 ms where pid_max
is 32768, 4.2 s at 4194304): no sooner can the pids go all the way round. A
longer call's look reads every pid of /proc."""
STOP_KILL_GRACE_SECONDS = 5
"""stop: SIGTERM to the group, SIGKILL this much later."""
STOP_WAIT_SECONDS = 0.5
"""stop waits this long for the command to go before it answers 'stopping'
and leaves the SIGKILL to a detached killer."""
CANCEL_KILL_GRACE_SECONDS = 1.0
"""A helper told to stop (SIGTERM, SIGHUP, SIGINT) mid-command sends SIGTERM to
the command's group and SIGKILL this much later: the command runs in its own
session, so nothing else would end it. It must end before the orchestrator's
own SIGKILL of the helper, guilds.limits.EXEC_KILL_GRACE_SECONDS after its SIGTERM."""
TASK_KILL_GRACE_SECONDS = 5
"""code_task at its timeout: SIGTERM to the harness's process group, SIGKILL this
much later. A harness gets a moment to save its session, so it can be resumed."""
TASK_FINAL_EXIT_GRACE_SECONDS = 5
"""After its final event, how long a harness may take to exit before it is
stopped (a headless CLI that hangs on a leftover child after answering must
not hold the call until its timeout); its status is then its final event's."""
TASK_DRAIN_SECONDS = 0.5
"""After the harness exits, how long to keep reading pipes that a leftover
child still holds, before the group is stopped."""
SERVE_WORKER_KILL_SECONDS = CANCEL_KILL_GRACE_SECONDS + 2
"""guilds-code serve: after a cancel's SIGTERM to a request's worker (which stops
its command within CANCEL_KILL_GRACE_SECONDS), a worker still there this much later
gets SIGKILL. The orchestrator waits guilds.limits.CHANNEL_CANCEL_WAIT_SECONDS for
the answer, which is longer."""
SERVE_WORKER_REQUESTS_MAX = 500
"""guilds-code serve: a worker answers at most this many requests, then exits (a
new fork takes its place), so what requests leave in its memory stays bounded."""
SERVE_HAND_SECONDS = 1.0
"""guilds-code serve: a waiting worker that has not taken a request this long after
it was handed over (its pipe full: the worker was stopped) is killed, and a fresh
fork runs the request."""
SERVE_READER_CHECK_SECONDS = 0.25
"""guilds-code serve: while a waiting worker reads stdin in the server's place (``reader``),
the server looks this often whether stdin holds bytes the worker has not taken; still so
at the next look (the worker was stopped), it takes stdin back."""
SERVE_READER_UNDO_SECONDS = 0.5
"""guilds-code serve: how long the server waits for its reader's reply when it takes stdin
back before it looks at the reader: a stopped one is killed; a live one is waited for, up to
SERVE_WORKER_KILL_SECONDS in all."""
SERVE_READER_TELL_SECONDS = 0.005
"""guilds-code serve: a request its reader took off stdin is told to the server when its op
is done or this long after it was taken, whichever comes first (``reader``): a cancel of it,
and the requests after it, reach the server at most this much later."""
SERVE_IDLE_WORKERS_MAX = 4
"""guilds-code serve: workers kept waiting for the next request; one that answers
past this many exits."""
SERVE_WORKERS_IDLE_SECONDS = 30.0
"""guilds-code serve: after this long with no request, the waiting workers exit (an
idle agent keeps no worker's memory); the next request forks a fresh one."""
SERVE_SLEEP_IDLE_SECONDS = 30.0
"""guilds-code serve: after this long with no request, none running and no background
command running, the server sleeps: a bash waiter in its process holds its pipes
(``asleep``), and the first byte of the next request execs the server again."""
WATCHDOG_READ_SECONDS = 0.05
"""guilds-code serve's watchdog: once lines have come, it reads its pipe this often
instead of waking at each line (two a shell call), until a read finds none; a
worker it follows that exits is acted on at once all the same. A worker that
dies before its first line was read is acted on at the next read."""
PROCESS_POLL_SECONDS = 0.05
"""While a grace runs: how often the supervise loop looks whether what was
signalled is gone; without a pidfd, also how often it looks whether the command
has exited."""
SUPERVISE_IDLE_WAKE_SECONDS = 1.0
"""The supervise loop's longest sleep, whatever its clocks say."""
SERVE_WARM_IDLE_SECONDS = 0.5
"""guilds-code serve: once it has had no frame and no request running this long, it imports
what every op needs (resident.WARM_MODULES); the requests before that run on workers that
import only what their own op needs."""
SERVE_TICK_SECONDS = 1.0
"""guilds-code serve: the longest sleep of its loop: reaping and the kill clocks are looked at this often."""
SERVE_REAP_TICK_SECONDS = 0.01
"""...and this often while an answered worker has yet to be reaped (it is exiting)."""
STOP_POLL_SECONDS = 0.05
"""shell_status stop: while the command's group has its grace, how often to look whether it is gone."""
STOP_KILLER_POLL_SECONDS = 0.1
"""The killer left behind a stop that outlasts the call: how often it looks whether the group is gone."""

# --- notes on a shell result -------------------------------------------------
PROMPT_MAX_CHARS = 120
"""A prompt quoted in '[it seemed to wait for input: ...]' is clipped to this."""

# --- error lines in an elided part -------------------------------------------
ERROR_LINES_MAX = 5
"""An elision lists at most this many error lines of what it left out, the first first."""
ERROR_LINE_MAX_CHARS = 160
"""Each listed error line is clipped to this many characters."""
ERROR_SCAN_MAX_BYTES = 64 * 1024 * 1024
"""At most this much of a log is read looking for error lines: bounds the time
an elided result of gigabytes spends on it (measured in docs/benchmarks.md)."""
ERROR_SCAN_SECONDS = 1.0
"""...and for at most this long: a log whose every line holds a near miss
("0 errors") is read at about 4 MB/s, one without any at about 150 MB/s."""
ERROR_LINE_SCAN_BYTES = 1024 * 1024
"""A line without a newline longer than this is matched in pieces of this size."""

# --- shell_status wait and until -----------------------------------------------
STATUS_WAIT_MIN = 1
STATUS_WAIT_MAX = 600
"""shell_status wait: 1 to 600 seconds, as a shell timeout."""
STATUS_UNTIL_WAIT_DEFAULT = 60
"""How long an until without a wait waits at most."""
UNTIL_MAX_CHARS = 1000
"""An until pattern longer than this is refused."""
UNTIL_LINE_MAX_CHARS = 200
"""The line quoted in 'matched: <line>' (and meta matched) is clipped to this."""
UNTIL_MATCH_MAX_CHARS = 4096
"""until sees at most this much of each line: a pattern that backtracks badly
stays bounded by the line, not by what a command printed without a newline."""
UNTIL_LINE_SCAN_BYTES = 64 * 1024
"""A new log line longer than this without a newline is matched in pieces of this size."""
WAIT_POLL_MIN_SECONDS = 0.05
WAIT_POLL_MAX_SECONDS = 0.5
"""Looking for new log lines (until), the helper sleeps between looks from the
first to the second, doubling while the log does not grow and back to the first
when it does: one fstat a look, so a 10-minute wait costs a few ms of CPU. A
command's end wakes it at once through a pidfd (without one, it is seen at the
next look)."""

# --- the E2B front's in-sandbox service (envd.py) ---------------------------
ENVD_KILL_GRACE_SECONDS = 2.0
"""A command past its deadline, or stopped with its sandbox: SIGKILL this long after SIGTERM."""
ENVD_POLL_SECONDS = 0.02
"""Stopping a command's group: how often it is looked at until it is gone or the grace is over."""
ENVD_DRAIN_SECONDS = 0.5
"""After a command exits, how long its output pipes are still read (a grandchild may hold them)."""
ENVD_OUTPUT_WINDOW_BYTES = 1024 * 1024
"""A command's output sent and not yet taken by the host (``ack``): past this much, its
pipes are not read until the host takes some, so a client that does not read holds
the command back instead of filling memory."""
ENVD_READ_BYTES = 64 * 1024
"""One read of a command's stdout or stderr: one data event at most."""
ENVD_CHUNK_BYTES = 1024 * 1024
"""One read or write of a file through the service: the /files endpoint moves files in these."""
ENVD_LIST_MAX_ENTRIES = 10_000
"""ListDir: at most this many names of one folder."""
ENVD_WATCHERS_MAX = 32
"""Folder watchers (``watch_create``) open at once in one sandbox: one more is refused."""
ENVD_WATCH_EVENTS_MAX = 4096
"""A watcher's events kept and not yet taken: one more ends the watcher with an error
(as a kernel queue overflow ends E2B's), its memory freed."""
ENVD_WATCH_FOLDERS_MAX = 8192
"""The folders one recursive watcher watches: a tree with more ends it with an error."""
ENVD_TERMINAL_SIZE_MAX = 65535
"""A terminal's columns and rows, each from 1 to this (the kernel's window size field)."""
ENVD_SLEEP_IDLE_SECONDS = 30
"""The service with no request for this long and nothing of its own running sleeps as a bash
waiter (``--sleep-idle``; ``asleep``); the E2B front's ``--e2b-sleep-idle`` sets it."""
ENVD_SLEEP_IDLE_MAX_SECONDS = 7 * 24 * 3600
ENVD_BUSY_LOOK_SECONDS = 1.0
"""While something of its own runs, how often the service looks whether it is done (to sleep later)."""
DIRECT_OFFER_SECONDS = 10.0
"""guilds-code serve --direct 1: how long its TCP listener waits for the orchestrator's
connection after the hello (it is closed sooner by that connection, or by a request frame
on stdin: the orchestrator kept the exec's streams)."""
DIRECT_TOKEN_SECONDS = 2.0
"""...how long a connection has to name the token before it is closed."""
DIRECT_REFUSALS_MAX = 8
"""...connections that did not name the token, before the listener is closed for good."""
