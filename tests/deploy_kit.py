"""guilds serve deployed on the test cluster from deploy/kubernetes, as docs/deploy.md says.

The test cluster (scripts/kube-test-env.sh) has no service proxy and its API server
and the host's PostgreSQL listen on 127.0.0.1 only, which its pods cannot reach
(their network is a bridge with the node's side at NODE_POD_ADDRESS and no route
out). So, for the deployment's life:

- ``Relay``: a TCP relay on NODE_POD_ADDRESS to the API server and one to
  PostgreSQL; the overlay points the replicas' in-cluster configuration at the
  first (``KUBERNETES_SERVICE_HOST`` the name the API server's certificate holds,
  resolved to the node by ``hostAliases``) and the Secret's database URL at the second;
- ``ServiceRoute``: what a service proxy does for the Service, on the host: a
  listener on 127.0.0.1 that hands each new connection to the next ready endpoint
  of the Service's EndpointSlices in turn (no affinity of any kind);
- ``Deployment``: the namespace NAMESPACE (this process's) made anew, a database of its own, the
  serve image built and imported (scripts/kube-serve-image.sh), the overlay
  applied with ``kubectl apply -k``, the rollout waited for; all removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"
NAMESPACE = f"guilds-deploy-{os.getpid()}"
"""Its own for each test process: runs at once on one cluster keep apart."""
NODE_POD_ADDRESS = "10.244.0.1"
"""The node's side of the test cluster's pod network (scripts/kube-test-env.sh)."""
API_NAME = "kubernetes.default.svc"
"""A name the test API server's certificate holds."""
PROBE_IMAGE = os.environ.get("GUILDS_TEST_KUBE_IMAGE", "guilds-sandbox:kube-test")
"""What the policy's probe pods run (any image with python3)."""
ROLLOUT_SECONDS = 300
ENDPOINTS_REFRESH_SECONDS = 0.5


def admin_config() -> Path:
    return Path(os.environ["KUBECONFIG"]).with_name("admin.kubeconfig")


def kubectl(*args: str, stdin: str | None = None, timeout: float = 120, check: bool = True) -> str:
    """kubectl as the cluster's admin (who installs guilds), in NAMESPACE."""
    done = subprocess.run(["kubectl", "--kubeconfig", str(admin_config()), "-n", NAMESPACE, *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout


# --- TCP relays ------------------------------------------------------------------------
def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until either side ends."""
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ, b)
    sel.register(b, selectors.EVENT_READ, a)
    try:
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        return
    finally:
        sel.close()
        a.close()
        b.close()


class Relay:
    """A listener on (address, any port) whose connections go to target() (host, port)."""

    def __init__(self, address: str, target):
        self.target = target
        self.server = socket.create_server((address, 0))
        self.port = int(self.server.getsockname()[1])
        self.connections: list[tuple[str, int]] = []
        """Where each connection went, in order."""
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """conn piped to target(); closed at once when there is none or it refuses (the client
        sees its connection end, as a Service with no ready endpoint ends it)."""
        try:
            where = self.target()
            self.connections.append(where)
            upstream = socket.create_connection(where, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        _pipe(conn, upstream)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()


class ServiceRoute:
    """The Service's ready endpoints, read every ENDPOINTS_REFRESH_SECONDS, each new
    connection to 127.0.0.1:port handed to the next of them in turn."""

    def __init__(self, service: str, port_name: str = "http"):
        self.service, self.port_name = service, port_name
        self.endpoints: list[tuple[str, int]] = []
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._read()
        threading.Thread(target=self._refresh, daemon=True).start()
        self.relay = Relay("127.0.0.1", self._next)
        self.url = f"http://127.0.0.1:{self.relay.port}"

    def _read(self) -> None:
        listed = json.loads(kubectl("get", "endpointslices", "-l", f"kubernetes.io/service-name={self.service}",
                                    "-o", "json"))
        ready = []
        for piece in listed["items"]:
            port = next(p["port"] for p in piece.get("ports") or () if p.get("name") == self.port_name)
            ready += [(address, port) for endpoint in piece.get("endpoints") or ()
                      if (endpoint.get("conditions") or {}).get("ready") for address in endpoint["addresses"]]
        self.endpoints = sorted(ready)

    def _refresh(self) -> None:
        while not self._stop.wait(ENDPOINTS_REFRESH_SECONDS):
            with contextlib.suppress(Exception):
                self._read()

    def _next(self) -> tuple[str, int]:
        endpoints = self.endpoints
        if not endpoints:
            raise OSError("the Service has no ready endpoint")
        return endpoints[next(self._turn) % len(endpoints)]

    def close(self) -> None:
        self._stop.set()
        self.relay.close()


# --- the deployment ---------------------------------------------------------------------
def images() -> tuple[str, str]:
    """The serve image and a sandbox image of this checkout's helpers, in the cluster's
    containerd (built, and imported when they changed)."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "kube-serve-image.sh"), sys.executable],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kube-serve-image.sh: {done.stderr.strip()[-3000:]}")
    serve, sandbox = done.stdout.split()[-2:]
    return serve, sandbox


def settings_toml(sandbox_image: str, sandbox_cpu: str = "200m", agent: str = "", more: str = "") -> str:
    """The replicas' settings; agent: lines more of the [agent] table, more: tables after the rest."""
    return (f'[agent]\nid = "serve"\nhome = "/home/agent"\nsandbox = "kubernetes"\n{agent}\n'
            f'[kubernetes]\nnamespace = "{NAMESPACE}"\nimage = "{sandbox_image}"\nmode = "claim"\nwarm = 1\n'
            f'cpu = "{sandbox_cpu}"\nmemory = "256Mi"\nhome_size = "1Gi"\n\n{more}')


def overlay(folder: Path, image: str, settings: str, api_port: int, replicas: int = 2) -> Path:
    """An overlay of deploy/kubernetes for the test cluster, written into folder."""
    name, _, tag = image.partition(":")
    (folder / "settings.toml").write_text(settings)
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "guilds-serve"},
             "spec": {"replicas": replicas, "template": {"spec": {
                 "hostAliases": [{"ip": NODE_POD_ADDRESS, "hostnames": [API_NAME]}],
                 "containers": [{"name": "serve", "env": [
                     {"name": "KUBERNETES_SERVICE_HOST", "value": API_NAME},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]}]}}}}
    (folder / "serve-patch.json").write_text(json.dumps(patch))
    (folder / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": NAMESPACE, "resources": [os.path.relpath(MANIFESTS, folder)],
        "images": [{"name": "guilds-serve", "newName": name, "newTag": tag}],
        "configMapGenerator": [{"name": "guilds-serve-settings", "behavior": "replace",
                                "files": ["settings.toml"]}],
        "patches": [{"path": "serve-patch.json"}]}))
    return folder


async def _admin_sql(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@dataclass
class Deployment:
    token: str
    database_url: str
    """The run record's URL as this host reaches it."""
    route: ServiceRoute
    settings: str
    """The replicas' settings.toml."""
    relays: list[Relay] = field(default_factory=list)

    @property
    def e2b_key(self) -> str:
        from guilds.fronts.e2b.keys import Keys

        return Keys(self.token).by_name["default"]

    def pods(self) -> list[dict]:
        listed = json.loads(kubectl("get", "pods", "-l", "app.kubernetes.io/name=guilds-serve", "-o", "json"))
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[dict]:
        """The pods whose serve container is ready, by name."""
        return sorted((p for p in self.pods() if any(c["name"] == "serve" and c.get("ready")
                                                     for c in p["status"].get("containerStatuses") or ())),
                      key=lambda p: p["metadata"]["name"])

    def scale(self, replicas: int, timeout: float = ROLLOUT_SECONDS) -> None:
        """The Deployment at this many replicas, all ready and behind the route."""
        kubectl("scale", "deployment/guilds-serve", f"--replicas={replicas}")
        rollout()
        if not wait_until(lambda: len(self.ready_pods()) == replicas == len(self.route.endpoints), timeout):
            raise RuntimeError(f"not {replicas} ready replicas behind the Service: {self.route.endpoints}")

    def sandbox_servers(self) -> list[str]:
        """The resident helper servers (awake or asleep) in the namespace's sandbox pods: for each,
        its pid, seconds since it started, and its command's start."""
        listed = json.loads(kubectl("get", "pods", "-o", "json"))
        found: list[str] = []
        for pod in listed["items"]:
            if pod["metadata"]["labels"].get("app.kubernetes.io/name") == "guilds-serve" or \
                    pod["status"].get("phase") != "Running":
                continue
            found += kubectl("exec", pod["metadata"]["name"], "--", "python3", "-I", "-S", "-c", LIST_SERVERS,
                             check=False).splitlines()
        return found

    def pod_urls(self) -> dict[str, str]:
        """Each ready replica's own address: its pod name -> http://IP:8765."""
        return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:8765" for p in self.pods()
                if p["status"].get("podIP")}


LIST_SERVERS = (
    "import os\nup=float(open('/proc/uptime').read().split()[0]);hz=os.sysconf('SC_CLK_TCK')\n"
    "def info(p):\n try:\n  c=open('/proc/'+p+'/cmdline','rb').read()\n"
    "  st=open('/proc/'+p+'/stat').read().rsplit(')',1)[1].split()\n"
    "  return c.split(b'\\0')[0].decode(),b'serve\\0--max-in-flight' in c,st[1],float(st[19])/hz\n"
    " except (OSError,IndexError,ValueError):return None\n"
    "for p in os.listdir('/proc'):\n if p.isdigit():\n  i=info(p)\n"
    "  if i and i[1] and not i[0].endswith('/sh'):\n"
    "   parent=info(i[2])\n"
    "   if not (parent and parent[1] and not parent[0].endswith('/sh')):print(p,round(up-i[3]),i[0][-12:])\n")
"""Run in a sandbox pod: each resident helper server it runs (not its exec's wrapping shell, nor its
forked workers), a line: pid, age in seconds, program (python3, or bash asleep)."""


def rollout() -> None:
    kubectl("rollout", "status", "deployment/guilds-serve", f"--timeout={ROLLOUT_SECONDS}s",
            timeout=ROLLOUT_SECONDS + 30)


def _logs() -> str:
    return kubectl("logs", "-l", "app.kubernetes.io/name=guilds-serve", "--tail=40", "--all-containers",
                   "--prefix", check=False)


@contextlib.contextmanager
def deployed(tmp: Path, replicas: int = 2, sandbox_cpu: str = "200m", *, agent: str = "",
             more: str = "") -> Iterator[Deployment]:
    """deploy/kubernetes in NAMESPACE with this many replicas, behind a ServiceRoute, for the block's
    life; sandbox_cpu: the agents' sandboxes' CPU (requests and limits); agent, more: settings
    more (``settings_toml``)."""
    base_url = os.environ["GUILDS_TEST_POSTGRES_URL"]
    server, _, name = base_url.rpartition("/")
    own = f"{name}_{NAMESPACE.replace('-', '_')}"  # its own, as the namespace: runs at once keep apart
    asyncio.run(_admin_sql(base_url, f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)'))
    asyncio.run(_admin_sql(base_url, f'CREATE DATABASE "{own}"'))
    pg_host, _, pg_port = server.rpartition("@")[2].partition(":")
    relays = [Relay(NODE_POD_ADDRESS, lambda: ("127.0.0.1", 6443)),
              Relay(NODE_POD_ADDRESS, lambda: (pg_host, int(pg_port or 5432)))]
    in_cluster_url = f"{server.replace(f'@{pg_host}:{pg_port}', f'@{NODE_POD_ADDRESS}:{relays[1].port}')}/{own}"
    token = secrets.token_urlsafe(32)
    route = None
    try:
        kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300)
        kubectl("create", "namespace", NAMESPACE)
        kubectl("create", "secret", "generic", "guilds-serve", f"--from-literal=token={token}",
                f"--from-literal=database-url={in_cluster_url}")
        serve, sandbox = images()
        settings = settings_toml(sandbox, sandbox_cpu, agent, more)
        kubectl("apply", "-k", str(overlay(tmp, serve, settings, relays[0].port, replicas)))
        try:
            rollout()
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_logs()}") from None
        route = ServiceRoute("guilds-serve")
        yield Deployment(token, f"{server}/{own}", route, settings, relays)
    finally:
        if route is not None:
            route.close()
        kubectl("delete", "sandboxclaims,sandboxwarmpools,sandboxtemplates", "--all", "--wait=false", check=False)
        kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        for relay in relays:
            relay.close()
        with contextlib.suppress(Exception):
            asyncio.run(_admin_sql(base_url, f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)'))


def host_pid(pod: dict, container: str = "serve") -> int | None:
    """The host pid of a pod's container's first process (pid 1 in its namespace), found by the
    container id in /proc/*/cgroup: a SIGKILL from inside the container's namespace is ignored
    by its pid 1, one from the host is not."""
    statuses = pod["status"].get("containerStatuses") or ()
    found = next((c.get("containerID", "") for c in statuses if c["name"] == container), "")
    container_id = found.rpartition("/")[2]
    if not container_id:
        return None
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and _is_first_of(entry.path, container_id):
                return int(entry.name)
    return None


def _is_first_of(proc: str, container_id: str) -> bool:
    """/proc/PID is the container's pid 1 (its cgroup names the container)."""
    try:
        if container_id not in Path(proc, "cgroup").read_text():
            return False
        status = Path(proc, "status").read_text()
    except OSError:
        return False
    nspid = next((line.split() for line in status.splitlines() if line.startswith("NSpid:")), [])
    return bool(nspid) and nspid[-1] == "1"


def wait_until(predicate, timeout: float, poll: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
