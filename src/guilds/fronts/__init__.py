"""The fronts: the CLI, the MCP server, serve, the Python API, doctor and the sandbox
commands, with the wiring they share (settings to a toolbox) and the stop signals."""
