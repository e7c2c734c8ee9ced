"""The docker backend: each agent's commands in a container of a Docker engine."""
