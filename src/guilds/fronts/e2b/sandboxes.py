"""The E2B sandboxes one ``guilds serve --e2b`` holds: each an agent made on demand.

Every ``Sandbox.create()`` makes an agent (``guilds.agents.registry``) of the
template it names (``guilds.config.templates``): ``base``, E2B's default, and the
server's own agent's id name the default template (the settings file's own
agent); any other template the settings serve is named by its name. The agent is
owned by ``e2b:<key name>`` and shares nothing with another sandbox: its own home
(a copy of the template's), its own guilds sandbox and uid, and its own egress
proxy when its network is a list. A create that asks for less network than the
template gives makes an agent whose network is narrowed (``network_options``).
Each has one ``guilds-code envd`` of its own (its commands, its environment
variables), and its requests are the calls of its run ``e2b-<sandbox id>``
(``guilds.fronts.e2b.recording``). It belongs to the key that created it.

Lifetime: ``timeout`` seconds from its start, or from the last ``set_timeout`` or
connect (a connect only lengthens it); then it is killed as by ``DELETE
/sandboxes/{id}``: its commands ended, its agent removed with everything of it.
The agent's row in the run record carries that end as its expiry, kept up to
date, and none while it is paused. Pause ends its commands and keeps its files;
resume (connect) starts its process service again. The server's stop kills
every sandbox; its start removes the agents of E2B sandboxes a stopped server
left (``remove_left``): no server serves them again.

Caps: the agents' own (``[agents]`` of the settings), counted once, in the run
record, as the agent is made: ``max_per_owner`` for what one key holds (its
owner), ``max`` for what the server holds. Past either, nothing is made and the
create is refused with ``resource_exhausted`` (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from guilds_code.limits import ENVD_SLEEP_IDLE_SECONDS

from ...config.settings import AgentSettings
from ...config.templates import DEFAULT_TEMPLATE
from ...egress.rules import RuleSet
from ...errors import BadInput, GuildsError, SandboxError
from ...limits import E2B_ENVD_VERSION
from ...record.agent_rows import AgentRecord, AgentRefused
from ...sandbox import Backend, Sandbox, backend_of
from ...toolbox import Toolbox
from .connect import ConnectError
from .envd_channel import EnvdChannel
from .ingress_options import PUBLIC, Ingress
from .lifecycle import KILLED_AT_TIMEOUT, Lifecycle
from .network_options import Entries, narrowing, network_reported
from .recording import Recorder
from .shared import SharedRecord, lifecycle_of, network_of

if TYPE_CHECKING:
    from ...agents.registry import Agents

log = logging.getLogger(__name__)
T = TypeVar("T")
RUNNING, PAUSED = "running", "paused"
OWNER_PREFIX = "e2b:"
"""The owner of an agent made for an E2B sandbox: this, then the key's name."""
BASE_TEMPLATE = "base"
"""E2B's default template id: the default template here."""


@dataclass
class E2BSandbox:
    id: str
    key_name: str
    template: str
    """The template id it was created with (``base``, or a template's name)."""
    metadata: dict[str, str]
    env_vars: dict[str, str]
    access_token: str
    started_at: datetime
    end_at: datetime
    agent: Toolbox
    """Its agent's toolbox: its settings, its sandbox, its record."""
    network: Entries = None
    """The network it asked for (``network_options.asked``): None, the template's."""
    rules: RuleSet = field(default_factory=dict, repr=False)
    """The header rules it asked for (``network_rules.asked``): values held by its proxy only."""
    lifecycle: Lifecycle = KILLED_AT_TIMEOUT
    """What it does at its timeout (``lifecycle.asked``): killed, unless it pauses then."""
    ingress: Ingress = PUBLIC
    """Who reaches its ports from outside, and the Host they see (``ingress_options``)."""
    state: str = RUNNING
    envd: EnvdChannel | None = None
    timer: asyncio.TimerHandle | None = None
    recorder: Recorder | None = field(default=None, repr=False)
    changing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """Held while it pauses or resumes: one change at a time."""

    @property
    def sandbox(self) -> Sandbox:
        """The guilds sandbox its commands run in: its agent's."""
        return self.agent.sandbox

    @property
    def agent_id(self) -> str:
        return self.agent.settings.id

    @property
    def run_id(self) -> str:
        return f"e2b-{self.id}"

    def created(self, client_id: str, domain: str | None = None) -> dict[str, Any]:
        """The Sandbox body of a create or connect answer; domain: where its ports are served
        (``get_host``: ``<port>-<id>.<domain>``)."""
        return {"sandboxID": self.id, "templateID": self.template, "clientID": client_id,
                "envdVersion": E2B_ENVD_VERSION, "envdAccessToken": self.access_token, "domain": domain,
                "trafficAccessToken": self.ingress.traffic_token}

    def listed(self, client_id: str) -> dict[str, Any]:
        """The ListedSandbox / SandboxDetail body."""
        return {"sandboxID": self.id, "templateID": self.template, "alias": self.template, "clientID": client_id,
                "startedAt": _iso(self.started_at), "endAt": _iso(self.end_at), "cpuCount": 1, "memoryMB": 512,
                "diskSizeMB": 1024, "state": self.state, "envdVersion": E2B_ENVD_VERSION,
                "metadata": self.metadata, "envdAccessToken": self.access_token,
                **({} if self.network is None else {"network": network_reported(self.network)})}


@dataclass(frozen=True)
class Made:
    """What a sandbox was asked to be, for ``Sandboxes.adopt``."""

    key_name: str
    template_id: str
    timeout: int
    metadata: dict[str, str]
    env_vars: dict[str, str]
    network: Entries
    started: datetime
    lifecycle: Lifecycle = KILLED_AT_TIMEOUT
    ingress: Ingress = PUBLIC
    rules: RuleSet = field(default_factory=dict, repr=False)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class Sandboxes:
    """Every E2B sandbox of this server, by id; each request names its key."""

    def __init__(self, agents: Agents, client_id: str, sleep_idle: int | None = None,
                 shared: SharedRecord | None = None):
        """agents: the agents made on demand of the settings' templates, one per sandbox;
        sleep_idle: their process services' (``EnvdChannel.open``; None: its default);
        shared: the sandboxes are in the record for every server on it (``shared``)."""
        self.agents, self.client_id, self.shared = agents, client_id, shared
        self._taking_up = asyncio.Lock()
        self.domain: str | None = None
        """Where the sandboxes' ports are served (``ingress``), once the server listens."""
        self.sleep_idle = ENVD_SLEEP_IDLE_SECONDS if sleep_idle is None else sleep_idle
        self._all: dict[str, E2BSandbox] = {}
        self._ahead: dict[str, EnvdChannel] = {}
        """Process services started ahead in the warm pools' agents, by agent id (``envd_ahead``)."""
        keep_within = self.sleep_idle / 2 if self.sleep_idle else None
        agents.pools.prepare_with(self.envd_ahead, keep_within=keep_within)
        self._backends: dict[str, type[Backend]] = {}
        self._creating: set[asyncio.Future[Any]] = set()
        """Creates under way: each runs to its end even when its client goes, and the server's
        stop waits for them (``close``)."""
        self._closing = False
        self._ending: set[asyncio.Future[None]] = set()

    @property
    def _default(self) -> AgentSettings:
        return self.agents.served.template(DEFAULT_TEMPLATE).settings

    def templates(self) -> tuple[str, ...]:
        """The template ids served: ``base`` and the server's own agent's id (both the default
        template, unless the settings name a template so), then each named template."""
        named = tuple(name for name in self.agents.served.templates if name != DEFAULT_TEMPLATE)
        return *(a for a in (BASE_TEMPLATE, self._default.id) if a not in named), *named

    def template_of(self, template_id: str) -> str:
        """The template a template id names; ``not_found`` naming those served."""
        if template_id != DEFAULT_TEMPLATE and template_id in self.agents.served.templates:
            return template_id
        if template_id in (BASE_TEMPLATE, self._default.id):
            return DEFAULT_TEMPLATE
        raise ConnectError("not_found", f"template '{template_id}' not found: this server serves "
                                        f"{' and '.join(repr(t) for t in self.templates())}")

    def settings_for(self, template_id: str) -> AgentSettings:
        """The settings of the template a template id names (``not_found`` for none)."""
        return self.agents.served.template(self.template_of(template_id)).settings

    def backend_for(self, template: str) -> type[Backend]:
        """The backend the template's agents run on (``auto`` resolved once)."""
        return self._backend(template)

    def _backend(self, template: str) -> type[Backend]:
        """The backend the template's agents run on (``auto`` resolved once)."""
        if template not in self._backends:
            self._backends[template] = backend_of(self.agents.served.template(template).settings)
        return self._backends[template]

    async def remove_left(self) -> list[str]:
        """The agents of E2B sandboxes that a stopped server left, removed (no server serves
        them again: their access tokens were its own); their ids. Shared, none: the others
        serve them."""
        if self.shared is not None:
            return []
        left = [a.id for a in await self.agents.live() if a.owner.startswith(OWNER_PREFIX)]
        ends = await asyncio.gather(*map(self._remove_agent, left), return_exceptions=True)
        for agent_id, failed in zip(left, ends, strict=True):
            if isinstance(failed, BaseException):  # tried again at the next start, or by the reaper once expired
                log.warning("e2b: agent %s, left by a stopped server, not removed: %s", agent_id, failed)
        return left

    async def create(self, key_name: str, template_id: str, timeout: int, metadata: dict[str, str],
                     env_vars: dict[str, str], network: Entries = None,
                     lifecycle: Lifecycle = KILLED_AT_TIMEOUT, ingress: Ingress = PUBLIC,
                     rules: RuleSet | None = None) -> E2BSandbox:
        """A new sandbox: its agent made (within the caps, else ``resource_exhausted``), then its
        process service started; a failure leaves nothing of it. It is made to its end even
        when the request is cancelled (a client gone, the server stopping: ``close`` kills it)."""
        asked = Made(key_name, template_id, timeout, metadata, env_vars, network, datetime.now(UTC), lifecycle,
                     ingress, dict(rules or {}))
        return await self.under_way(self._create(asked))

    async def under_way(self, making: Coroutine[Any, Any, T]) -> T:
        """What making makes (sandboxes), made to its end even when the request is cancelled;
        the server's stop waits for it (``close``). ``unavailable`` once the server stops."""
        if self._closing:
            making.close()
            raise ConnectError("unavailable", "the server is stopping: no sandbox is made")
        made = asyncio.ensure_future(making)
        self._creating.add(made)
        made.add_done_callback(self._created)
        return await asyncio.shield(made)

    def _created(self, made: asyncio.Future[Any]) -> None:
        self._creating.discard(made)
        if not made.cancelled():
            made.exception()  # told to the request, if it still waits; else it is nobody's

    async def _create(self, asked: Made) -> E2BSandbox:
        template = self.template_of(asked.template_id)
        adjust = narrowing(asked.network, self.agents.served.template(template).settings, self._backend(template),
                           asked.rules)
        try:
            made = await self.agents.make(template, owner=f"{OWNER_PREFIX}{asked.key_name}",
                                          expires_in=asked.timeout or None, adjust=adjust)
        except AgentRefused as exc:
            raise ConnectError("resource_exhausted", f"sandbox limit reached: {exc}") from None
        return await self.adopt(made, asked)

    async def adopt(self, made: AgentRecord, asked: Made) -> E2BSandbox:
        """A sandbox of an agent made for it (by a create, a fork, a create from a snapshot):
        its process service started, its timer armed. A failure removes the agent."""
        try:
            toolbox = await self.agents.toolbox(made.id)
            box_id = "i" + secrets.token_hex(10)
            token = secrets.token_urlsafe(32) if self.shared is None else self.shared.access_token(box_id)
            box = E2BSandbox(id=box_id, key_name=asked.key_name, template=asked.template_id,
                             metadata=asked.metadata, env_vars=asked.env_vars, access_token=token,
                             started_at=asked.started,
                             end_at=made.expires_at or asked.started + timedelta(seconds=asked.timeout),
                             agent=toolbox, network=asked.network, rules=asked.rules, lifecycle=asked.lifecycle,
                             ingress=asked.ingress.renewed())
            box.recorder = Recorder(toolbox, box.run_id)
            box.envd = await self.open_envd(made.id, toolbox.sandbox)
            if self.shared is not None:
                await self.shared.put(box)
        except BaseException:
            with contextlib.suppress(GuildsError, OSError):  # the first failure is the one to tell
                await asyncio.shield(self._remove_agent(made.id))
            raise
        self._all[box.id] = box
        self._arm(box)
        return box

    async def envd_ahead(self, toolbox: Toolbox) -> None:
        """The warm pools' hook (``Pools.prepare_with``): a pooled agent's process service
        started before a create takes the agent, so that its first command starts nothing;
        run again while the agent waits in the pool, a request that holds off its sleep."""
        self._ahead = {agent_id: envd for agent_id, envd in self._ahead.items() if not envd.closed}
        ahead = self._ahead.get(toolbox.settings.id)
        if ahead is not None:
            try:
                await ahead.call("list")
                return
            except ConnectError as exc:  # it ended: the pool removes an agent whose hook fails
                self._ahead.pop(toolbox.settings.id, None)
                raise SandboxError(f"its process service ended: {exc}") from None
        self._ahead[toolbox.settings.id] = await EnvdChannel.open(toolbox.sandbox, self.sleep_idle)

    async def open_envd(self, agent_id: str, sandbox: Sandbox) -> EnvdChannel:
        """A new sandbox's process service: the one started ahead in its agent (pooled) while
        it still runs, else started now (its sandbox started by the make)."""
        ahead = self._ahead.pop(agent_id, None)
        if ahead is not None and not ahead.closed:
            return ahead
        return await EnvdChannel.open(sandbox, self.sleep_idle)

    def get(self, key_name: str | None, sandbox_id: str) -> E2BSandbox:
        """The sandbox of that id when that key made it; else not_found, as for no sandbox at all."""
        box = self._all.get(sandbox_id)
        if box is None or (key_name is not None and box.key_name != key_name):
            raise ConnectError("not_found", f"sandbox '{sandbox_id}' not found")
        return box

    def of_key(self, key_name: str) -> list[E2BSandbox]:
        return [box for box in self._all.values() if box.key_name == key_name]

    def every(self) -> list[E2BSandbox]:
        """Every sandbox of the server, whatever its key."""
        return list(self._all.values())

    async def set_timeout(self, box: E2BSandbox, seconds: int) -> None:
        """It ends seconds from now: its timer, and its agent's expiry in the record."""
        box.end_at = datetime.now(UTC) + timedelta(seconds=seconds)
        self._arm(box)
        await self.agents.store.expire_agent(box.agent_id, box.end_at)
        if self.shared is not None:
            await self.shared.changed(box)

    def _arm(self, box: E2BSandbox) -> None:
        """Its timer set to kill it at its end (or pause it, when its lifecycle says so)."""
        if box.timer is not None:
            box.timer.cancel()
        delay = (box.end_at - datetime.now(UTC)).total_seconds()
        box.timer = asyncio.get_running_loop().call_later(max(delay, 0), self._timed_out, box)

    def _timed_out(self, box: E2BSandbox) -> None:
        ending = asyncio.ensure_future(self._at_end(box))
        self._ending.add(ending)  # held until it ends: the loop keeps only a weak reference
        ending.add_done_callback(self._ending.discard)

    async def _at_end(self, box: E2BSandbox) -> None:
        """Its timeout: killed, or paused when its lifecycle says so. Shared, its row read
        first: an end moved elsewhere re-arms the timer, a row gone forgets it here."""
        if self.shared is not None and not await self.shared.due(box):
            if box.id in self._all and await self.shared.found(box.id) is not None:
                self._arm(box)
            else:
                await self._forget(box)
            return
        await (self._pause_at_timeout(box) if box.lifecycle.pause_at_timeout else self.kill(box))

    async def _pause_at_timeout(self, box: E2BSandbox) -> None:
        with contextlib.suppress(ConnectError):  # killed, or paused, meanwhile
            await self.pause(box, keep_memory=box.lifecycle.keep_memory)

    async def kill(self, box: E2BSandbox) -> None:
        """Forget it and retire its agent (``Agents.retire``): answered once its sandbox is
        stopped, every process of it ended; its files are removed after. Where the sandbox
        does not isolate its processes (``local``), its commands' groups get SIGTERM, then
        SIGKILL, first."""
        if self._all.pop(box.id, None) is None:
            return
        if box.timer is not None:
            box.timer.cancel()
        if self.shared is not None:  # not_found on every server from now
            await self.shared.gone(box.id)
        async with box.changing:  # a pause or resume under way ends first
            if box.sandbox.isolates:  # the sandbox's stop ends the process service and its commands
                self._drop_envd(box)
            else:
                await self._stop_envd(box)
            with contextlib.suppress(BadInput):  # already removed (the reaper's round came first)
                await self.agents.retire(box.agent_id)

    async def _remove_agent(self, agent_id: str) -> None:
        with contextlib.suppress(BadInput):  # already removed (the reaper's round came first)
            await self.agents.remove(agent_id)

    def _drop_envd(self, box: E2BSandbox) -> None:
        envd, box.envd = box.envd, None
        if envd is not None:
            envd.ending = True

    async def pause(self, box: E2BSandbox, *, keep_memory: bool = True) -> None:
        """Its commands ended, its files kept. Filesystem-only (not keep_memory), on a backend
        whose sandbox boots on its own (``own_boot_id``), the sandbox itself is stopped too:
        its resume is a cold boot (a new boot id, an empty /tmp)."""
        async with box.changing:
            self._still_there(box)
            if box.state == PAUSED:
                raise ConnectError("failed_precondition", f"sandbox '{box.id}' is already paused")
            if box.timer is not None:  # a paused sandbox waits to be resumed, as E2B's does
                box.timer.cancel()
            await self._stop_envd(box)
            if not keep_memory and box.sandbox.own_boot_id:
                await box.sandbox.stop()
            box.state = PAUSED
            await self.agents.store.expire_agent(box.agent_id, None)
            if self.shared is not None:
                await self.shared.changed(box)

    async def resume(self, box: E2BSandbox, timeout: int) -> bool:
        """Running again, for timeout seconds from now; True when it was paused. Connects that
        come together resume it once: one process service, the others wait for it."""
        async with box.changing:
            self._still_there(box)
            was_paused = box.state == PAUSED
            if was_paused:
                await box.sandbox.start()  # stopped while it was paused, when idle long enough
                box.envd, box.state = await EnvdChannel.open(box.sandbox, self.sleep_idle), RUNNING
            if was_paused or datetime.now(UTC) + timedelta(seconds=timeout) > box.end_at:
                await self.set_timeout(box, timeout)  # a connect never shortens a running sandbox's life
            return was_paused

    async def awake(self, box: E2BSandbox) -> None:
        """A request reaches box: paused, and its create asked for auto-resume, it is resumed
        first, with a fresh timeout of its create's (E2B's); otherwise it stays as it is."""
        if box.state == PAUSED and box.lifecycle.auto_resume:
            await self.resume(box, box.lifecycle.resume_seconds)

    def _still_there(self, box: E2BSandbox) -> None:
        """not_found for a sandbox killed while a change waited for its turn."""
        if box.id not in self._all:
            raise ConnectError("not_found", f"sandbox '{box.id}' not found")

    async def _stop_envd(self, box: E2BSandbox) -> None:
        envd, box.envd = box.envd, None
        if envd is None:
            return
        envd.ending = True
        with contextlib.suppress(ConnectError):
            await envd.call("stop_all")
        await envd.close()

    async def close(self) -> None:
        """The server stops: the creates under way end, then every sandbox is killed, all at once."""
        self._closing = True
        if self._creating:
            await asyncio.wait(set(self._creating))
        if self.shared is not None:  # they live on, served by the other servers
            await asyncio.gather(*map(self._forget, list(self._all.values())), return_exceptions=True)
        boxes = list(self._all.values())
        ends = await asyncio.gather(*map(self.kill, boxes), return_exceptions=True)
        for box, failed in zip(boxes, ends, strict=True):
            if isinstance(failed, BaseException):
                log.warning("e2b: sandbox %s: its agent %s not removed: %s", box.id, box.agent_id, failed)
        if self._ending:  # those that timed out just before, ending still
            await asyncio.wait(set(self._ending))
        ahead, self._ahead = list(self._ahead.values()), {}
        await asyncio.gather(*(envd.close() for envd in ahead), return_exceptions=True)

    # --- shared with the other servers of the record (``shared``) ---------------------------
    async def refresh(self, sandbox_id: str) -> None:
        """Before a request naming the sandbox: as its row says (``shared``): taken up
        here, brought up to date, or forgotten here."""
        if self.shared is None:
            return
        found = await self.shared.found(sandbox_id)
        box = self._all.get(sandbox_id)
        if found is None:
            if box is not None:
                await self._forget(box)
        elif box is None:
            async with self._taking_up:
                if sandbox_id not in self._all and not self._closing:
                    await self._take_up(found)
        else:
            await self._follow(box, found)

    async def refresh_key(self, key_name: str) -> None:
        """Before a listing (``shared``): every sandbox of the key its rows hold, taken up
        here, and none that no row holds any more."""
        if self.shared is None:
            return
        rows = {found["id"]: found for found in await self.shared.of_key(key_name)}
        for box in self.of_key(key_name):
            if box.id not in rows:
                await self._forget(box)
        for sandbox_id, found in rows.items():
            async with self._taking_up:
                if sandbox_id not in self._all and not self._closing:
                    await self._take_up(found)

    async def _take_up(self, found: dict[str, Any]) -> None:
        """A sandbox another server made, served here too: its agent's toolbox, a process
        service of this server's own when it runs, its timer. Its agent gone: its row too."""
        shared = self.shared
        if shared is None:
            return
        try:
            toolbox = await self.agents.toolbox(found["agent_id"])
        except BadInput:
            await shared.gone(found["id"])
            return
        box = E2BSandbox(id=found["id"], key_name=found["key_name"], template=found["template"],
                         metadata=found["metadata"], env_vars=found["env_vars"],
                         access_token=shared.access_token(found["id"]), started_at=found["started_at"],
                         end_at=found["end_at"], agent=toolbox, network=network_of(found),
                         lifecycle=lifecycle_of(found), state=found["state"])
        box.recorder = Recorder(toolbox, box.run_id)
        if box.state == RUNNING:
            await toolbox.sandbox.start()  # found, or started again, by this process
            box.envd = await EnvdChannel.open(toolbox.sandbox, self.sleep_idle)
            self._arm(box)
        self._all[box.id] = box

    async def _follow(self, box: E2BSandbox, found: dict[str, Any]) -> None:
        """A sandbox held here, as its row says now: its end, paused or running."""
        async with box.changing:
            box.end_at = found["end_at"]
            if found["state"] == PAUSED and box.state == RUNNING:
                if box.timer is not None:
                    box.timer.cancel()
                await self._stop_envd(box)
                box.state = PAUSED
            elif found["state"] == RUNNING and box.state == PAUSED:
                await box.sandbox.start()
                box.envd, box.state = await EnvdChannel.open(box.sandbox, self.sleep_idle), RUNNING
            if box.state == RUNNING:
                self._arm(box)

    async def _forget(self, box: E2BSandbox) -> None:
        """No longer held here: its timer and this server's process service ended."""
        if self._all.pop(box.id, None) is None:
            return
        if box.timer is not None:
            box.timer.cancel()
        with contextlib.suppress(GuildsError, OSError):
            await self._stop_envd(box)
