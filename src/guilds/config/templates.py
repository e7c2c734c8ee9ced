"""The templates a server serves: what agents made on demand are made from.

```toml
[templates.python]            # a template, named like an agent id
[templates.python.agent]      # every [agent] key but id; home is the starting home,
home = "templates/python"     # copied into each agent made from it
sandbox = "bwrap"
max_tool_calls = 50
[templates.python.secrets]    # and [secrets], [repos], [egress], [docker], [bwrap], [kubernetes],
TOKEN = "..."                 # as in a settings file

[templates.python.pool]       # a warm pool of the template (bwrap, docker, kubernetes' claim mode)
spare = 2                     # agents held ready beyond the demand
max = 20                      # the most the pool holds (0: no pool)
cool_down_seconds = 60        # the pool shrinks only after its target was lower this long
window_seconds = 10           # the makes of the last this many seconds are the demand

[agents]                      # the agents made on demand
max = 100                     # live at once on this server
max_per_owner = 10            # live at once of one owner

[pool]                        # the warm pool of the file's own agent's template (``default``),
spare = 2                     # with the keys of [templates.NAME.pool]
max = 20
```

The settings file's own agent (its top-level tables) is the template named
``default``: a server started as before serves it as before, and agents may be
made from it too; its warm pool is the top-level ``[pool]`` (the E2B front's
``base`` is this template). A template has no ``agent.id`` (each agent made from it gets
an id of its own), and no ``bwrap.uid`` but 0 (each agent gets a uid of its
own). Every key is checked as a settings file's is, its name prefixed by
``templates.NAME.``. ``[templates.NAME.pool]`` is the template's warm pool: agents made
ahead for a template whose sandbox is bwrap, docker or auto (``guilds.agents.pool``); for
one whose sandbox is kubernetes in claim mode, the replicas of its SandboxWarmPool
(``guilds.agents.claim_pools``; then without ``kubernetes.warm`` or ``keep_home``).

An agent made from a template in claim mode has its home in its claimed pod, at the
template's home path (every agent of the template shares one SandboxTemplate): nothing of
it is on this machine (``in_claim_mode``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import limits
from ..errors import ConfigError
from . import checks as check
from .settings import SERVED_KEYS, AgentSettings, SandboxUser, parse_settings, read_toml

DEFAULT_TEMPLATE = "default"
"""The settings file's own agent, served as a template under this name."""
TEMPLATES_KEY, AGENTS_KEY, POOL_TABLE = SERVED_KEYS
"""``pool``: a template's warm pool, and at the top level the default template's."""
_AGENTS_KEYS = ("max", "max_per_owner")
SETTINGS_TABLES = ("agent", "secrets", "repos", "egress", "docker", "bwrap", "kubernetes")
"""A template's tables of a settings file's own; besides them, its ``pool``."""
TEMPLATE_TABLES = (*SETTINGS_TABLES, POOL_TABLE)
POOLED_SANDBOXES = ("bwrap", "docker", "auto")
"""The sandboxes a template with a pool may name (``auto``: pooled where it picks bwrap), besides
kubernetes in claim mode."""
CLAIM_MODE = "claim"


def in_claim_mode(settings: AgentSettings) -> bool:
    """Whether the agent's sandbox is a pod claimed from a warm pool (kubernetes, ``mode = "claim"``):
    its home is that pod's, not a folder of this machine."""
    return settings.sandbox == "kubernetes" and settings.kubernetes.mode == CLAIM_MODE


@dataclass(frozen=True, kw_only=True)
class AgentCaps:
    """[agents]: how many agents made on demand may be live at once."""

    max: int = limits.AGENTS_PER_SERVER
    """On this server, of every owner."""
    max_per_owner: int = limits.AGENTS_PER_OWNER
    """Of one owner."""


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """[templates.NAME.pool]: agents of the template made ahead (``guilds.agents.pool``).

    The pool's target is ``spare`` plus the template's makes of the last
    ``window_seconds``, at most ``max``; it rises at once and falls only when it
    has been lower for ``cool_down_seconds`` (``guilds.agents.demand``)."""

    spare: int = 0
    """Agents held ready beyond the demand."""
    max: int = 0
    """The most the pool holds, ready and being made; 0: no pool."""
    cool_down_seconds: int = limits.POOL_COOL_DOWN_SECONDS_DEFAULT
    window_seconds: int = limits.POOL_WINDOW_SECONDS_DEFAULT

    @property
    def on(self) -> bool:
        return self.max > 0


NO_POOL = PoolSettings()


@dataclass(frozen=True, kw_only=True)
class Template:
    """What an agent is made from: its settings but its id, and a starting home."""

    name: str
    settings: AgentSettings
    """The template's settings; ``settings.home`` is the starting home, ``settings.id`` the name."""
    pool: PoolSettings = NO_POOL

    @property
    def home(self) -> Path:
        """The starting home: each agent made from the template gets a copy."""
        return self.settings.home

    def for_agent(self, agent_id: str, home: Path) -> AgentSettings:
        """The settings of an agent made from this template: its id, its home, and a uid of its
        own (the default template's ``bwrap.uid`` is the file's own agent's alone). In claim mode
        the home is the template's path, in the agent's own pod (``in_claim_mode``)."""
        bwrap = dataclasses.replace(self.settings.bwrap, uid=0)
        home = self.home if in_claim_mode(self.settings) else home
        return dataclasses.replace(self.settings, id=agent_id, home=home, bwrap=bwrap)


@dataclass(frozen=True, kw_only=True)
class Served:
    """The templates a server serves, by name, and the caps on the agents made from them."""

    templates: Mapping[str, Template]
    caps: AgentCaps = AgentCaps()

    def template(self, name: str) -> Template:
        """The template named name; ConfigError, one line naming the templates served."""
        found = self.templates.get(name)
        if found is None:
            raise ConfigError(f"template {name!r}: not served here (served: {', '.join(self.templates)})")
        return found


def _template(name: str, doc: Any, base: Path, env: Mapping[str, str]) -> Template:
    where = f"{TEMPLATES_KEY}.{name}"
    check.name(name, where)
    if name == DEFAULT_TEMPLATE:
        raise ConfigError(f"{where}: reserved: the settings file's own agent is the template {DEFAULT_TEMPLATE!r}")
    doc = check.table(doc, where)
    check.known(doc, where, TEMPLATE_TABLES)
    agent = check.table(doc.get("agent", {}), f"{where}.agent")
    if "id" in agent:
        raise ConfigError(f"{where}.agent.id: a template has no id: each agent made from it gets its own")
    uid = check.table(doc.get("bwrap", {}), f"{where}.bwrap").get("uid", 0)
    if uid != 0:
        raise ConfigError(f"{where}.bwrap.uid: must be 0 in a template: each agent made from it gets a uid of its own")
    tables = {key: value for key, value in doc.items() if key != POOL_TABLE}
    try:
        settings = parse_settings({**tables, "agent": {**agent, "id": name}}, base, env)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}") from None
    return _pooled(name, settings, doc.get(POOL_TABLE, {}), doc.get("kubernetes", {}), f"{where}.{POOL_TABLE}")


def _pooled(name: str, settings: AgentSettings, table: Any, kube: Any, where: str) -> Template:
    """The template of these settings and its pool table (``where``: the table's name): a pool
    only on a sandbox that pools; in claim mode, the settings' warm pool sized by it."""
    pool = _pool(table, where)
    if pool.on and in_claim_mode(settings):
        settings = _sized_by_server(settings, pool, check.table(kube, "kubernetes"), where)
    elif pool.on and settings.sandbox not in POOLED_SANDBOXES:
        raise ConfigError(f"{where}: a warm pool needs agent.sandbox bwrap, docker or auto, or "
                          f"kubernetes with kubernetes.mode \"{CLAIM_MODE}\", got {settings.sandbox!r}")
    return Template(name=name, settings=settings, pool=pool)


def own_pooled(settings: AgentSettings, data: Mapping[str, Any]) -> AgentSettings:
    """The file's own agent as its template (``default``) makes it: in claim mode with a top-level
    [pool], its warm pool sized by the server (the agent's sandbox never sizes it back)."""
    return _pooled(DEFAULT_TEMPLATE, settings, data.get(POOL_TABLE, {}), data.get("kubernetes", {}),
                   POOL_TABLE).settings


def _sized_by_server(settings: AgentSettings, pool: PoolSettings, kube: Mapping[str, Any],
                     where: str) -> AgentSettings:
    """A claim-mode template's settings whose warm pool the pool table (``where``) sizes: made at ``spare``."""
    kube_key = where.removesuffix(POOL_TABLE) + "kubernetes"
    if settings.kubernetes.keep_home:
        raise ConfigError(f"{where}: a warm pool holds sandboxes to claim, and kubernetes.keep_home "
                          "gives each agent a Sandbox of its own instead: leave one out")
    if "warm" in kube:
        raise ConfigError(f"{kube_key}.warm: the template's pool sizes its warm pool ({where}): leave warm out")
    kubernetes = dataclasses.replace(settings.kubernetes, warm=pool.spare, sized_by_server=True)
    return dataclasses.replace(settings, kubernetes=kubernetes)


def _pool(table: Any, where: str) -> PoolSettings:
    """[templates.NAME.pool] (or the top-level [pool]), each key checked; spare at most max."""
    table = check.table(table, where)
    check.known(table, where, ("spare", "max", "cool_down_seconds", "window_seconds"))
    spans = {"spare": (0, limits.POOL_MAX_LIMIT), "max": (0, limits.POOL_MAX_LIMIT),
             "cool_down_seconds": (0, limits.POOL_COOL_DOWN_SECONDS_LIMIT),
             "window_seconds": (1, limits.POOL_WINDOW_SECONDS_LIMIT)}
    pool = PoolSettings(**{key: check.integer(value, f"{where}.{key}", *spans[key]) for key, value in table.items()})
    if pool.spare > pool.max:
        raise ConfigError(f"{where}.spare: must be at most pool.max ({pool.max}), got {pool.spare}")
    return pool


def _caps(table: Any) -> AgentCaps:
    table = check.table(table, AGENTS_KEY)
    check.known(table, AGENTS_KEY, _AGENTS_KEYS)
    return AgentCaps(**{key: check.integer(value, f"{AGENTS_KEY}.{key}", 1, limits.AGENTS_PER_SERVER_LIMIT)
                        for key, value in table.items()})


def _pools_within(templates: Mapping[str, Template], caps: AgentCaps) -> None:
    """A pool's max at most agents.max: the server's cap counts the pooled agents."""
    for template in templates.values():
        if template.pool.max > caps.max:
            where = POOL_TABLE if template.name == DEFAULT_TEMPLATE else f"{TEMPLATES_KEY}.{template.name}.{POOL_TABLE}"
            raise ConfigError(f"{where}.max: must be at most agents.max ({caps.max}), got {template.pool.max}")


def parse_served(data: Mapping[str, Any], base: Path, env: Mapping[str, str], default: AgentSettings) -> Served:
    """The templates and caps of a parsed settings document whose own agent is ``default``
    (every front checks them when it reads the file: ``guilds.fronts.wiring.resolve``)."""
    named = check.table(data.get(TEMPLATES_KEY, {}), TEMPLATES_KEY)
    templates = {DEFAULT_TEMPLATE: _pooled(DEFAULT_TEMPLATE, default, data.get(POOL_TABLE, {}),
                                           data.get("kubernetes", {}), POOL_TABLE)}
    templates.update({name: _template(name, doc, base, env) for name, doc in named.items()})
    caps = _caps(data.get(AGENTS_KEY, {}))
    _pools_within(templates, caps)
    return Served(templates=templates, caps=caps)


def with_user(served: Served, user: SandboxUser) -> Served:
    """served with every template's agents being user inside (``AgentSettings.user``), but a
    template that names a user of its own."""
    def named(t: Template) -> Template:
        return t if t.settings.user is not None else dataclasses.replace(
            t, settings=dataclasses.replace(t.settings, user=user))
    return dataclasses.replace(served, templates={name: named(t) for name, t in served.templates.items()})


def served_by(settings: AgentSettings, settings_file: Path | None, env: Mapping[str, str]) -> Served:
    """What a server of these settings serves: the file's templates, or (settings given as an
    object) only ``settings`` as the default template. ConfigError names a bad key."""
    if settings_file is None:
        return Served(templates={DEFAULT_TEMPLATE: Template(name=DEFAULT_TEMPLATE, settings=settings)})
    path = Path(settings_file)
    return parse_served(read_toml(path), path.parent, env, settings)
