"""Every grace, drain, poll and wait time of the orchestrator's side, named, with the
reason beside it: an exec's stop, a cancelled call, a stopping server, the
sandboxes' (docker, bubblewrap, kubernetes, the containers' init) and the
resident channel's waits, the record's busy waits and owners' lease, the app's
event stream and login sessions, the MCP front's, doctor's probes, mini-swe-agent's default command
timeout. A module that names one under a shorter name of its own says which limit
it is (tests/test_layout.py finds a wait of a number of its own anywhere else).

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
SERVE_SHUTDOWN_GRACE_SECONDS = 2
"""On a stop signal: how long open requests may finish before their calls are cancelled
(whole seconds: uvicorn's timeout_graceful_shutdown)."""
SERVE_CANCEL_WAIT_SECONDS = 20.0
"""At shutdown: how long the cancelled calls may take to stop their commands and be
recorded (more than CALL_CANCEL_WAIT_SECONDS)."""
SERVE_READY_WAIT_SECONDS = 3.0
"""/readyz waits this long for the run record to answer, then says not ready (503): a
probe's own timeout must be longer (deploy/kubernetes/deployment.yaml gives 5 s)."""

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
CHANNEL_LINE_MAX_BYTES = 8 * 1024 * 1024
"""The longest line the orchestrator reads from a channel's process (the resident
helper's frames): far more than it writes (a call's answer is capped far lower).
Longer, the channel is closed with an error (process_channel.read_lines):
something else writes into that stdout, and a line it never ends would be kept whole."""
CHANNEL_CANCEL_WAIT_SECONDS = 5.0
"""After a cancel frame to a resident helper, how long a call waits for its answer:
the worker's own stop ends within guilds_code.limits.SERVE_WORKER_KILL_SECONDS."""
CHANNEL_HELLO_SECONDS = 30.0
"""How long a new resident helper may take to say hello (a container's first exec included)."""
CHANNEL_REOPEN_AFTER_SECONDS = 30.0
"""auto transport: after the channel failed to open, calls go by exec this long before it is tried again."""
AUTO_OPEN_WAIT_SECONDS = 2.0
"""auto transport where the sandbox forks its helpers warm: how long a call waits for the channel
being opened before it goes by exec instead (the opening goes on)."""
RESIDENT_IDLE_EXIT_SECONDS_DEFAULT = 1800
"""A resident helper with nothing to do exits after this long (a sandbox's own idle time when it has one)."""
SERVE_START_POLL_SECONDS = 0.02
"""guilds serve: how often it looks whether uvicorn has started listening (no event says so)."""
KUBERNETES_STATUS_WAIT_SECONDS = 10.0
"""kubernetes: after an exec found the pod's container gone, how long the pod's status
may take to say how it ended (the kubelet reports it a moment after the exec saw it)."""
RESIDENT_KEEPALIVE_SECONDS = 10.0
"""On a sandbox whose channel's end may not reach the server (kubernetes: a pods/exec
stream whose client died leaves the process running), the orchestrator sends a keepalive
this often, and the server is started with ``--orphan-exit`` RESIDENT_ORPHAN_EXIT_SECONDS:
the server of an orchestrator that died ends within that, rather than hold the pod's
memory until its idle exit."""
RESIDENT_ORPHAN_EXIT_SECONDS = 45

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
RECORD_SETUP_WAIT_SECONDS = 120.0
"""A SQLite record is set up (WAL, the schema) by one process at a time: how long
a process waits for the others' setups before it gives up. Long: each setup is
a moment, but many processes starting at once on a loaded machine queue for it."""
RECORD_CHECKPOINT_COMMITS = 200
"""A SQLite record: after this many transactions written on the event loop, the
record thread copies the write-ahead log into the database (a passive checkpoint,
which syncs the disk), so the loop never waits on a disk sync."""

# --- docker's engine and container ---------------------------------------------
DOCKER_CREATED_GRACE_SECONDS = 30.0
"""How long a container made by another process may stay created and not started
before it is taken as abandoned (its maker died) and made again."""
DOCKER_START_SLACK_SECONDS = 30.0
"""Past DOCKER_CREATED_GRACE_SECONDS, how long making the container again may take."""
DOCKER_STOPPING_POLL_SECONDS = 0.2
"""Between the tries of a step refused because the container is gone or not running
(guilds.sandbox.docker.docker_sandbox.IN_CONTAINER_TRIES): this long times the tries so far (a container whose init has
just exited is still "running" for a moment)."""
DOCKER_ADOPT_POLL_SECONDS = 0.05
"""While another process sets up the container: how often to look again."""
DOCKER_REMOVAL_WAIT_SECONDS = 30.0
"""A stop that finds another process removing the container: how long it waits for
that removal to end (looking again every DOCKER_ADOPT_POLL_SECONDS)."""
DOCKER_CLIENT_TIMEOUT_SECONDS = 60
"""The engine client's timeout for one API request."""
DOCKER_CHECK_SECONDS = 10
"""Whether the backend can run here (doctor, the tests): how long the engine may take to answer."""
DOCKER_EXIT_STATUS_WAIT_SECONDS = 0.5
"""After an exec's stream ended: how long the engine may take to record its exit status."""
DOCKER_EXIT_STATUS_POLL_SECONDS = 0.01
"""Meanwhile: how often to ask."""
DOCKER_EXITED_POLL_SECONDS = 0.5
"""After this long without output, ask the engine whether the exec has exited."""
DOCKER_PROBE_SECONDS = 5
"""How long `list` waits for a Docker engine to answer before leaving docker out."""

# --- bubblewrap ------------------------------------------------------------------
BWRAP_START_SECONDS = 10
"""How long a starting sandbox may take to say it is ready."""
BWRAP_IDLE_SECONDS_DEFAULT = 30 * 60
"""The sandbox ends after this long without a call (``shell`` background commands with it)."""

# --- the egress proxy's lifecycle (agent.network a list) -----------------------------
EGRESS_START_SECONDS = 10
"""How long a call waits for a newly started egress proxy to listen (its pidfile)."""
EGRESS_START_POLL_SECONDS = 0.02
"""How often a call looks whether the proxy it started listens, or the one it stopped is gone."""
EGRESS_DECISIONS_READ_MAX_BYTES = 4 << 20
"""The most of the decisions file one call's end reads into the run record; the rest
waits for the next call (a background download's decisions come in over several)."""

# --- the app's event stream -------------------------------------------------------
APP_EVENTS_POLL_SECONDS = 0.5
"""How often an open event stream asks the record for the calls past what it has shown."""
APP_STREAM_MAX_SECONDS = 300.0
"""An event stream ends after this long; the browser opens the next one."""
APP_RETRY_MS = 1000
"""The stream's retry: how long the browser waits before it reconnects (milliseconds)."""

# --- the app's login sessions (guilds.web.sessions) ----------------------------------
APP_SESSION_IDLE_SECONDS = 12 * 3600.0
"""A login session ends after this long without a request (an open run's event stream
is a request every APP_STREAM_MAX_SECONDS, so an open tab keeps its session)."""
APP_SESSION_MAX_AGE_SECONDS = 24 * 3600.0
"""A login session ends this long after its login, used or not (an open tab too: its
next request is refused, and the URL `guilds serve` printed logs in again); the session
cookie carries it as its Max-Age, so the browser drops it then as well."""
APP_SESSIONS_MAX = 64
"""At most this many sessions live at once (each a row of the run record): a login past it
ends the session used least recently, so repeated logins cannot grow the record."""
APP_SESSION_TOUCH_SECONDS = 60.0
"""A request writes its session's use to the record only when the last use written is older
than this (so a page costs one read); the idle time is counted from that write."""

# --- the record's owners ----------------------------------------------------------
OWNER_HEARTBEAT_SECONDS = 5.0
"""How often an open Store refreshes its owner's heartbeat and sweeps for lost calls."""
OWNER_LEASE_SECONDS = 60.0
"""An owner on another machine whose heartbeat is older than this is gone: twelve missed
beats, room for a loaded machine and some clock skew between machines."""
OWNER_PROBE_AFTER_SECONDS = 1.5 * OWNER_HEARTBEAT_SECONDS
"""A sweep asks an owner that said where it answers (a server's address) whether it still
runs once its heartbeat is older than this (``record.liveness``): a beat missed."""
OWNER_SILENT_SECONDS = 2 * OWNER_HEARTBEAT_SECONDS + 1
"""An owner whose address cannot be reached (no answer, no route: its pod is gone) and
whose heartbeat is older than this is gone: two beats missed while nothing answers."""
OWNER_PROBE_SECONDS = 0.5
"""How long the question "are you still running?" waits for its answer (``record.liveness``)."""
CALL_KEY_POLL_SECONDS = 0.1
"""A call named again by its key while it runs elsewhere: how often its row is read."""
CALL_KEY_PROBE_SECONDS = 1.0
"""...and how often the process running it is asked whether it still runs."""
CALL_KEY_MAX_CHARS = 255
"""A call key (``_meta["guilds/call-key"]``): at most this many characters."""

# --- the adapters ----------------------------------------------------------------
MINISWEAGENT_TIMEOUT_SECONDS_DEFAULT = 120
"""mini-swe-agent's environment: a command's timeout when its config names none."""

# --- kubernetes --------------------------------------------------------------------
KUBERNETES_START_SECONDS = 180
"""How long a new pod may take to run (scheduling, pulling the image, the claim)."""
KUBERNETES_START_POLL_SECONDS = 1.0
"""While a new pod starts: how often its phase is read again."""
KUBERNETES_WRITE_SECONDS = 60
"""How long one of the backend's own execs may take (a file written, a kill, the check
that the pod still runs after a call ended by a signal)."""
KUBERNETES_STATUS_POLL_SECONDS = 0.2
"""While a pod that lost a call is waited for to say it ended: how often to read it."""
KUBERNETES_FRAME_WAIT_SECONDS = 1.0
"""The longest wait for one websocket frame before the deadline is looked at again."""
KUBERNETES_DIRECT_SECONDS = 5.0
"""kubernetes.channel = "direct": how long a resident helper's channel opening tries to connect
after the helper's hello (a new pod's network policy settling), before it keeps the exec's
streams (one warning line)."""
KUBERNETES_DIRECT_TRY_SECONDS = 0.5
"""...each connection attempt's own bound."""
KUBERNETES_DIRECT_PAUSE_SECONDS = 0.05
"""...the pause after an attempt that failed (refused at once, or dropped)."""
KUBERNETES_REQUEST_SECONDS = 30.0
"""Claim mode: the longest one request to the API server waits for its answer (a watch: its own timeout besides)."""
KUBERNETES_EGRESS_SETTLE_SECONDS = 60
"""agent.network a list: how long a pod's network policy may take to hold (the policy
controller writes a new pod's rules a moment after it starts) before its first call."""

KUBERNETES_CLAIM_WATCH_SLICE_SECONDS = 30
"""Claim mode: the longest single watch of a claim; the wait goes on with another until its deadline."""
KUBERNETES_CLAIM_GONE_SECONDS = 60
"""Claim mode: how long a deleted claim may take to be gone."""
KUBERNETES_CLAIM_POLL_SECONDS = 0.1
"""Claim mode: between two reads of a claim or sandbox that is not there yet."""
KUBERNETES_CLAIM_NO_IDLE_SECONDS = 10 * 365 * 24 * 3600.0
"""Claim mode: INIT's idle time (never: a pooled pod has no calls while it waits)."""

# --- the containers' init (docker, kubernetes) ----------------------------------------
CONTAINER_CLOCK_POLL_SECONDS = 30.0
"""How often INIT looks at a clock file (at most; a quarter of the idle time when shorter)."""
CONTAINER_SEEN_POLL_SECONDS = 0.25
"""How often INIT looks for a running call where there is no clock file (kubernetes)."""

# --- doctor ------------------------------------------------------------------------
DOCTOR_PROBE_SECONDS = 10
"""The longest any one check waits (a command, an engine, a cluster, a database)."""

# --- the MCP front -------------------------------------------------------------------
MCP_SESSIONLESS_IDLE_SECONDS = 30 * 60.0
"""A client without a session (the 2026-07-28 revision over HTTP) that names no
run continues the agent's current sessionless run until that run has had no
call for this long; then its next call starts a new run."""
MCP_SESSIONLESS_RECHECK_SECONDS = 5.0
"""(At most half the idle time.) A sessionless call within this long of this process's last use
of its principal's current run takes that run without asking the record, and a call that took
less leaves the record's time of its start (another server sees a run named meanwhile on it this
much later at most)."""
MCP_SESSION_IDLE_SECONDS = 12 * 3600.0
"""A session of the older handshake that had no request this long is no longer served by a
server that does not hold it (``guilds.fronts.mcp_sessions``): the client starts a new one."""
MCP_SESSION_TOUCH_SECONDS = 60.0
"""A session's use is written to the record at most this often (so a request costs at most one read)."""
MCP_SESSIONS_KEPT = 10_000
"""At most this many sessions are kept in the record; a new one past it ends the one used least recently."""
MCP_PROGRESS_SECONDS = 1.0
"""How often a running call reports progress (elapsed seconds)."""
TRACE_TOOL_NAME_CHARS = 128
"""A call span's tool name (and its span name) keeps this many characters of the name a client
sent (guilds.observe.traces): a name is no payload."""
MCP_TASK_AFTER_SECONDS = 2.0
"""A code_task call of a client that takes tasks becomes a task once it has run this
long without an answer: a quick refusal (bad arguments, no repository) comes back
as an ordinary result."""
MCP_TASK_POLL_SECONDS = 2.0
"""The poll interval a task suggests (``pollIntervalMs``)."""
MCP_TASK_CANCEL_WAIT_SECONDS = 8.0
"""``tasks/cancel`` of a command's task: how long, after its stop, to wait for the
command to be gone before answering that it is not (yet) cancelled. The stop's
SIGKILL comes guilds_code.limits.STOP_KILL_GRACE_SECONDS after its SIGTERM."""
MCP_TASK_CANCEL_POLL_SECONDS = 0.25
"""Meanwhile, how often to read the command's state."""
MCP_TASK_CANCEL_ASKED_SECONDS = 1.0
"""How often the server running a code_task task reads whether another server on the run
record was asked to cancel it (``tasks/cancel`` there): the longest a cancel waits for it."""


# --- the egress proxy ------------------------------------------------------------------
EGRESS_REQUEST_LINE_MAX_BYTES = 8 * 1024
"""The longest request line the egress proxy reads (method, target, version): the
size most servers take for a URL; a longer one is refused with 414 and a reason."""
EGRESS_HEAD_MAX_BYTES = 64 * 1024
"""The longest head (request line and headers, or an upstream response's) the egress
proxy holds: larger than any client's or forge's real head, small enough that 64
sandboxes' proxies hold little. A longer request head is refused with 431."""
EGRESS_HEADER_COUNT_MAX = 100
"""The most header lines in one head (Python's http.client refuses more than this too)."""
EGRESS_CHUNK_LINE_MAX_BYTES = 1024
"""The longest line of a chunked body's framing (a chunk's size and its extensions)."""
EGRESS_TAG_MAX_CHARS = 200
"""The longest attribution tag (``<run id>/<call id>``) taken from Proxy-Authorization."""
EGRESS_PIPE_CHUNK = 256 * 1024
"""How much the egress proxy reads from one side of a connection at a time: a
body is streamed in pieces of this size, never held whole."""
EGRESS_HEAD_READ_SECONDS = 30.0
"""How long a client may take to send a request head: a client that sends half a
head and waits holds no connection of the proxy past this."""
EGRESS_RESOLVE_SECONDS = 10.0
"""How long the egress proxy waits for a host name to resolve before it refuses (502)."""
EGRESS_CONNECT_SECONDS = 15.0
"""How long it waits for an upstream connection, its TLS handshake included, before it
refuses (502); also the longest TLS handshake it waits for from a client."""
EGRESS_CONNECTIONS_MAX = 128
"""The most connections one sandbox's egress proxy serves at once (a host process, outside
the sandbox's memory limit: each holds up to a head's or a tunnel's buffers). One more is
answered 503 at once; a package manager's parallel downloads stay well below it."""
EGRESS_IDLE_POLL_SECONDS = 30.0
"""How often a proxy looks at its idle clock (at most; a quarter of its idle time
when shorter), like the sandboxes' init."""
EGRESS_LINGER_SECONDS = 30.0
"""How long an agent's egress proxy (on its Unix socket) serves on after its last
connection; then it sleeps, a bare interpreter holding the socket until the next
connection wakes it (``guilds.egress.waiter``)."""
EGRESS_SLEEP_SETTLE_SECONDS = 0.01
"""When a proxy falls asleep, its stop signals blocked: one turn of its loop this long, so a
stop signal caught just before is taken (the proxy then ends instead of sleeping)."""
EGRESS_WAKE_PEEK_SECONDS = 2.0
"""How long a connection to a sleeping proxy may stay silent before it wakes the proxy
anyway; one that ends first without a byte (the orchestrator's check that a proxy
answers) leaves it asleep."""
EGRESS_WRITE_BUFFER_BYTES = 1024 * 1024
"""How much a tunnel holds for a side that reads slowly before it stops reading the
other side: room for a burst while the reader waits its turn on a loaded machine,
and the most a tunnel's way down holds in memory."""
EGRESS_RULE_HOSTS_MAX = 32
"""The most hosts (names or ``*.domain``) one sandbox's header rules name: each is a
host whose connections the proxy ends and makes again, checked at each request."""
EGRESS_RULE_HEADERS_MAX = 16
"""The most headers one host's rules set on a request."""
EGRESS_RULE_NAME_MAX_CHARS = 128
"""The longest header name a rule sets."""
EGRESS_RULE_VALUE_MAX_CHARS = 2048
"""The longest header value a rule sets: a host's rules add at most
EGRESS_RULE_HEADERS_MAX times this (and their names) to a head, well within what a
host reads."""
EGRESS_RULE_VALUE_MIN_CHARS = 8
"""The shortest header value a rule sets: every value is scrubbed from every answer (a
placeholder in its place, as a secret's), and a shorter one would garble answers that
hold it by chance."""
# --- the E2B front (guilds.fronts.e2b) -------------------------------------------
E2B_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""A Connect request message (JSON) larger than this is refused (resource_exhausted)."""
E2B_MAX_BODY_BYTES = 1024 * 1024
"""A control-plane request body (a create's JSON) larger than this is refused: 413."""
E2B_MAX_METADATA_BYTES = 16 * 1024
"""The most a sandbox's ``metadata`` may hold, its keys and values in UTF-8 together: 400 past it."""
E2B_MAX_JSON_DEPTH = 64
"""A request (control plane or Connect) nesting its JSON deeper than this is refused: 400."""
E2B_DRAIN_BYTES = 64 * 1024 * 1024
"""After a body was refused as too large, this much more of it is read and dropped, so
the client reads the answer; past it the connection is closed."""
E2B_DEFAULT_TIMEOUT_SECONDS = 300
"""A sandbox created without ``timeout`` ends this long after its start (E2B's default)."""
E2B_MAX_TIMEOUT_SECONDS = 24 * 3600
"""The longest ``timeout`` a sandbox may be given (create, connect, set_timeout)."""
E2B_KEEPALIVE_SECONDS = 30.0
"""A command's stream with nothing to say for this long sends a keepalive event."""
E2B_RECORD_OUTPUT_BYTES = 64 * 1024
"""What a command's record keeps of its output (stdout then stderr): the head."""
E2B_ACK_BYTES = 256 * 1024
"""A command's output taken (sent on by its streams, or with none to go to) is acked to the
process service in batches of this much: less than its window (``ENVD_OUTPUT_WINDOW_BYTES``),
so a stream that reads holds nothing back."""
E2B_ENVD_LINE_BYTES = 8 * 1024 * 1024
"""The longest line read from a sandbox's process service (its longest, a file read's reply,
is under 2 MB): a longer one is dropped as it comes, never held."""
E2B_ENDED_KEPT = 256
"""How many ended commands of a sandbox stay known, so a Connect after the end gets it."""
E2B_ENVD_VERSION = "0.6.4"
"""The envd version the front reports: the SDKs choose their request forms by it. 0.6.2 is
the first with file metadata, 0.6.3 with a watch event's entry, 0.6.4 with watching a
folder on a network filesystem when asked: all served."""
E2B_METRICS_INTERVAL_SECONDS = 5.0
"""How often each running E2B sandbox's cgroup is sampled for ``get_metrics`` (E2B's step)."""
E2B_METRICS_KEPT = 720
"""The samples of one sandbox kept (an hour's at the interval); older ones are dropped."""
E2B_LIST_MAX_LIMIT = 100
"""The most sandboxes one page of ``Sandbox.list`` holds, and its default (E2B's)."""
E2B_FILE_METADATA_KEY_BYTES = 246
"""The longest key of a file's metadata: an extended attribute's name (255 bytes) less the
``user.e2b.`` before it (E2B's bound)."""
E2B_FILE_METADATA_BYTES = 4096
"""All of a file's metadata: each key with ``user.e2b.`` before it, and its value (E2B's bound)."""
E2B_FORK_DEFAULT_TIMEOUT_SECONDS = 15
"""A fork's children's ``timeout`` when the request gives none (E2B's; the Python SDK always
sends its own, 300 by default)."""
E2B_MAX_SNAPSHOTS = 100
"""The most snapshots one key keeps (each a copy of a sandbox's home in the data folder):
429 past it, until one is deleted."""
E2B_SNAPSHOTS_PAGE = 100
"""The most snapshots one list answer holds (E2B's ``limit``, 1 to this; its default)."""
E2B_CREATE_KEY_BYTES = 255
"""The longest ``Idempotency-Key`` a create may carry (printable ASCII): 400 past it."""
E2B_CREATE_KEY_SECONDS = 24 * 3600
"""How long a create's idempotency key is kept after its first create, at most (the longest a
sandbox's ``timeout`` may be): a repeat after it makes a new sandbox."""
E2B_CREATE_KEYS = 10_000
"""The most idempotency keys one server keeps (each a few hundred bytes): past it the oldest
is forgotten."""
E2B_SHARED_KEY_WAIT_SECONDS = 120.0
"""--e2b-shared: how long a repeat of a create waits for the sandbox another server is making
under the same idempotency key (a create's longest start), then 503."""
E2B_SHARED_KEY_POLL_SECONDS = 0.2
"""--e2b-shared: how often that repeat reads the key's row again."""
E2B_MASK_HOST_MAX_CHARS = 260
"""The longest ``maskRequestHost`` a create may give (a DNS name, 253, and a port): 400 past it."""
E2B_FILE_CHUNKS_IN_FLIGHT = 3
"""A file written through the E2B API (``/files``): how many of its pieces (ENVD_CHUNK_BYTES
each) are on their way to the sandbox's process service at once, so that the server's work on
one and the service's on another overlap; the memory a write holds is that many pieces."""
E2B_INGRESS_HEAD_BYTES = 64 * 1024
"""The longest response head (status line and headers) a server in a sandbox may send to a
request of its port from outside: past it the request is answered 502."""
E2B_INGRESS_START_SECONDS = 30.0
"""How long the relay into a sandbox (one process inside it per request to its port) may take
to start and say whether the port took the connection: past it, 502."""
E2B_INGRESS_IDLE_SECONDS = 620.0
"""How long a request to a sandbox's port may wait for a byte of its server's answer (E2B's
proxy idle time): past it the request ends (502 before the answer began)."""
E2B_FORWARD_CONNECT_SECONDS = 5.0
"""How long a server may take to connect to the server that runs a shared sandbox's command
(``guilds serve --e2b-shared``) to send a request of it on: past it, the command is not found
(that server has ended, and its process service's commands with it)."""
E2B_INGRESS_WS_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest WebSocket message passed either way between a client and a sandbox's port (the
server's own bound on a client's messages, uvicorn's ``ws_max_size``, is the same): past it
both sides are closed with 1009."""
E2B_INGRESS_MAX_PER_SANDBOX = 32
"""The most requests to one sandbox's ports served at once (each a relay process inside it and
two threads here; a WebSocket counts while it is open): past it, 429 with E2B's body, as E2B
answers too many connections."""
AGENTS_PER_SERVER = 100
"""Default of ``agents.max``: the agents made on demand live at once on one server."""
AGENTS_PER_OWNER = 10
"""Default of ``agents.max_per_owner``: the agents made on demand one owner holds at once."""
AGENTS_PER_SERVER_LIMIT = 100_000
"""The most ``agents.max`` and ``agents.max_per_owner`` may say."""
AGENT_REAP_SECONDS = 30.0
"""How often ``guilds serve`` removes the agents made on demand whose expiry has passed."""
AGENT_MAX_EXPIRY_SECONDS = 366 * 24 * 3600
"""The longest expiry an agent made on demand may be given."""
AGENT_MAKING_STALE_SECONDS = 600
"""An agent still being made after this long was left half made by a stopped server: reaped."""
HOME_VERSION_SECONDS = 2.0
"""How long a walk of a template's starting home (its version: guilds.agents.home_layers) is
reused: makes of one template within it share one walk, and an edit to the template's home
reaches every agent made this long after it."""
POOL_MAX_LIMIT = 1000
"""The most ``templates.NAME.pool.max`` may say."""
POOL_WINDOW_SECONDS_DEFAULT = 10
"""Default of ``templates.NAME.pool.window_seconds``: the makes of the last this many seconds are the demand."""
POOL_COOL_DOWN_SECONDS_DEFAULT = 60
"""Default of ``templates.NAME.pool.cool_down_seconds``: a pool shrinks only after its target was lower this long."""
POOL_COOL_DOWN_SECONDS_LIMIT = 24 * 3600
POOL_WINDOW_SECONDS_LIMIT = 3600
POOL_TICK_SECONDS = 1.0
"""How often the pools look at their targets when no make wakes them sooner."""
POOL_KEEP_SECONDS = 60.0
"""How often each pooled agent is asked whether it still answers, which also holds off its idle
stops (the sandbox's idle clock, the resident helper's idle exit): at most a quarter of the idle time."""
POOL_PROBE_SECONDS = 5.0
"""The longest a pooled agent may take to answer a probe before it is taken for dead and removed."""
POOL_FAILURE_PAUSE_SECONDS = 30.0
"""After a pooled agent's make failed (an engine away, an image missing), its pool is not refilled this long."""
POOL_MAKES_AT_ONCE = 2
"""Pooled agents being made at once across a server's pools (two cores: more only queue)."""
POOL_FORK_REFILL_PAUSE_SECONDS = 1.0
"""After a fork takes a pool's agents, its refill waits this long: the children's first calls,
which the fork is for, get the machine first (a make's take refills at once)."""
CHECKPOINT_GATE_POLL_SECONDS = 0.01
"""How often a call or a rewind waiting at an agent's call gate tries its lock again: a call
waits at most this much past a rewind's end (guilds.checkpoints.call_gate)."""
REWIND_STOP_WAIT_SECONDS = 30.0
"""A rewind's stop of one background command: its SIGTERM, the helper's wait, its answer."""
FORK_MAX_CHILDREN = 100
"""The most agents one fork makes (the caps of ``agents.max`` and ``agents.max_per_owner`` apply too)."""
FORK_MAX_LAYERS = 32
"""The most layers a forked overlay home stands on: a fork of a fork past it freezes its source's
whole home as one layer instead of stacking one more (guilds.agents.fork)."""
FORK_STARTS_AT_ONCE = 8
"""A fork's children whose homes are mounted and sandboxes started at once."""

KUBERNETES_POD_GONE_ATTEMPTS = 4
"""Tries of a step whose exec finds its pod gone (``KubePodSandbox._in_pod``)."""
KUBERNETES_POD_GONE_PAUSE_SECONDS = 1.0
"""The pause before each such try past the second (a pod made anew under the same name
may refuse an exec until its container is listed)."""
E2B_TEMPLATE_MAX_STEPS = 100
"""The most steps one template build may have (``Template`` instructions): 400 past it."""
E2B_TEMPLATE_UPLOAD_BYTES = 64 * 1024 * 1024
"""The largest file archive one ``COPY`` of a template build may upload (it is held whole
once, as it is written into the build's sandbox): 413 past it, nothing kept."""
E2B_TEMPLATE_BUILD_SECONDS = 600.0
"""The longest one template build runs, its steps together: past it, the build fails."""
E2B_TEMPLATE_BUILDS_PER_KEY = 2
"""Template builds one key may run at once: 429 past it (each build is a sandbox and a
machine's work)."""
E2B_MAX_TEMPLATES = 100
"""The most templates one key keeps, built or requested: 429 past it, until one is deleted."""
E2B_TEMPLATE_LOG_ENTRIES = 2000
"""The most log entries one build keeps: a step's output past it is dropped, said once."""
E2B_TEMPLATE_LOG_LINE_CHARS = 4096
"""The longest log entry's message: a longer line is cut."""
E2B_TEMPLATE_STATUS_LOGS = 100
"""The most log entries one build status answer holds (E2B's ``limit``, 0 to this)."""
E2B_TEMPLATE_HOME_BYTES = 4 * 1024 * 1024 * 1024
"""The largest home a docker template build may leave in its image's /home/user (copied out
as the template's starting home): past it, the build fails."""
E2B_TEMPLATE_READY_SECONDS = 120.0
"""How long a create of a built template waits for its ready command to succeed (run again
every fraction of a second): past it, the create fails and the sandbox is killed."""
E2B_TEMPLATE_READY_AGAIN_SECONDS = 0.2
"""How long after a built template's ready command failed it is run again."""
