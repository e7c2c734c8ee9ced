"""One module per op; each exposes ``run(request) -> protocol.Reply``."""
