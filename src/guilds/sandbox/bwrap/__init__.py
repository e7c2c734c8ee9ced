"""The bwrap backend: each agent's commands in a bubblewrap sandbox on this machine."""
