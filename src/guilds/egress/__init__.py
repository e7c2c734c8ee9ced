"""The egress proxy: a sandbox without a network of its own reaches listed hosts through it.

One proxy process per sandbox (``python -m guilds.egress CONFIG.json``, ``daemon``)
listens on a Unix socket the sandbox reaches through a relay inside it; idle, it
sleeps in the same process (``waiter``). Its parts:

- ``policy``: the ``agent.network`` allowlist and its decisions (``Allowlist.parse``, ``decide``);
- ``ca``: the orchestrator's certificate authority and the sandbox's trust bundle;
- ``proxy``: the HTTP proxy itself (CONNECT, plain HTTP, TLS for the secrets' hosts);
- ``swap``: placeholders swapped for secrets in requests, and back in answers;
- ``http_head`` / ``framing``: HTTP/1.1 heads and bodies, bounded and streamed;
- ``decisions``: the decisions file, one JSON line per connection;
- ``proxy_config``: the config file the orchestrator writes;
- ``waiter``: the proxy asleep, holding its socket until a connection wakes it.

Errors: ``policy.AllowlistError`` and ``proxy_config.ConfigError`` (ValueErrors with
one-line messages); inside the proxy every failure of a connection is an answer to
it (``proxy.Refused``, ``http_head.BadHead``), never an exception out of ``handle``.
"""
