"""The settings: the agent's settings file, its checks, and the private data folder."""
