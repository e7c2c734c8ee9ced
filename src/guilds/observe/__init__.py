"""What ``guilds serve`` tells an operator: its log lines (``log_lines``), its
Prometheus metrics (``metrics``, at ``/metrics``) and, when the environment asks,
the OpenTelemetry traces of its calls (``traces``, the context a call came with in
``trace_context``). docs/observability.md lists them."""
