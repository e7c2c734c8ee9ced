"""guilds: the orchestrator side of the code tools (toolbox, sandboxes, record, fronts)."""
