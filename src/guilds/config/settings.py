"""The agent's settings: a TOML file, frozen dataclasses, unknown keys refused.

```toml
[agent]
id = "agent1"                 # letters, digits, '.', '_', '-' (it names files)
home = "/path/to/home"        # made if missing; relative to this file's folder
sandbox = "auto"              # auto | local | bwrap | docker | kubernetes
coding = true                 # the live coding flag: tools offered only while true
max_tool_calls = 200          # per run; remaining_tool_calls counts down from it
ports = "20000-20099"         # the port block; PORT is its first port
network = false               # false | true (unfiltered) | ["github.com", "*.example.org", ...]
                              # a list: bwrap, docker, kubernetes, through the egress proxy (docs/network.md)
result_max_bytes = 8192       # the helper's cap (else $CODE_RESULT_MAX_BYTES, else 8192)
harness = "claude-code"       # code_task's harness: claude-code | codex
transport = "auto"            # how calls reach the helper: auto | resident | exec (docs/helper.md)
max_in_flight = 64            # resident: requests of this agent running at once; the next is refused
checkpoints = false           # a checkpoint of the home before each shell and code_task call (docs/checkpoints.md)
checkpoints_max_count = 100   # the oldest checkpoints pruned past this many
checkpoints_max_size = "2g"   # ... or past this much stored content (k, m, g)

[secrets]                     # put into every command's environment; redacted from every result
OPENAI_API_KEY = "..."

[secrets.PYPI_TOKEN]          # with agent.network a list: the sandbox sees a placeholder, and the
value = "..."                 # egress proxy puts the value in for these hosts only
hosts = ["upload.example.org"]

[repos.web]                   # a repository: its folder under the home, its token
path = "repos/web"            # default repos/<name>
token = "..."
token_hosts = ["github.com", "api.github.com"]  # with agent.network a list (default: origin's host and its API host)

[egress.resolve]              # agent.network a list: names the egress proxy resolves to these
"git.internal" = "10.1.2.3"   # addresses (like curl --resolve); still checked against the list

[docker]                      # sandbox = "docker": one container per agent (docs/sandboxes.md)
image = "guilds-sandbox:latest"
memory = "2g"                 # the container's memory limit
pids_limit = 512
idle_minutes = 30             # stopped after this long without a call
network = "bridge"            # the Docker network joined when agent.network is true

[bwrap]                       # sandbox = "bwrap" (docs/sandboxes.md)
uid = 0                       # the commands' host uid when the orchestrator is root; 0: one
                              # derived from the agent id (1500000000 + a hash, one per agent)
memory = "2g"                 # the sandbox's memory (a cgroup; else per process, RLIMIT_AS)
pids_limit = 512              # processes at once (a cgroup and RLIMIT_NPROC)
tmp_size = "1g"               # /tmp, a tmpfs of at most this much
state_size = "256m"           # /run/guilds (the state root), a tmpfs of at most this much

[kubernetes]                  # sandbox = "kubernetes": one pod per agent (docs/sandboxes.md)
namespace = "guilds"
image = "guilds-sandbox:latest"
runtime_class = ""            # e.g. "gvisor"; empty: the cluster's default runtime
cpu = "1"                     # requests = limits
memory = "2Gi"
service_account = ""          # one with no API rights; empty: the namespace's default
idle_minutes = 30             # the pod is deleted after this long without a call
home_size = "10Gi"            # the agent's volume claim (home and state root)
mode = "pod"                  # pod: a pod per agent; claim: a SandboxClaim per agent from a warm
                              # pool (kubernetes-sigs/agent-sandbox installed; docs/sandboxes.md)
warm = 2                      # claim: ready sandboxes kept in the pool, waiting for new agents
keep_home = false             # claim: the agent keeps a Sandbox of its own with its home on a
                              # volume claim, suspended by `guilds sandbox stop`, resumed on use
egress_address = ""           # agent.network a list: where the egress proxy listens for the
                              # pods (an address of this host they reach); empty: the one
                              # this host sends from towards the agent's pod (docs/network.md)
channel = "exec"              # pod mode: the resident helper's frames on its exec's stream
                              # (exec), or on TCP to the pod's IP (direct: this host reaches it)
```

Every section and key is optional. A bad file raises ``ConfigError`` whose
message names the key (``agent.sandbx: unknown key``). A file holding a secret
or a repository token that its group or others may read is refused, as ``ssh``
refuses such a private key (``exposed_error``: "chmod 600 FILE"). Loading has no side
effects: the home is made by the sandbox when it starts.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from guilds_code import limits
from guilds_code.redact import MIN_SECRET_CHARS
from guilds_harness.harnesses import DEFAULT_HARNESS, HARNESSES

from ..errors import ConfigError
from . import checks as check
from . import egress

DEFAULT_AGENT_ID = "agent1"
DEFAULT_SANDBOX = "auto"
DEFAULT_MAX_TOOL_CALLS = 200
DEFAULT_PORTS = (20000, 20099)
DEFAULT_HOME = "home"
"""The home when the file names none: a folder beside the settings file."""
DEFAULT_TRANSPORT = "auto"
TRANSPORTS = ("auto", "resident", "exec")
"""How requests reach the helper (agent.transport; guilds.toolbox.transport.Transport)."""
DEFAULT_MAX_IN_FLIGHT = 64
MAX_IN_FLIGHT_LIMIT = 4096
DEFAULT_CHECKPOINTS_MAX_COUNT = 100
"""Checkpoints kept per agent: a call's start each, so about the last hundred shell calls."""
CHECKPOINTS_MAX_COUNT_LIMIT = 100_000
DEFAULT_CHECKPOINTS_MAX_SIZE = 2 << 30
"""Content kept per agent (each changed file once): the oldest go past it."""
"""The most agent.max_in_flight may be: each request in flight is a process in the sandbox."""
SANDBOXES = ("auto", "local", "bwrap", "docker", "kubernetes")
KUBERNETES_MODES = ("pod", "claim")
KUBERNETES_CHANNELS = ("exec", "direct")
"""The sandbox backends by the name agent.sandbox gives (guilds.sandbox.get_sandbox)."""
SETTINGS_FILE = "settings.toml"
DATA_ENV = "GUILDS_DATA"
RESULT_MAX_BYTES_ENV = "CODE_RESULT_MAX_BYTES"
RESERVED_ENV = frozenset(
    {"HOME", "PATH", "PORT", "GH_TOKEN", limits.STATE_DIR_ENV, "GUILD_RUN_ID", "GUILD_AGENT_ID"}
)
"""Secret names refused: the sandbox and the helper set these themselves."""


@dataclass(frozen=True)
class Repo:
    name: str
    path: str
    """Folder relative to the home."""
    token: str = ""
    token_hosts: tuple[str, ...] | None = None
    """The hosts the egress proxy gives the token to; None: the origin remote's host and its API host."""


@dataclass(frozen=True)
class SandboxUser:
    """Who the agent is inside its sandbox when a template says so (E2B's sandboxes: ``E2B_USER``).

    The home is bound at ``home`` inside (HOME, the commands' folder), the agent's uid and gid
    are named ``name`` in the sandbox's /etc/passwd and /etc/group, and ``/usr/local/bin/sudo``
    runs its command as that same uid (``guilds.sandbox.sandbox_user``). None of it gives the
    sandbox a privilege: the uid, its capabilities and its mounts are the agent's as ever.
    """

    name: str
    home: str


E2B_USER = SandboxUser(name="user", home="/home/user")
"""E2B's: the user ``user`` with its home at /home/user."""


DEFAULT_SANDBOX_IMAGE = "guilds-sandbox:latest"
DEFAULT_IDLE_MINUTES = 30


@dataclass(frozen=True)
class DockerSettings:
    """[docker]: the agent's container (see the module docstring for each key)."""

    image: str = DEFAULT_SANDBOX_IMAGE
    memory: str = "2g"
    pids_limit: int = 512
    idle_minutes: int = DEFAULT_IDLE_MINUTES
    network: str = "bridge"


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
MIN_SIZE_BYTES = 1 << 20
"""The smallest memory or tmpfs size bwrap accepts from the settings (1 MiB)."""


@dataclass(frozen=True)
class BwrapSettings:
    """[bwrap]: the agent's bubblewrap sandbox (see the module docstring for each key)."""

    uid: int = 0
    memory: int = 2 << 30
    pids_limit: int = 512
    tmp_size: int = 1 << 30
    state_size: int = 256 << 20


@dataclass(frozen=True)
class KubernetesSettings:
    """[kubernetes]: the agent's pod (see the module docstring for each key)."""

    namespace: str = "guilds"
    image: str = DEFAULT_SANDBOX_IMAGE
    runtime_class: str = ""
    cpu: str = "1"
    memory: str = "2Gi"
    service_account: str = ""
    idle_minutes: int = DEFAULT_IDLE_MINUTES
    home_size: str = "10Gi"
    mode: str = "pod"
    """pod: one pod per agent; claim: one SandboxClaim per agent from a warm pool."""
    warm: int = 2
    """claim: the warm pool's size (sandboxes made before any agent asks)."""
    keep_home: bool = False
    """claim: a Sandbox of the agent's own with a home volume instead of a claim from the pool."""
    sized_by_server: bool = False
    """claim, never a settings file's key: the warm pool is a served template's, whose replicas the
    server sets from the template's demand (``[templates.NAME.pool]``, ``guilds.agents.claim_pools``).
    The sandbox makes the template and the pool when they are missing (at ``warm``) but never resizes
    the pool, and removing the agent leaves them."""
    egress_address: str = ""
    channel: str = "exec"
    """pod mode: how the resident helper's frames travel. exec: on the pods/exec stream that
    started it (through the API server and the kubelet); direct: on a TCP connection to the
    pod's address, once the exec has said where (this host reaches the pods' IPs)."""


@dataclass(frozen=True)
class AgentSettings:
    id: str
    home: Path
    sandbox: str = DEFAULT_SANDBOX
    coding: bool = True
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    ports: tuple[int, int] = DEFAULT_PORTS
    network: bool = False
    """The sandbox's whole network (``agent.network = true``); False for a list."""
    egress: tuple[str, ...] = ()
    """The allowlist (``agent.network`` as a list): traffic leaves through the egress proxy only."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    secret_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Secrets given as a table with hosts: the sandbox sees a placeholder, the proxy puts the value in."""
    repos: tuple[Repo, ...] = ()
    result_max_bytes: int = limits.DEFAULT_MAX_BYTES
    harness: str = DEFAULT_HARNESS
    """The coding harness code_task drives: claude-code or codex."""
    transport: str = DEFAULT_TRANSPORT
    """auto: the resident helper when it opens, else a process per call; resident; exec."""
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    """The resident helper's bound on this agent's requests running at once."""
    checkpoints: bool = False
    """A checkpoint of the home before each shell call, and at code_task's start and end."""
    checkpoints_max_count: int = DEFAULT_CHECKPOINTS_MAX_COUNT
    checkpoints_max_size: int = DEFAULT_CHECKPOINTS_MAX_SIZE
    """Bytes of content the agent's checkpoints may hold; the oldest are pruned past it."""
    docker: DockerSettings = field(default_factory=DockerSettings)
    bwrap: BwrapSettings = field(default_factory=BwrapSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    egress_resolve: Mapping[str, str] = field(default_factory=dict)
    """[egress.resolve]: host name -> the address the egress proxy connects to for it."""
    egress_headers: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Header rules (``guilds.egress.rules``): host -> the headers the egress proxy sets on each
    request to it; never a settings file's key (an E2B sandbox's ``network.rules``)."""
    user: SandboxUser | None = None
    """Who the agent is inside (its home's path, its uid's name, ``sudo``); None: the home
    at its host path and the uid named as docs/sandboxes.md says."""

    def home_inside(self) -> str:
        """The home's path inside the sandbox."""
        return str(self.home) if self.user is None else self.user.home

    def secret_values(self) -> list[str]:
        """Every value to redact: the secrets and the repository tokens."""
        return [*self.secrets.values(), *(r.token for r in self.repos if r.token),
                *(value for headers in self.egress_headers.values() for _, value in headers)]


SERVED_KEYS = ("templates", "agents", "pool")
"""The tables of a server's templates, its caps and the file's own agent's warm pool
(``guilds.config.templates`` reads them)."""
_AGENT_KEYS = ("id", "home", "sandbox", "coding", "max_tool_calls", "ports", "network",
               "result_max_bytes", "harness", "transport", "max_in_flight", "checkpoints",
               "checkpoints_max_count", "checkpoints_max_size")


def _result_max_bytes(table: dict, env: Mapping[str, str]) -> int:
    """agent.result_max_bytes, else $CODE_RESULT_MAX_BYTES, else 8192."""
    if "result_max_bytes" in table:
        key, value = "agent.result_max_bytes", table["result_max_bytes"]
    elif env.get(RESULT_MAX_BYTES_ENV):
        key = RESULT_MAX_BYTES_ENV
        value = check.int_text(env[RESULT_MAX_BYTES_ENV], key)
    else:
        return limits.DEFAULT_MAX_BYTES
    return check.integer(value, key, limits.MIN_MAX_BYTES, limits.PLATFORM_CAP_BYTES)


def _agent(table: dict, base: Path, env: Mapping[str, str]) -> dict:
    check.known(table, "agent", _AGENT_KEYS)
    home = check.string(table.get("home", DEFAULT_HOME), "agent.home")
    if not home.strip():
        raise ConfigError("agent.home: must not be empty")
    sandbox = check.choice(table.get("sandbox", DEFAULT_SANDBOX), "agent.sandbox", SANDBOXES)
    network, allowlist = egress.network(table.get("network", False), sandbox)
    return {
        "id": check.name(table.get("id", DEFAULT_AGENT_ID), "agent.id"),
        "home": (base / Path(home).expanduser()).resolve(),
        "sandbox": sandbox,
        "coding": check.boolean(table.get("coding", True), "agent.coding"),
        "max_tool_calls": check.integer(
            table.get("max_tool_calls", DEFAULT_MAX_TOOL_CALLS), "agent.max_tool_calls", 1
        ),
        "ports": check.ports(table.get("ports", "{}-{}".format(*DEFAULT_PORTS)), "agent.ports"),
        "network": network,
        "egress": allowlist,
        "result_max_bytes": _result_max_bytes(table, env),
        "harness": check.choice(table.get("harness", DEFAULT_HARNESS), "agent.harness", tuple(HARNESSES)),
        "transport": check.choice(table.get("transport", DEFAULT_TRANSPORT), "agent.transport", TRANSPORTS),
        "max_in_flight": check.integer(table.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT),
                                       "agent.max_in_flight", 1, MAX_IN_FLIGHT_LIMIT),
        **_checkpoints(table),
    }


CHECKPOINT_SANDBOXES = ("auto", "local", "bwrap", "docker")
"""The backends whose home is a folder on this machine, where checkpoints are kept. On
kubernetes, ``agent.checkpoints = true`` is read, and refused when the agent starts,
naming what the cluster lacks (``guilds.sandbox.kubernetes.kube_volsnap``)."""


def _checkpoints(table: dict) -> dict:
    """agent.checkpoints and its limits (kubernetes: checked against the cluster at the agent's start)."""
    enabled = check.boolean(table.get("checkpoints", False), "agent.checkpoints")
    return {
        "checkpoints": enabled,
        "checkpoints_max_count": check.integer(table.get("checkpoints_max_count", DEFAULT_CHECKPOINTS_MAX_COUNT),
                                               "agent.checkpoints_max_count", 1, CHECKPOINTS_MAX_COUNT_LIMIT),
        "checkpoints_max_size": (_size(table["checkpoints_max_size"], "agent.checkpoints_max_size")
                                 if "checkpoints_max_size" in table else DEFAULT_CHECKPOINTS_MAX_SIZE),
    }


def _redactable(value: str, key: str) -> str:
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(f"{key}: at least {MIN_SECRET_CHARS} characters, or it cannot be redacted")
    return value


def _secrets(table: dict, filtered: bool) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """[secrets]: NAME = "value", or (agent.network a list) a table with value and hosts."""
    values, hosts = {}, {}
    for name, entry in table.items():
        key = f"secrets.{name}"
        check.env_name(name, key)
        if name in RESERVED_ENV:
            raise ConfigError(f"{key}: reserved, the sandbox sets {name} itself")
        value = entry
        if isinstance(entry, dict):
            value, named = egress.secret_table(entry, key, filtered)
            key = f"{key}.value"
            if named:
                hosts[name] = named
        values[name] = _redactable(check.string(value, key), key)
    return values, hosts


def _repo(name: str, entry: Any, filtered: bool) -> Repo:
    key = f"repos.{name}"
    check.name(name, key)
    entry = check.table(entry, key)
    check.known(entry, key, ("path", "token", "token_hosts"))
    path = check.string(entry.get("path", f"repos/{name}"), f"{key}.path")
    token = check.string(entry.get("token", ""), f"{key}.token")
    return Repo(
        name=name,
        path=check.relative_path(path, f"{key}.path"),
        token=_redactable(token, f"{key}.token") if token else "",
        token_hosts=egress.token_hosts(entry, key, filtered),
    )


def _minutes(value: Any, key: str) -> int:
    return check.integer(value, key, 1)


def _size(value: Any, key: str) -> int:
    """A size such as "512m" or "2g" (k, m, g: binary units) -> bytes, at least MIN_SIZE_BYTES."""
    text = check.string(value, key).strip().lower().removesuffix("b")
    number, unit = text.rstrip("kmg"), text[len(text.rstrip("kmg")):]
    if not number.isdigit() or unit not in _SIZE_UNITS:
        raise ConfigError(f"{key}: must be a size such as \"512m\" or \"2g\", got {value!r}")
    size = int(number) * _SIZE_UNITS[unit]
    if size < MIN_SIZE_BYTES:
        raise ConfigError(f"{key}: must be at least 1m, got {value!r}")
    return size


def _address(value: Any, key: str) -> str:
    """An IP address in its standard form, or "" (none given)."""
    text = check.string(value, key).strip()
    from ..egress.policy import address_of

    if text and (address_of(text) is None or str(address_of(text)) != text):
        raise ConfigError(f"{key}: must be an IP address such as \"10.244.0.1\", got {value!r}")
    return text


_SECTIONS: dict[str, tuple[type, dict[str, Callable[[Any, str], Any]]]] = {
    "docker": (DockerSettings, {"image": check.string, "memory": check.string,
                                "pids_limit": lambda v, k: check.integer(v, k, 16),
                                "idle_minutes": _minutes, "network": check.string}),
    "bwrap": (BwrapSettings, {"uid": lambda v, k: check.integer(v, k, 0, 2**31 - 2),
                              "memory": _size, "pids_limit": lambda v, k: check.integer(v, k, 16),
                              "tmp_size": _size, "state_size": _size}),
    "kubernetes": (KubernetesSettings, {
        "namespace": check.string, "image": check.string, "runtime_class": check.string,
        "cpu": check.string, "memory": check.string, "service_account": check.string,
        "idle_minutes": _minutes, "home_size": check.string,
        "mode": lambda v, k: check.choice(v, k, KUBERNETES_MODES),
        "warm": lambda v, k: check.integer(v, k, 0, 1000), "keep_home": check.boolean,
        "egress_address": _address, "channel": lambda v, k: check.choice(v, k, KUBERNETES_CHANNELS)}),
}


def _section(data: Mapping[str, Any], where: str) -> Any:
    """[docker] or [kubernetes]: each key checked by its checker, the rest defaulted."""
    cls, checks = _SECTIONS[where]
    table = check.table(data.get(where, {}), where)
    check.known(table, where, checks)
    return cls(**{k: checks[k](v, f"{where}.{k}") for k, v in table.items()})


def parse_settings(data: Mapping[str, Any], base: Path, env: Mapping[str, str] | None = None) -> AgentSettings:
    """A parsed TOML document -> AgentSettings; relative paths resolve against base."""
    check.known(data, "", ("agent", "secrets", "repos", "egress", *_SECTIONS, *SERVED_KEYS))
    env = os.environ if env is None else env
    agent = _agent(check.table(data.get("agent", {}), "agent"), base, env)
    filtered = bool(agent["egress"])
    secrets, secret_hosts = _secrets(check.table(data.get("secrets", {}), "secrets"), filtered)
    repos = tuple(_repo(n, e, filtered) for n, e in check.table(data.get("repos", {}), "repos").items())
    sections = {where: _section(data, where) for where in _SECTIONS}
    kube = sections["kubernetes"]
    if kube.channel == "direct" and kube.mode != "pod":
        raise ConfigError(f"kubernetes.channel: \"direct\" is for mode \"pod\" (claim mode's pods keep the "
                          f"exec's stream), got mode {kube.mode!r}")
    resolve = egress.resolve_table(check.table(data.get("egress", {}), "egress"), filtered)
    return AgentSettings(**agent, secrets=secrets, secret_hosts=secret_hosts, repos=repos,
                         egress_resolve=resolve, **sections)


def exposure(mode: int) -> str | None:
    """Who besides the owner may read a file of this mode ("group", "others", "group and others"), or None."""
    who = [name for name, bit in (("group", 0o040), ("others", 0o004)) if mode & bit]
    return " and ".join(who) or None


def exposed_error(path: Path, mode: int) -> str:
    """The one line refusing a settings file with secrets that others may read (``ssh`` refuses a key so)."""
    return (f"{path}: holds secrets or tokens and {exposure(mode)} may read it "
            f"(mode {mode & 0o777:04o}): chmod 600 {path}")


def holds_secrets(data: Mapping[str, Any]) -> bool:
    """The parsed document, or one of its templates, has a ``[secrets]`` value or a repository ``token``."""
    repos = data.get("repos", {})
    tokens = isinstance(repos, dict) and any(isinstance(r, dict) and r.get("token") for r in repos.values())
    templates = data.get("templates", {})
    held = isinstance(templates, dict) and any(isinstance(t, dict) and holds_secrets(t) for t in templates.values())
    return bool(data.get("secrets")) or tokens or held


def _document(path: Path) -> tuple[dict, int]:
    """The parsed document and the file's mode (of the file opened: no second lookup by name)."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh), os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such settings file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def exposed(path: Path) -> str | None:
    """``exposed_error`` when the settings file holds secrets the group or others may read;
    None when it does not (or cannot be read: loading it says why)."""
    try:
        data, mode = _document(path)
    except ConfigError:
        return None
    return exposed_error(path, mode) if exposure(mode) and holds_secrets(data) else None


def read_toml(path: Path) -> dict:
    """The document; ConfigError when it holds secrets and the group or others may read it."""
    data, mode = _document(path)
    if exposure(mode) and holds_secrets(data):
        raise ConfigError(exposed_error(path, mode))
    return data


def load_settings(path: Path | str, env: Mapping[str, str] | None = None) -> AgentSettings:
    """Read and check the settings file; ConfigError names the bad key.

    env (default os.environ) is read only for $CODE_RESULT_MAX_BYTES.
    """
    path = Path(path).expanduser().resolve()
    return parse_settings(read_toml(path), path.parent, env)


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The data folder: $GUILDS_DATA, else ~/.local/share/guilds."""
    env = os.environ if env is None else env
    value = env.get(DATA_ENV)
    return Path(value).expanduser() if value else Path.home() / ".local/share/guilds"


_DEFAULT_TEMPLATE = '''\
# The embedded default agent of guilds, written on first run. Edit freely:
# the keys are documented in docs/settings.md.
[agent]
id = "{id}"
home = "home"                 # {data}/home
sandbox = "{sandbox}"
coding = true
max_tool_calls = {max_calls}
ports = "{ports[0]}-{ports[1]}"
network = false

[secrets]
# NAME = "value"

# [repos.web]
# path = "repos/web"
# token = "..."
'''


def default_settings_file(data: Path) -> Path:
    """<data>/settings.toml, written (mode 0600, never overwritten) on first run."""
    path = Path(data) / SETTINGS_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = _DEFAULT_TEMPLATE.format(id=DEFAULT_AGENT_ID, data=data, sandbox=DEFAULT_SANDBOX,
                                        max_calls=DEFAULT_MAX_TOOL_CALLS, ports=DEFAULT_PORTS)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    return path


def default_settings(data: Path, env: Mapping[str, str] | None = None) -> AgentSettings:
    """The embedded default agent's settings (the file is written on first run)."""
    return load_settings(default_settings_file(data), env)


def coding_flag(path: Path | str) -> Callable[[], bool]:
    """The live coding flag: ``agent.coding`` of the settings file, read afresh.

    Each call stats the file and re-reads it only when its mtime or size
    changed, so asking at every generation costs one stat. A file that became
    bad raises ConfigError naming the key.
    """
    path = Path(path).expanduser().resolve()
    seen: dict[str, Any] = {"stamp": None, "value": True}

    def read() -> bool:
        try:
            st = path.stat()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != seen["stamp"]:
            seen["value"] = load_settings(path, env={}).coding
            seen["stamp"] = stamp
        return seen["value"]

    return read
