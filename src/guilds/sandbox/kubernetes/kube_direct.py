"""``kubernetes.channel = "direct"``: the resident helper's frames on a TCP connection to
the pod's address instead of the pods/exec stream that started it.

A frame on the exec's stream crosses the API server, the kubelet and the container
runtime each way; on a connection of its own it crosses the pod network once. The
helper is started as before, by an exec, with ``serve --direct 1``
(``guilds_code.direct``): its hello says the port it listens on. This side sends it a
random token over the exec's stdin (never in an argv, an environment or an object of
the cluster), connects to the pod's IP at that port, names the token, and reads the
helper's second hello there: that connection is the channel from then on
(``DirectProcess``). The exec stays open beside it: its stderr is still read for an
error message, and closing the channel closes it too, as before. The helper's
listener is closed once the connection is taken; it closes by itself at the first
request frame on its stdin, and after ``DIRECT_OFFER_SECONDS``.

The pod: ``<pod>-channel``, a NetworkPolicy owned by the pod (``ingress_manifest``), lets
this host's address towards the pod (``route_source``) open connections to it, and
nothing else: a pod of the namespace's deny-all policy (``agent.network`` false or a
list) is otherwise closed to it, and other pods stay shut out. Where no connection is
made within KUBERNETES_DIRECT_SECONDS of the hello (this host does not reach the pod network, or
the cluster drops what its policies do not name), one warning line says so and the
exec's stream is the channel, as with ``channel = "exec"``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import socket
import time
from typing import Any

from ...limits import (
    CHANNEL_HELLO_SECONDS,
    KUBERNETES_DIRECT_PAUSE_SECONDS,
    KUBERNETES_DIRECT_SECONDS,
    KUBERNETES_DIRECT_TRY_SECONDS,
)
from .._container import HELPER_DIR
from ..helpers import CODE_HELPER
from ..process_channel import DirectProcess, KubeProcess
from .kube_spec import LABEL_AGENT

log = logging.getLogger(__name__)

POLICY_SUFFIX = "-channel"


def serves(argv: list[str]) -> bool:
    """argv starts the resident helper (``python -I -S guilds-code serve ...``)."""
    return argv[3:5] == [f"{HELPER_DIR}/{CODE_HELPER}", "serve"]


def offering(argv: list[str]) -> list[str]:
    """The resident helper's argv, with its channel offered over TCP."""
    return [*argv, "--direct", "1"]


def policy_name(pod: str) -> str:
    return f"{pod}{POLICY_SUFFIX}"


def ingress_manifest(namespace: str, pod: str, address: str, *, owner: str) -> dict[str, Any]:
    """The agent's pod may be reached by address (this host), on any TCP port, and by
    nothing else the namespace's policies do not name (pure). Owned by the pod (owner:
    its uid), so the cluster deletes it with the pod."""
    width = ipaddress.ip_address(address).max_prefixlen
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy_name(pod), "namespace": namespace, "labels": {LABEL_AGENT: pod},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": owner}]},
            "spec": {"podSelector": {"matchLabels": {LABEL_AGENT: pod}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"ipBlock": {"cidr": f"{address}/{width}"}}],
                                  "ports": [{"protocol": "TCP"}]}]}}


def taken(process: KubeProcess, pod_ip: str) -> DirectProcess | None:
    """The helper process (started by ``offering``'s argv) on a connection to pod_ip, its
    exec beside it; None, the exec's stream kept as it was (its hello still to read), when
    the helper offers no port (or says no hello by CHANNEL_HELLO_SECONDS) or no connection
    is made by KUBERNETES_DIRECT_SECONDS after its hello."""
    token = secrets.token_hex(32)
    process.send(json.dumps({"v": 1, "direct": token}).encode() + b"\n")
    hello = process.first_line(time.monotonic() + CHANNEL_HELLO_SECONDS)
    port = _offered_port(hello)
    if port is None:  # no hello in time: the channel's own wait for it says so
        return None
    try:
        sock, second = _connect(pod_ip, port, token, time.monotonic() + KUBERNETES_DIRECT_SECONDS)
    except OSError as exc:
        log.warning("kubernetes: the resident helper's channel stays on the exec: no connection to "
                    "%s:%d (%s)", pod_ip, port, exc.strerror or exc)
        return None
    process.forget_early()
    return DirectProcess(sock, process, early=second)


def _offered_port(hello: bytes | None) -> int | None:
    try:
        port = json.loads(hello or b"").get("direct")
    except (ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None


def _connect(pod_ip: str, port: int, token: str, deadline: float) -> tuple[socket.socket, bytes]:
    """A connection that named the token, and what it sent up to its hello's end
    (OSError, the last one met, when none by deadline)."""
    last: OSError = TimeoutError("no time left")
    while (left := deadline - time.monotonic()) > 0:
        try:
            sock = socket.create_connection((pod_ip, port), timeout=min(left, KUBERNETES_DIRECT_TRY_SECONDS))
        except OSError as exc:  # refused at once, or dropped until the policy holds: again shortly
            last = exc
            time.sleep(min(KUBERNETES_DIRECT_PAUSE_SECONDS, max(0.0, deadline - time.monotonic())))
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a frame is one write: sent at once
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(token.encode() + b"\n")
            return sock, _hello_line(sock)
        except OSError as exc:
            sock.close()
            raise exc
    raise last


def _hello_line(sock: socket.socket) -> bytes:
    """What the helper sent up to its hello's newline (ConnectionError when it closed first)."""
    got = b""
    while b"\n" not in got:
        part = sock.recv(4096)
        if not part:
            raise ConnectionError("the helper closed the connection before its hello")
        got += part
    return got
