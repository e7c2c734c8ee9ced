"""The sandbox's side of the egress proxy (``agent.network`` a list; docs/network.md),
shared by the bwrap, docker and kubernetes sandboxes (kubernetes: kube_egress).

On the host, per agent, under ``<data>/egress/<agent id>/`` (0700):

- ``run/`` (0755), bound read-only into the sandbox at EGRESS_INSIDE: the proxy's
  socket (``proxy.sock``, 0666) and the trust bundle (``trust.pem``: the
  orchestrator's certificate authority plus the host's roots);
- ``proxy.json`` (0600): the proxy's config, the only place the real values of
  host-bound secrets are written; ``decisions.jsonl``: the proxy's decisions,
  read into the run record at each call's end (``egress_process.read_decisions``);
  ``placeholder.key`` (0600): the key placeholders are derived from;
  ``origins.json`` (0600): each repository's origin host as first read
  (``pinned_origins``), the default hosts of its token from then on;
  ``proxy.pid``, ``proxy.log``, ``clock`` (docker: the proxy's idle clock).

The certificate authority lives in ``<data>/egress/ca/``, one per data folder.

Inside, the sandbox's init runs RELAY: it listens on 127.0.0.1:RELAY_PORT in the
sandbox's own network namespace and splices each connection to the socket. Every
command gets the proxy variables (the helper names the call in them), NO_PROXY
for the loopback, and the trust bundle in the variables common clients read
(TRUST_VARS). A secret with hosts, and a repository token, is a placeholder of
the same length inside; the proxy puts the value in for its hosts only.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import stat
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from guilds_code.command import EGRESS_PROXY_ENV

from ..config.settings import AgentSettings, Repo
from ..egress.policy import address_of, normalize_host

EGRESS_INSIDE = "/run/guilds-egress"
"""Where the proxy's socket folder is bound read-only inside the sandbox."""
SOCKET_NAME = "proxy.sock"
BUNDLE_NAME = "trust.pem"
RELAY_PORT = 3128
"""The relay's port on the sandbox's own loopback (the proxy variables name it)."""
TRUST_VARS = ("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
              "GIT_SSL_CAINFO", "PIP_CERT")
"""The variables common clients read a trust bundle from (python and openssl, curl,
requests and pip, Node, git, pip)."""
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"
"""The sandbox's own loopback (the agent's servers on its ports) is reached directly."""
GITHUB, GITHUB_API = "github.com", "api.github.com"
_PLACEHOLDER_CHARS = string.ascii_letters + string.digits
_RELAY_PIPE = (
    "import socket,sys,threading,time\n"
    "def _pipe(a,b):\n"
    " try:\n"
    "  while True:\n"
    "   d=a.recv(65536)\n"
    "   if not d:break\n"
    "   b.sendall(d)\n"
    " except OSError:pass\n"
    " try:b.shutdown(socket.SHUT_WR)\n"
    " except OSError:pass\n"
)
_RELAY_UNIX = (
    "def _connect(path):\n"
    " u=socket.socket(socket.AF_UNIX)\n"
    " try:u.connect(path)\n"
    " except OSError:\n"
    "  u.close()\n"
    "  raise\n"
    " return u\n"
)
_RELAY_SERVE = (
    "def _serve(c,path):\n"
    " u=None\n"
    " try:\n"
    "  u=_connect(path)\n"
    "  t=threading.Thread(target=_pipe,args=(u,c),daemon=True)\n"
    "  t.start()\n"
    "  _pipe(c,u)\n"
    "  t.join()\n"
    " except (OSError,ValueError,KeyError,TypeError):pass\n"
    " finally:\n"
    "  c.close()\n"
    "  if u is not None:u.close()\n"
    "def _relay(lst,path):\n"
    " while True:\n"
    "  try:c=lst.accept()[0]\n"
    "  except OSError:\n"
    "   time.sleep(0.1)\n"
    "   continue\n"
    "  threading.Thread(target=_serve,args=(c,path),daemon=True).start()\n"
    "_lst=socket.socket()\n"
    "_lst.bind(('127.0.0.1',int(sys.argv[5])))\n"
    "_lst.listen(128)\n"
    "threading.Thread(target=_relay,args=(_lst,sys.argv[4]),daemon=True).start()\n"
)


def relay_code(connect: str) -> str:
    """The relay with connect's ``_connect(path)`` (a connected socket to the proxy, or
    OSError/ValueError: the connection is closed and nothing else is tried)."""
    return _RELAY_PIPE + connect + _RELAY_SERVE


RELAY = relay_code(_RELAY_UNIX)
"""The relay, run first by the sandbox's init (its argv[4]: the proxy's socket inside,
argv[5]: the port): each connection to 127.0.0.1:port is spliced to the socket,
each way in its own thread, a half-close passed on. A socket that refuses (the
proxy is down) closes the connection: nothing else is tried."""


@dataclass(frozen=True)
class EgressFiles:
    """The host files of one agent's egress proxy (see the module docstring)."""

    folder: str
    ca_dir: str

    @property
    def shared(self) -> str:
        return os.path.join(self.folder, "run")

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)


def egress_files(data_dir: str, agent_id: str) -> EgressFiles:
    root = os.path.join(data_dir, "egress")
    return EgressFiles(folder=os.path.join(root, agent_id), ca_dir=os.path.join(root, "ca"))


def init_args() -> list[str]:
    """What the init takes after its own arguments when it runs RELAY."""
    return [f"{EGRESS_INSIDE}/{SOCKET_NAME}", str(RELAY_PORT)]


# --- placeholders and hosts ---------------------------------------------------------
def placeholder(key: bytes, name: str, value: str) -> str:
    """A stand-in of value's length, derived from key and name (stable while the key is),
    letters and digits only, never equal to the value."""
    out, counter = "", 0
    while len(out) < len(value):
        block = hmac.new(key, f"{name}\0{counter}".encode(), hashlib.sha256).digest()
        out += "".join(_PLACEHOLDER_CHARS[b % len(_PLACEHOLDER_CHARS)] for b in block)
        counter += 1
    out = out[: len(value)]
    return out if out != value else out[::-1]


_REMOTE_HOST = re.compile(r"^(?:[a-z+]+://)?(?:[^@/]+@)?(\[[^\]]+\]|[^:/]+)")
ORIGINS_NAME = "origins.json"
"""Each repository's origin host as first read, by name and path (0600, host side only)."""


def origin_host(repo_folder: str) -> str | None:
    """The host name of the repository's ``origin`` remote (its .git/config, read as the
    host sees it: a regular file only, never waited on), or None when there is no such
    repository, remote, or host name (an address or a pattern is none)."""
    try:
        fd = os.open(os.path.join(repo_folder, ".git", "config"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        text = fh.read(65536).decode(errors="replace")
    section, url = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == '[remote "origin"]' and line.replace(" ", "").startswith("url="):
            url = line.split("=", 1)[1].strip()
    found = _REMOTE_HOST.match(url or "")
    host = normalize_host(found.group(1)) if found else None
    return host if host is not None and address_of(host) is None else None


def pinned_origins(files: EgressFiles, settings: AgentSettings, home: str) -> dict[str, str | None]:
    """Each repository's origin host (without ``token_hosts``), read from its .git/config
    the first time its name and path are seen and kept in ORIGINS_NAME from then on: the
    agent can rewrite .git/config, so what it writes there later never moves a token."""
    path = files.path(ORIGINS_NAME)
    with open(files.path(ORIGINS_NAME + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            kept = {}
        kept = kept if isinstance(kept, dict) else {}
        out, changed = {}, False
        for repo in (r for r in settings.repos if r.token and r.token_hosts is None):
            entry = kept.get(repo.name)
            if not isinstance(entry, dict) or entry.get("path") != repo.path:
                entry = kept[repo.name] = {"path": repo.path, "origin": origin_host(os.path.join(home, repo.path))}
                changed = True
            out[repo.name] = entry["origin"] if isinstance(entry.get("origin"), str) else None
        if changed:
            tmp = f"{path}.{os.getpid()}.tmp"
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as fh:
                json.dump(kept, fh)
            os.replace(tmp, path)
    return out


def repo_hosts(repo: Repo, origin: str | None) -> tuple[tuple[str, ...], str | None]:
    """(the hosts the token is for, the GitHub host gh must be told of or None).

    token_hosts when given, else the origin remote's host (``pinned_origins``) and its
    API host (github.com -> api.github.com); none when neither is known. A first host
    other than github.com is a GitHub Enterprise host: GH_HOST names it."""
    if repo.token_hosts is not None:
        hosts = repo.token_hosts
    else:
        hosts = () if origin is None else (GITHUB, GITHUB_API) if origin == GITHUB else (origin,)
    gh_host = hosts[0].rsplit(":", 1)[0] if hosts and hosts[0] not in (GITHUB, GITHUB_API) else None
    return hosts, gh_host


@dataclass(frozen=True)
class Listen:
    """Where a proxy listens on TCP: the address, the port asked for (0: any) and the
    credential each connection must send first."""

    address: str
    port: int
    credential: str


@dataclass(frozen=True)
class Bound:
    """A value the proxy puts in for its hosts: its name, placeholder, value and hosts."""

    name: str
    placeholder: str
    value: str
    hosts: tuple[str, ...]
    gh_host: str | None = None


def bound_values(settings: AgentSettings, files: EgressFiles, home: str | None) -> dict[str, Bound]:
    """Every host-bound value: ``secrets.NAME`` for a secret with hosts, ``repos.NAME``
    for a repository token (its default hosts from ``pinned_origins``; home None: the
    home is not on this host, a token goes to its ``token_hosts`` only). The agent's
    egress folder is made (``prepare``) and its placeholder key read."""
    key = prepare(files)
    origins = {} if home is None else pinned_origins(files, settings, home)
    out = {}
    for name, hosts in settings.secret_hosts.items():
        value = settings.secrets[name]
        out[f"secrets.{name}"] = Bound(name, placeholder(key, f"secrets.{name}", value), value, hosts)
    for repo in settings.repos:
        if repo.token:
            hosts, gh_host = repo_hosts(repo, origins.get(repo.name))
            name = f"repos.{repo.name}"
            out[name] = Bound(name, placeholder(key, name, repo.token), repo.token, hosts, gh_host)
    return out


def repos_entries(settings: AgentSettings, home: str, bound: Mapping[str, Bound]) -> dict[str, Any]:
    """repos.json's mapping behind the proxy: each folder -> its token's placeholder,
    or ``{"token", "gh_host"}`` for a repository on a GitHub Enterprise host."""
    out: dict[str, Any] = {}
    for repo in settings.repos:
        entry = bound.get(f"repos.{repo.name}")
        if entry is not None:
            folder = os.path.normpath(os.path.join(home, repo.path))
            out[folder] = ({"token": entry.placeholder, "gh_host": entry.gh_host} if entry.gh_host
                           else entry.placeholder)
    return out


def sandbox_env(settings: AgentSettings, bound: Mapping[str, Bound],
                bundle: str = f"{EGRESS_INSIDE}/{BUNDLE_NAME}") -> dict[str, str]:
    """What every command's environment gets behind the proxy, over agent_env's: the
    proxy variables (the helper names the call in them), NO_PROXY, the trust bundle's
    variables (bundle: its path inside), and each host-bound secret's placeholder in
    place of its value."""
    where = f"127.0.0.1:{RELAY_PORT}"
    env = {EGRESS_PROXY_ENV: where, **dict.fromkeys(PROXY_VARS, f"http://{where}"),
           "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY, **dict.fromkeys(TRUST_VARS, bundle)}
    for name in settings.secret_hosts:
        env[name] = bound[f"secrets.{name}"].placeholder
    return env


# --- the proxy's files and process ---------------------------------------------------------
def prepare(files: EgressFiles, owner: tuple[int, int] | None = None) -> bytes:
    """The folders made (the shared one 0755), the placeholder key read or made; returns it."""
    os.makedirs(files.folder, mode=0o700, exist_ok=True)
    os.makedirs(files.shared, exist_ok=True)
    os.chmod(files.shared, 0o755)  # noqa: S103 - the sandbox's uid must reach the socket in it
    key_path = files.path("placeholder.key")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return Path(key_path).read_bytes()
    with os.fdopen(fd, "wb") as fh:
        key = os.urandom(32)
        fh.write(key)
    return key


def proxy_config(settings: AgentSettings, files: EgressFiles, bound: Mapping[str, Bound], *,
                 clock: str, idle_seconds: float, resolve: Mapping[str, str] | None = None,
                 listen: Listen | None = None) -> dict[str, Any]:
    """The proxy's config (guilds.egress's contract): the only holder of the real values.
    listen: a TCP address with a credential (kubernetes) in place of the Unix socket."""
    where = ({"listen": f"{listen.address}:{listen.port}", "credential": listen.credential} if listen
             else {"socket": os.path.join(files.shared, SOCKET_NAME)})
    return {
        **where,
        "allow": list(settings.egress),
        "secrets": [{"name": b.name, "placeholder": b.placeholder, "value": b.value, "hosts": list(b.hosts)}
                    for b in bound.values() if b.hosts],
        "ca_dir": files.ca_dir,
        "decisions": files.path("decisions.jsonl"),
        "resolve": dict(resolve or {}),
        "idle_clock": clock,
        "idle_seconds": idle_seconds,
        "pidfile": files.path("proxy.pid"),
    }


def pin_own_origins(agent_files: EgressFiles | None, settings: AgentSettings, own: AgentSettings,
                    data_dir: str) -> None:
    """A sandbox beside the agent's with an allowlist of its own (``own``) gets the agent's
    origins.json (pinned now if it was not yet), where a repository token goes by origin."""
    if agent_files is None or not own.egress or not any(r.token and r.token_hosts is None for r in own.repos):
        return
    pinned_origins(agent_files, settings, str(settings.home))
    files = egress_files(os.path.realpath(data_dir), own.id)
    prepare(files)
    data = Path(agent_files.path(ORIGINS_NAME)).read_bytes()
    fd = os.open(files.path(ORIGINS_NAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
