"""The sandbox's side of the egress proxy (``agent.network`` a list; docs/network.md),
shared by the bwrap and docker sandboxes.

On the host, per agent, under ``<data>/egress/<agent id>/`` (0700):

- ``run/`` (0755), bound read-only into the sandbox at EGRESS_INSIDE: the proxy's
  socket (``proxy.sock``, 0666) and the trust bundle (``trust.pem``: the
  orchestrator's certificate authority plus the host's roots);
- ``proxy.json`` (0600): the proxy's config, the only place the real values of
  host-bound secrets are written; ``decisions.jsonl``: the proxy's decisions,
  read into the run record at each call's end (``read_decisions``);
  ``placeholder.key`` (0600): the key placeholders are derived from;
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

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from guilds_code.command import EGRESS_PROXY_ENV

from ..config.settings import AgentSettings, Repo
from ..errors import SandboxError
from ..limits import EGRESS_DECISIONS_READ_MAX_BYTES, EGRESS_START_POLL_SECONDS, EGRESS_START_SECONDS
from ._spawn import spawn_detached

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
RELAY = (
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
    "def _serve(c,path):\n"
    " u=socket.socket(socket.AF_UNIX)\n"
    " try:\n"
    "  u.connect(path)\n"
    "  t=threading.Thread(target=_pipe,args=(u,c),daemon=True)\n"
    "  t.start()\n"
    "  _pipe(c,u)\n"
    "  t.join()\n"
    " except OSError:pass\n"
    " finally:\n"
    "  c.close()\n"
    "  u.close()\n"
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


def origin_host(repo_folder: str) -> str | None:
    """The host of the repository's ``origin`` remote (its .git/config, read as the
    host sees it), or None when there is no such repository or remote yet."""
    try:
        text = Path(repo_folder, ".git", "config").read_text(errors="replace")[:65536]
    except OSError:
        return None
    section, url = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == '[remote "origin"]' and line.replace(" ", "").startswith("url="):
            url = line.split("=", 1)[1].strip()
    found = _REMOTE_HOST.match(url or "")
    return found.group(1).lower() if found else None


def repo_hosts(repo: Repo, home: str) -> tuple[tuple[str, ...], str | None]:
    """(the hosts the token is for, the GitHub host gh must be told of or None).

    token_hosts when given, else the origin remote's host and its API host
    (github.com -> api.github.com); none when neither is known. A first host
    other than github.com is a GitHub Enterprise host: GH_HOST names it."""
    if repo.token_hosts is not None:
        hosts = repo.token_hosts
    else:
        origin = origin_host(os.path.join(home, repo.path))
        hosts = () if origin is None else (GITHUB, GITHUB_API) if origin == GITHUB else (origin,)
    gh_host = hosts[0].rsplit(":", 1)[0] if hosts and hosts[0] not in (GITHUB, GITHUB_API) else None
    return hosts, gh_host


@dataclass(frozen=True)
class Bound:
    """A value the proxy puts in for its hosts: its name, placeholder, value and hosts."""

    name: str
    placeholder: str
    value: str
    hosts: tuple[str, ...]
    gh_host: str | None = None


def bound_values(settings: AgentSettings, key: bytes, home: str) -> dict[str, Bound]:
    """Every host-bound value: ``secrets.NAME`` for a secret with hosts, ``repos.NAME``
    for a repository token."""
    out = {}
    for name, hosts in settings.secret_hosts.items():
        value = settings.secrets[name]
        out[f"secrets.{name}"] = Bound(name, placeholder(key, f"secrets.{name}", value), value, hosts)
    for repo in settings.repos:
        if repo.token:
            hosts, gh_host = repo_hosts(repo, home)
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


def sandbox_env(settings: AgentSettings, bound: Mapping[str, Bound]) -> dict[str, str]:
    """What every command's environment gets behind the proxy, over agent_env's: the
    proxy variables (the helper names the call in them), NO_PROXY, the trust bundle's
    variables, and each host-bound secret's placeholder in place of its value."""
    where = f"127.0.0.1:{RELAY_PORT}"
    bundle = f"{EGRESS_INSIDE}/{BUNDLE_NAME}"
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
                 clock: str, idle_seconds: float, resolve: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The proxy's config (guilds.egress's contract): the only holder of the real values."""
    return {
        "socket": os.path.join(files.shared, SOCKET_NAME),
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


@contextlib.contextmanager
def _locked(files: EgressFiles) -> Iterator[None]:
    with open(files.path("proxy.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def settings_digest(settings: AgentSettings, *parts: Any) -> str:
    """What the running proxy must have been started from: the allowlist, the
    secrets and repositories (and any parts given, as the idle time)."""
    data = [settings.egress, sorted(settings.secrets.items()), sorted(settings.secret_hosts.items()),
            [(r.name, r.path, r.token, r.token_hosts) for r in settings.repos], *parts]
    return hashlib.sha256(json.dumps(data, default=list).encode()).hexdigest()


def ensure_proxy(files: EgressFiles, digest: str, make_config: Callable[[], Mapping[str, Any]]) -> None:
    """The agent's proxy running: found alive and started from the same settings
    (digest), else started anew with make_config(), detached, and waited for until it
    listens. Alive: its process runs and its socket answers (one hung or whose socket
    went is replaced). A repository's default hosts are read when the proxy starts."""
    from ..egress.daemon import is_serving
    from ..egress.proxy_config import write_config

    config_path, digest_path = files.path("proxy.json"), files.path("proxy.digest")
    with _locked(files):
        pid = proxy_pid(files)
        serving = pid is not None and is_serving(os.path.join(files.shared, SOCKET_NAME))
        if serving and _read(digest_path) == digest:
            return
        if pid is not None:
            _terminate(pid)
        config = make_config()
        try:
            write_config(config_path, config)
        except ValueError as exc:
            raise SandboxError(f"the egress proxy's config: {exc}") from None
        _write_private(digest_path, digest)
        Path(config["pidfile"]).unlink(missing_ok=True)
        from ._host_folder import real_python

        spawn_detached([real_python(), "-m", "guilds.egress", config_path], env=_proxy_env(),
                       log_path=files.path("proxy.log"), pass_fds=())
        deadline = time.monotonic() + EGRESS_START_SECONDS
        while proxy_pid(files) is None:
            if time.monotonic() > deadline:
                raise SandboxError(f"the egress proxy did not start: {_log_tail(files)}")
            time.sleep(EGRESS_START_POLL_SECONDS)


def keep_proxy(settings: AgentSettings, files: EgressFiles, *, home: str, clock: str,
               idle_seconds: float) -> None:
    """At each call: the proxy's idle clock moved, the proxy started when it is not running
    (or was started from other settings)."""
    Path(clock).touch(mode=0o644)
    os.utime(clock)
    resolve = settings.egress_resolve

    def config() -> dict[str, Any]:
        bound = bound_values(settings, prepare(files), home)
        write_trust_bundle(files)
        return proxy_config(settings, files, bound, clock=clock, idle_seconds=idle_seconds, resolve=resolve)

    ensure_proxy(files, settings_digest(settings, idle_seconds, sorted(resolve.items())), config)


def write_trust_bundle(files: EgressFiles) -> None:
    """``run/trust.pem``: the orchestrator's authority (made on first use) plus the host's roots."""
    from ..egress.ca import CertificateAuthority

    try:
        CertificateAuthority.open(files.ca_dir).trust_bundle(os.path.join(files.shared, BUNDLE_NAME))
    except (OSError, ValueError) as exc:
        raise SandboxError(f"the egress proxy's certificate authority: {exc}") from exc


def stop_proxy(files: EgressFiles) -> None:
    with _locked(files):
        pid = proxy_pid(files)
        if pid is not None:
            _terminate(pid)


def proxy_pid(files: EgressFiles) -> int | None:
    """The pid of the agent's proxy when it runs (its pidfile names a live
    ``guilds.egress`` process of this config), else None."""
    try:
        pid = int(Path(files.path("proxy.pid")).read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if files.path("proxy.json").encode() in cmdline.split(b"\0") else None


def _terminate(pid: int) -> None:
    import signal

    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + EGRESS_START_SECONDS
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(EGRESS_START_POLL_SECONDS)
    if _running(pid):  # hung: it does not get to keep the socket
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """pid exists and has not exited (a zombie nobody reaped yet has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _proxy_env() -> dict[str, str]:
    """The proxy's environment: this process's (SSL_CERT_FILE is honoured upstream), with
    PYTHONPATH so that ``-m guilds.egress`` finds this very package."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _write_private(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _log_tail(files: EgressFiles) -> str:
    text = _read(files.path("proxy.log")) or "(no log)"
    return " ".join(text.splitlines()[-3:])


# --- decisions into the run record ---------------------------------------------------------
def read_decisions(files: EgressFiles) -> list[dict[str, Any]]:
    """The decisions the proxy appended since the last read (by any process), each a dict
    as the proxy wrote it; a line that is not a JSON object is skipped."""
    path, mark = files.path("decisions.jsonl"), files.path("decisions.read")
    with _locked(files):
        try:
            start = int(_read(mark) or 0)
            if os.path.getsize(path) < start:  # a new file: read it from its start
                start = 0
            with open(path, "rb") as fh:
                fh.seek(start)
                chunk = fh.read(EGRESS_DECISIONS_READ_MAX_BYTES)
        except (OSError, ValueError):
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        _write_private(mark, str(start + len(complete)))
    out = []
    for line in complete.splitlines():
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                out.append(item)
    return out
