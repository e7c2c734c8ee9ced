"""What ``guilds serve`` tells an operator: its log lines (``log_lines``) and its
Prometheus metrics (``metrics``, at ``/metrics``). docs/observability.md lists them."""
