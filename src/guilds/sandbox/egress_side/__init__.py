"""The sandbox's side of the egress proxy (``agent.network`` a list; docs/network.md),
one room for the bwrap, docker and kubernetes sandboxes (kubernetes' pod side:
``kubernetes/kube_egress``):

- ``sandbox_egress``: ``Egress``, the one object a backend holds (the ``Sandbox`` protocol's
  ``egress``), made for an agent;
- ``files``: the agent's host files (``<data>/egress/<agent id>/``) and their lock;
- ``relay``: the relay the sandbox's init runs (standard library only);
- ``placeholders``: the placeholders of host-bound secrets and repository tokens;
- ``origins``: a repository's origin host, read from its ``.git/config`` and pinned;
- ``environment``: what every command's environment gets behind the proxy;
- ``proxy_setup``: the proxy's config and the digest of the settings it was made from;
- ``proxy_process``: the proxy's process, started, found alive and stopped;
- ``decision_log``: the proxy's decisions, read into the run record.

Inside, the sandbox's init runs the relay: it listens on 127.0.0.1:RELAY_PORT in the
sandbox's own network namespace and splices each connection to the proxy. Every
command gets the proxy variables (the helper names the call in them), NO_PROXY for
the loopback, and the trust bundle in the variables common clients read. A secret
with hosts, and a repository token, is a placeholder of the same length inside; the
proxy puts the value in for its hosts only.
"""

from __future__ import annotations

from .files import EgressFiles, egress_files, remove_files
from .sandbox_egress import Egress

__all__ = ["Egress", "EgressFiles", "egress_files", "remove_files"]
