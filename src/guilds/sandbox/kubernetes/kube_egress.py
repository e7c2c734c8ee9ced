"""``agent.network`` a list on the kubernetes sandbox (docs/network.md, "On kubernetes").

The same egress proxy as on bwrap and docker (``egress_side.proxy_process``: one per agent,
on the orchestrator's host, holding the real values), listening on TCP instead of
a Unix socket: at ``kubernetes.egress_address``, else the address this host sends
from towards the agent's pod (``route_source``; in the test cluster the node's
side of the pod network), on a port of its own (the one it had before, when free).

The pod:

- keeps the label ``guilds.network: "off"``: the namespace's deny-all policy
  holds it from its start, and one more policy, ``<name>-egress-<port>``
  (``policy_manifest``), allows its egress to the proxy's address and port and
  nothing else (policies add up; both need a CNI that enforces them). The pod
  owns it, so the cluster deletes it with the pod: the orchestrator only makes
  policies (a proxy started again on another port gets one more);
- runs the relay in its init (``egress_side.relay.relay_code`` with RELAY_TCP): each
  connection to 127.0.0.1:RELAY_PORT is spliced to the proxy after the agent's
  credential, read with the proxy's address and port from RELAY_CONF at each
  connection (a file the orchestrator writes over exec once the proxy listens);
- gets the proxy variables, the placeholders and the trust bundle (BUNDLE, also
  written over exec) as on docker; its Secret holds only the secrets without
  hosts, repos.json the placeholders: no real value of a host-bound secret or a
  repository token is in any object of the cluster or anything the pod reads.

The credential (``credential``, derived from the agent's placeholder key, 0600 on
the host) keeps one agent's pod from another agent's proxy, whose port its own
policy does not open anyway: a port a stopped proxy left may be another agent's
next. Before the pod's first call ``PROBE`` runs in it until it reaches the proxy
and not a listener of the orchestrator's on another port of the same address (the
canary): a cluster that does not enforce the policy is refused, in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import KUBERNETES_EGRESS_SETTLE_SECONDS
from .._container import STATE_INSIDE, init_argv
from ..egress_side import Egress
from ..egress_side.files import BUNDLE_NAME, prepare
from ..egress_side.proxy_process import keep_proxy, proxy_port
from ..egress_side.proxy_setup import Listen
from ..egress_side.relay import RELAY_PORT, relay_code
from .kube_spec import LABEL_AGENT, PYTHON

log = logging.getLogger(__name__)
RELAY_TCP = (
    "def _connect(path):\n"
    " import json,socket\n"
    " with open(path) as f:d=json.load(f)\n"
    " for a,p in d.get('proxies') or [[d['address'],d['port']]]:\n"
    "  try:u=socket.create_connection((a,int(p)),RELAY_CONNECT_SECONDS)\n"
    "  except OSError:continue\n"
    "  try:\n"
    "   u.settimeout(None)\n"
    "   u.sendall(('GUILDS-EGRESS '+d['credential']+'\\n').encode())\n"
    "   return u\n"
    "  except OSError:u.close()\n"
    " raise OSError('no egress proxy answers')\n"
).replace("RELAY_CONNECT_SECONDS", "3")
"""The relay's connection to a proxy on TCP: the proxies (address, port) in turn and the
credential from the file named by its argv[4], read at each connection; the first that
takes the connection within 3 s carries it (servers sharing a run record each list the
proxy of their own: ``KubeEgress._publish``). None does, or the file is missing or wrong:
the connection is closed, nothing else is tried (closed, never open)."""
PROBE = (
    "import json,socket,sys,time\n"
    "a,p,c,end=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),time.time()+float(sys.argv[4])\n"
    "def reach(addr,port,wait=2):\n"
    " try:socket.create_connection((addr,port),wait).close()\n"
    " except OSError:return False\n"
    " return True\n"
    "while True:\n"
    " ok,canary=reach(a,p),reach(a,c)\n"
    " if ok and not canary:print('held');break\n"
    " if time.time()>end:print('open' if canary else 'unreachable');break\n"
    " time.sleep(0.2)\n"
    "try:\n"
    " with open(sys.argv[5]) as f:listed=json.load(f).get('proxies') or []\n"
    "except (OSError,ValueError,AttributeError):listed=[]\n"
    "print(json.dumps([[x,int(y)] for x,y in listed if [x,int(y)]!=[a,p] and reach(x,int(y),1)][:MAX_OTHERS]))\n"
).replace("MAX_OTHERS", "3")
"""Run in the pod: 'held' once the proxy's port answers and the canary's does not,
else at the deadline 'open' (the canary answered: nothing confines the pod) or
'unreachable' (the proxy never answered); then, on a line of its own, the other
proxies the relay's file (argv[5]) lists that still take a connection (at most 3)."""
NODE_PORTS = range(30000, 32768)
"""Kubernetes' default node-port range, which some policy controllers leave open on a
node's addresses: never the canary's port."""
POLICY_SUFFIX = "-egress"
PORT_FILE = "port"
"""In the agent's egress folder: the port the proxy last listened on (asked for again)."""


def relay_conf(agent_id: str) -> str:
    """Where the relay reads the proxies' addresses and ports and the credential inside the pod
    (claim mode: agent_id "" — the pool's pods run the relay before any agent claims one)."""
    return f"{STATE_INSIDE}/{agent_id}/egress.json" if agent_id else f"{STATE_INSIDE}/egress.json"


def relay_of(place: str) -> tuple[str, list[str]]:
    """INIT's relay on TCP (``init_argv``'s relay_with): its code and arguments, its file in place."""
    return relay_code(RELAY_TCP), [relay_conf(place), str(RELAY_PORT)]


def bundle_path(agent_id: str) -> str:
    """The trust bundle inside the pod (the orchestrator's authority plus the host's roots)."""
    return f"{STATE_INSIDE}/{agent_id}/{BUNDLE_NAME}" if agent_id else f"{STATE_INSIDE}/{BUNDLE_NAME}"


def policy_name(pod: str, port: int) -> str:
    return f"{pod}{POLICY_SUFFIX}-{port}"


def policy_manifest(namespace: str, pod: str, address: str, port: int, *, owner: str,
                    selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The agent's pod (selector: its labels that no other pod has; default its LABEL_AGENT)
    may open TCP connections to address:port, nothing more (pure). Owned by the pod (owner:
    its uid), so the cluster deletes it with the pod."""
    width = ipaddress.ip_address(address).max_prefixlen
    owners = [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": owner}] if owner else []
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy_name(pod, port), "namespace": namespace, "labels": {LABEL_AGENT: pod},
                         "ownerReferences": owners},
            "spec": {"podSelector": {"matchLabels": selector or {LABEL_AGENT: pod}},
                     "policyTypes": ["Egress"],
                     "egress": [{"to": [{"ipBlock": {"cidr": f"{address}/{width}"}}],
                                 "ports": [{"protocol": "TCP", "port": port}]}]}}


def credential(key: bytes) -> str:
    """The agent's credential at its proxy: 64 hex digits derived from its placeholder key."""
    return hmac.new(key, b"guilds egress credential", hashlib.sha256).hexdigest()


def route_source(pod_ip: str) -> str:
    """The address this host sends from towards pod_ip (a route lookup, nothing is sent)."""
    family = socket.AF_INET6 if ":" in pod_ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((pod_ip, 9))
        return str(probe.getsockname()[0])


@contextlib.contextmanager
def canary(address: str) -> Iterator[int]:
    """A listener of this process on address, on a port outside NODE_PORTS, while in use;
    each connection is taken and closed (a full backlog would look like a refusal)."""
    held: list[socket.socket] = []
    try:
        while True:
            server = socket.create_server((address, 0))
            held.append(server)
            port = int(server.getsockname()[1])
            if port not in NODE_PORTS:
                break
        threading.Thread(target=_take_all, args=(server,), daemon=True).start()
        yield port
    finally:
        for server in held:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            server.close()


def _take_all(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


@dataclass(frozen=True)
class PodSide:
    """What the pod's egress asks of the kubernetes sandbox that holds it."""

    lock: threading.Lock
    """The sandbox's lock: held while the pod is made (and told there), taken by ``keep()``."""
    ready: Callable[[], bool]
    """Whether the sandbox knows its pod running."""
    apply_policy: Callable[[dict[str, Any]], None]
    """A NetworkPolicy made (one that exists already is no error)."""
    put: Callable[[list[tuple[str, bytes, int]]], None]
    """Files written into the pod as it is (making none)."""
    run: Callable[[list[str]], str]
    """argv run in the pod as it is; its stdout (SandboxError when it fails)."""
    selector: Callable[[], dict[str, str]] | None = None
    """The pod's labels its policy selects it by (None: its LABEL_AGENT)."""


class KubeEgress(Egress):
    """One agent's egress on kubernetes: the proxy on TCP with the agent's credential, and
    the pod's side (see the module docstring): where the pod was told the proxy listens
    (``published``), its policy, and the probe that the policy holds."""

    reads_origins = False  # the repositories are in the pod: a token goes to its token_hosts

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *, pod: str, idle_seconds: float,
                 side: PodSide, place: str | None = None) -> None:
        """place: the folder under the pod's state root its relay's file and trust bundle are
        in (default: the agent's id; "" in claim mode, whose pool's pods start the relay
        before any agent claims one)."""
        untargeted = [r.name for r in settings.repos if r.token and r.token_hosts is None]
        if untargeted:
            raise SandboxError(f"repos.{untargeted[0]}.token_hosts: needed on kubernetes with agent.network a "
                               "list (the repository's origin is in the pod, not read from this host)")
        super().__init__(settings, data_dir, idle_seconds=idle_seconds)
        self.agent_id, self.pod, self._side = settings.id, pod, side
        self.place = settings.id if place is None else place
        self.credential = credential(prepare(self.files))
        self.published: tuple[str, int] | None = None
        """The proxy's address and port the pod was last given (None: not yet, by this process)."""
        self._pod_uid: str | None = None
        self._pod_ip: str | None = None

    def bundle_inside(self) -> str:
        return bundle_path(self.place)

    def init_command(self) -> list[str]:
        """The pod's command: INIT with the relay on TCP first."""
        return init_argv(PYTHON, self.idle_seconds, relay_with=relay_of(self.place))

    def pod_secrets(self) -> dict[str, str]:
        """The secrets the pod's Secret holds: those without hosts."""
        return {k: v for k, v in self.settings.secrets.items() if k not in self.settings.secret_hosts}

    def keep(self) -> None:
        """Before each call, the pod known running: its proxy kept, and the pod told again
        where it listens when that changed (a pod not known yet is told by the call that
        makes it: ``for_pod``)."""
        if self._side.ready():
            with self._side.lock:
                pod_ip = self._pod_ip
                if pod_ip is not None:
                    self._publish(pod_ip)

    def for_pod(self, uid: str | None, pod_ip: str) -> None:
        """The pod found or made running (under the sandbox's lock): told where the proxy
        listens once per pod in this process, a pod of another uid anew."""
        if uid != self._pod_uid:
            self.published = None
        self._pod_uid, self._pod_ip = uid, pod_ip
        self._publish(pod_ip)

    def _publish(self, pod_ip: str) -> None:
        """The proxy kept; where it changed (or the pod is not told yet by this process), the
        pod's policy applied, checked to hold, and the relay's file and the trust bundle
        written: this proxy first, then the others the file listed that still answer (the
        proxies of other servers on one run record, which may carry the pod's connections
        too: they share its placeholders and authority, ``guilds.egress.shared_key``)."""
        address, port = self._keep_on_tcp(pod_ip)
        if self.published == (address, port):
            return
        selector = self._side.selector() if self._side.selector is not None else None
        self._side.apply_policy(policy_manifest(self.settings.kubernetes.namespace, self.pod, address, port,
                                                owner=self._pod_uid or "", selector=selector))
        others = self.check_held(address, port, self._side.run)
        self._side.put(self.pod_files(address, port, others))
        self.published = (address, port)

    def _keep_on_tcp(self, pod_ip: str) -> tuple[str, int]:
        """The proxy running, listening where the pod reaches it: (address, port)."""
        address = self.settings.kubernetes.egress_address or route_source(pod_ip)
        listen = Listen(address, self._last_port(), self.credential)
        keep_proxy(self.settings, self.files, home=self.home, clock=self.clock, idle_seconds=self.idle_seconds,
                   listen=listen)
        port = proxy_port(self.files)
        if port is None:
            raise SandboxError("the egress proxy did not say which port it listens on")
        if port != listen.port:
            if listen.port:
                log.warning("egress proxy of %s: port %d was taken, it listens on %d now", self.agent_id,
                            listen.port, port)
            Path(self.files.path(PORT_FILE)).write_text(f"{port}\n")
        return address, port

    def pod_files(self, address: str, port: int,
                  others: Sequence[tuple[str, int]] = ()) -> list[tuple[str, bytes, int]]:
        """What the pod is given over exec for the relay: its file (this proxy, then others)
        and the trust bundle."""
        proxies = [[address, port], *([a, p] for a, p in others)]
        conf = json.dumps({"address": address, "port": port, "proxies": proxies,
                           "credential": self.credential}).encode()
        bundle = Path(self.files.shared, BUNDLE_NAME).read_bytes()
        return [(relay_conf(self.place), conf, 0o600), (bundle_path(self.place), bundle, 0o644)]

    def check_held(self, address: str, port: int, run: Callable[[list[str]], str]) -> list[tuple[str, int]]:
        """PROBE in the pod (run: argv -> its stdout) until the policy holds: the other proxies
        its relay's file lists that still answer; SandboxError when it never holds."""
        with canary(address) as canary_port:
            lines = run(["python3", "-I", "-S", "-c", PROBE, address, str(port), str(canary_port),
                         str(KUBERNETES_EGRESS_SETTLE_SECONDS), relay_conf(self.place)]).strip().splitlines()
        said = lines[0].strip() if lines else ""
        if said == "held":
            return _others(lines[1] if len(lines) > 1 else "[]")
        if said == "open":
            raise SandboxError(
                f"kubernetes: the pod {self.pod} reached a port of {address} that its network policy does not "
                "allow: this cluster does not enforce NetworkPolicy, so agent.network's list would not confine "
                "it (install a CNI that does, e.g. Calico or Cilium; docs/sandboxes.md)")
        raise SandboxError(
            f"kubernetes: the pod {self.pod} cannot reach the egress proxy at {address}:{port} after "
            f"{KUBERNETES_EGRESS_SETTLE_SECONDS} s ({said or 'no answer'}); set kubernetes.egress_address "
            "to an address of this host that the pods reach")

    def stop(self) -> None:
        super().stop()
        self.published, self._pod_ip = None, None

    def _last_port(self) -> int:
        try:
            return int(Path(self.files.path(PORT_FILE)).read_text())
        except (OSError, ValueError):
            return 0


def _others(line: str) -> list[tuple[str, int]]:
    """PROBE's second line: the other proxies that answer (none when it is not their list)."""
    try:
        listed = json.loads(line)
        return [(str(a), int(p)) for a, p in listed][:3]
    except (ValueError, TypeError):
        return []
