"""The kubernetes backend: each agent's commands in a pod of a Kubernetes cluster."""
