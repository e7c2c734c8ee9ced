"""The run record's tables (SQLAlchemy Core), made by ``engine.create_schema``.

Tables:

    runs   id (the run id), agent_id, created_at, updated_at,
           next_seq (the last seq given out), used_calls (calls counted against
           the budget), admitted_seq (the last seq admitted within the budget),
           returned_bytes, elided_bytes, pointer_saved_bytes, secrets_redacted
           (the totals of its finished calls: ``values.call_savings`` of
           each, added in the transaction that records the call's end)
    calls  run_id + seq, call_id, tool, args, text, is_error, meta, cut (by the
           pipeline's cap), counted (against the budget), status (running, done,
           cancelled, or lost: its process ended first), started_at,
           finished_at, duration_ms, row, owner (the process running it; none
           once it has ended)
    owners the processes that have the record open (``guilds.record.owners``): id,
           machine, pid, pid_start, heartbeat_at, address (where the process
           answers whether it is alive: a server's own URL; none for others)
    call_keys the client-chosen keys of calls (the MCP front's ``_meta``
           ``guilds/call-key``, ``guilds.toolbox.keyed_calls``): agent_id,
           principal and key, the run_id and seq of the call it names, sent (its
           request may have reached the sandbox), at
    context_marks  run_id, after_seq, at, from_seq: the run's model context was
           compacted or rewound after its call after_seq (from_seq none); or its
           files were rewound to before call from_seq, so the reads of calls
           from_seq..after_seq no longer stand
    run_principals run_id, principal: who made the run, for fronts that
           authenticate (the MCP endpoint: a fingerprint of its token; "" for
           none); claimed once, by the run's first such call
    tasks  id (a task id, unguessable), run_id, agent_id, tool, background_id
           and background_call (a command's task: its id and the id of the
           call that started it, which names it across sandboxes), principal,
           status (working, completed, failed, cancelled), status_message,
           result (the final result or error, as sent), created_at,
           updated_at, owner (the process following it; none once it has
           ended): the MCP front's tasks (guilds/fronts/mcp_tasks.py)
    egress the egress proxy's decisions (agent.network a list, docs/network.md):
           run_id and call_id (of the call whose command made the connection), at,
           host, port, allowed, reason, bytes_up, bytes_down
    agents the agents made on demand from a template (``guilds.agents``): id,
           template, owner (who asked for it: a name the front gives), sandbox
           (the backend it was made on), home, status (making, live, removed;
           pooled and retiring for a warm pool's, ``guilds.agents.pool``),
           created_at, expires_at (none: it lives until removed), removed_at;
           a record made before it gets the table, empty, at setup
    checkpoints the checkpoints of agents' homes (``guilds.checkpoints``): id,
           agent_id, run_id, seq and call_id (of the call it was taken for; none
           for one taken by name), moment (before, after, named), name, at,
           files, bytes, status (kept, pruned); a record made before it gets
           the table, empty, at setup
    e2b_sandboxes the E2B sandboxes of servers that share them (``guilds serve --e2b
           --e2b-shared``, docs/deploy.md): id, agent_id, key_name, template,
           metadata, env_vars, network, lifecycle, started_at, end_at, state
           (running, paused); deleted when the sandbox is killed
    e2b_commands the commands those servers' process services run: sandbox_id, pid, owner
           (the server that started it), tag, config (cmd, args, envs, cwd), started_at;
           deleted at the command's end
    e2b_create_keys the idempotency keys of those servers' creates: key_name and key,
           digest (of the create's body), sandbox_id (none while it is made), at
    sessionless_runs each principal's current sessionless MCP run of an agent
           (``guilds.fronts.mcp_runs``, rule 5): agent_id, principal, run_id, at
           (its last call's start or end), so any server on the record continues it
    sessions the app's login sessions and the MCP endpoint's older-handshake sessions
           (``record.session_rows``): digest (SHA-256 of the cookie's value or the session id,
           hex), kind (app, mcp), principal (the token's fingerprint at the start),
           started_at, used_at; any server on the record holds them
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa


class _JSON(sa.types.TypeDecorator):
    """JSON; JSONB on PostgreSQL. A dialect is imported only when a URL uses it (a fast CLI)."""

    impl = sa.JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(sa.JSON())


SAVINGS_COLUMNS = ("returned_bytes", "elided_bytes", "pointer_saved_bytes", "secrets_redacted")
"""A run's totals (``values.Savings``, its fields in this order)."""
_TS = sa.DateTime(timezone=True)
metadata = sa.MetaData()
runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False, index=True),
    sa.Column("created_at", _TS, nullable=False),
    sa.Column("updated_at", _TS, nullable=False, index=True),
    sa.Column("next_seq", sa.Integer, nullable=False, default=0),
    sa.Column("used_calls", sa.Integer, nullable=False, default=0),
    sa.Column("admitted_seq", sa.Integer, nullable=False, default=0),
    *(sa.Column(name, sa.BigInteger, nullable=False, server_default="0") for name in SAVINGS_COLUMNS),
)
calls = sa.Table(
    "calls", metadata,
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.id"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("tool", sa.Text, nullable=False),  # as the model named it: any length
    sa.Column("args", _JSON, nullable=False),
    sa.Column("text", sa.Text),
    sa.Column("is_error", sa.Boolean, nullable=False, default=False),
    sa.Column("meta", _JSON),
    sa.Column("cut", sa.Boolean, nullable=False, default=False),
    sa.Column("counted", sa.Boolean, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("started_at", _TS, nullable=False),
    sa.Column("finished_at", _TS),
    sa.Column("duration_ms", sa.BigInteger),
    sa.Column("row", sa.Text),
    sa.Column("owner", sa.String(32), index=True),
    sa.Column("remaining", sa.Integer),  # the trailer's count; NULL while running
)
owners = sa.Table(
    "owners", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("machine", sa.String(160), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_start", sa.BigInteger, nullable=False),
    sa.Column("heartbeat_at", _TS, nullable=False),
    sa.Column("address", sa.String(255)),
)
context_marks = sa.Table(
    "context_marks", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False, index=True),
    sa.Column("after_seq", sa.Integer, nullable=False),
    sa.Column("at", _TS, nullable=False),
    sa.Column("from_seq", sa.Integer),
)
"""Where a run's model context was compacted or rewound: no file_read points to
a call at or before after_seq (toolbox/ledger.py)."""
run_principals = sa.Table(
    "run_principals", metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("principal", sa.String(64), nullable=False),
)
tasks = sa.Table(
    "tasks", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("tool", sa.String(32), nullable=False),
    sa.Column("background_id", sa.String(32)),
    sa.Column("background_call", sa.String(128)),
    sa.Column("principal", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_message", sa.Text),
    sa.Column("result", _JSON),
    sa.Column("created_at", _TS, nullable=False),
    sa.Column("updated_at", _TS, nullable=False),
    sa.Column("owner", sa.String(32)),
    sa.Column("cancel_asked", _TS),
)
egress = sa.Table(
    "egress", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("port", sa.Integer, nullable=False),
    sa.Column("allowed", sa.Boolean, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("bytes_up", sa.BigInteger, nullable=False),
    sa.Column("bytes_down", sa.BigInteger, nullable=False),
    sa.Index("egress_by_call", "run_id", "call_id"),
)
"""The egress proxy's decisions, one row each (``Store.add_egress``); ``at`` in seconds since the epoch."""
agents = sa.Table(
    "agents", metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("template", sa.String(128), nullable=False),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("sandbox", sa.String(16), nullable=False),
    sa.Column("home", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", _TS, nullable=False),
    sa.Column("expires_at", _TS),
    sa.Column("removed_at", _TS),
    sa.Column("uid", sa.BigInteger),
    sa.Index("agents_by_status_owner", "status", "owner"),
)
"""The agents made on demand, one row each, kept after removal (``guilds.record.agent_rows``)."""
checkpoints = sa.Table(
    "checkpoints", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("run_id", sa.String(128)),
    sa.Column("seq", sa.Integer),
    sa.Column("call_id", sa.String(128)),
    sa.Column("moment", sa.String(16), nullable=False),
    sa.Column("name", sa.String(128)),
    sa.Column("at", _TS, nullable=False),
    sa.Column("files", sa.Integer, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Index("checkpoints_by_call", "run_id", "seq"),
)
"""The checkpoints of agents' homes, one row each (``Store.add_checkpoint``)."""

e2b_sandboxes = sa.Table(
    "e2b_sandboxes", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("agent_id", sa.String(128), nullable=False),
    sa.Column("key_name", sa.String(128), nullable=False),
    sa.Column("template", sa.String(128), nullable=False),
    sa.Column("metadata", _JSON, nullable=False),
    sa.Column("env_vars", _JSON, nullable=False),
    sa.Column("network", _JSON),
    sa.Column("lifecycle", _JSON, nullable=False),
    sa.Column("started_at", _TS, nullable=False),
    sa.Column("end_at", _TS, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
)
"""The shared E2B sandboxes, one row each while they live (``guilds.fronts.e2b.shared``)."""

e2b_create_keys = sa.Table(
    "e2b_create_keys", metadata,
    sa.Column("key_name", sa.String(128), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("sandbox_id", sa.String(64)),
    sa.Column("at", _TS, nullable=False),
)
"""The shared creates' idempotency keys, one row each (``guilds.fronts.e2b.create_keys``)."""

e2b_commands = sa.Table(
    "e2b_commands", metadata,
    sa.Column("sandbox_id", sa.String(64), primary_key=True),
    sa.Column("pid", sa.Integer, primary_key=True),
    sa.Column("owner", sa.String(32), nullable=False, index=True),
    sa.Column("tag", sa.Text),
    sa.Column("config", _JSON, nullable=False),
    sa.Column("started_at", _TS, nullable=False),
)
"""The running commands of the shared sandboxes, one row each, kept by the server whose
process service started it (``guilds.fronts.e2b.shared_commands``)."""

call_keys = sa.Table(
    "call_keys", metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("principal", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("sent", sa.Boolean, nullable=False),
    sa.Column("at", _TS, nullable=False),
)
"""The calls' keys, one row each, made in the transaction that begins the call (``record.call_keys``)."""

sessionless_runs = sa.Table(
    "sessionless_runs", metadata,
    sa.Column("agent_id", sa.String(128), primary_key=True),
    sa.Column("principal", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128), nullable=False),
    sa.Column("at", _TS, nullable=False),
)
"""A principal's current sessionless MCP run of an agent, one row each (``Store.sessionless_run``)."""

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("principal", sa.String(64), nullable=False),
    sa.Column("started_at", _TS, nullable=False),
    sa.Column("used_at", _TS, nullable=False, index=True),
)
"""The live sessions of the app and the MCP endpoint, one row each (``record.session_rows``)."""
