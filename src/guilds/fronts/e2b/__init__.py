"""The E2B API in front of the agents one server makes from its templates: ``guilds serve --e2b``
(``pip install 'guilds[e2b]'``).

    front = E2BFront(agents, lock, key_names=("ci",))
    app = front.wrap(app)            # the E2B routes before the locked app
    front.export_lines(base_url)     # the E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL lines; the ports' domain
    front.export_lines(base_url, "guilds.example:8443")  # E2B_DOMAIN instead of the URLs
    await front.close()              # every E2B sandbox killed (the wrapped app's shutdown does it)

One server answers both APIs: the control plane (``control``: ``X-API-KEY``) and
every sandbox's in-sandbox API (``in_sandbox``: ``E2b-Sandbox-Id`` and
``X-Access-Token``). Their requests go to the E2B routes, which check their own
credentials (never the endpoint's token: the key is made from it, ``keys``) and
the Host header as the endpoint lock does; a request to a sandbox's port
(``<port>-<id>.<domain>``, ``ingress``) is proxied into it; everything else goes to
the app behind its lock. Each E2B sandbox is an agent made on demand (``sandboxes``);
with ``shared``, also a row of the run record that every server on it serves (``shared``).
docs/e2b.md says what is served and how it differs from E2B.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from ...errors import ConfigError, GuildsError
from ...limits import SERVE_CANCEL_WAIT_SECONDS
from ...web.endpoint_lock import Lock
from . import unserved
from .control import ControlPlane
from .dropped import TRANSPORT, connection_of
from .forks import Forks
from .in_sandbox import InSandboxApi
from .ingress import Ingress, Refused, answer_refused, domain_of, host_name, target_of
from .keys import Keys
from .recording import recorded
from .sandboxes import Sandboxes
from .shared import SharedRecord
from .snapshot_api import SnapshotApi
from .snapshots import Snapshots
from .template_service import Templates
from .templates_api import TemplatesApi

if TYPE_CHECKING:
    from ...agents.registry import Agents

CLIENT_ID = "guilds"
log = logging.getLogger(__name__)
_PATHS = ("/sandboxes", "/v2/sandboxes", "/files", "/health", *unserved.PATHS)
_PREFIXES = ("/sandboxes/", "/v2/sandboxes/", "/process.Process/", "/filesystem.Filesystem/",
             *(path + "/" for path in unserved.PATHS))


def is_e2b_path(path: str) -> bool:
    """A path of the E2B APIs (none of them is a path of the app or of /mcp)."""
    return path in _PATHS or path.startswith(_PREFIXES)


def sandbox_named(scope: dict) -> str | None:
    """The sandbox id an E2B request names: the in-sandbox API's header, else its path's."""
    named = dict(scope["headers"]).get(b"e2b-sandbox-id")
    if named:
        return named.decode("latin-1")
    parts = scope["path"].split("/")
    at = 2 if parts[1:2] == ["sandboxes"] else 3 if parts[1:3] == ["v2", "sandboxes"] else 0
    return parts[at] if at and len(parts) > at and parts[at] else None


class E2BFront:
    def __init__(self, agents: Agents, lock: Lock, key_names: tuple[str, ...] = (), sleep_idle: int | None = None,
                 *, shared: bool = False):
        """agents: the agents made on demand of the settings' templates, one per E2B sandbox
        (their caps are the sandboxes' caps); key_names: the keys besides ``default``;
        sleep_idle: a process service idle this many seconds sleeps (None: the default; 0: never);
        shared: the sandboxes are every server's on this run record (``shared``, docs/deploy.md)."""
        if lock.token is None:
            raise ConfigError("--e2b: the E2B keys are made from the endpoint's token; serve with the token")
        self.keys = Keys(lock.token, key_names)
        self.hosts = lock.hosts
        self.sandboxes = Sandboxes(agents, CLIENT_ID, sleep_idle,
                                   SharedRecord(agents.store, lock.token) if shared else None)
        forks = Forks(self.sandboxes, Snapshots.open(agents.data_dir))
        self.templates = Templates(self.sandboxes)
        control = ControlPlane(self.sandboxes, self.keys, forks, self.templates.built)
        self.metrics = control.metrics
        snapshot_api = SnapshotApi(control, forks)
        templates_api = TemplatesApi(control, self.templates, control._keyed(snapshot_api.delete))
        routes = [*control.routes(), *templates_api.routes(), *snapshot_api.routes(),
                  *InSandboxApi(self.sandboxes).routes(), *unserved.routes()]
        self.app = Starlette(routes=routes)
        self.ingress = Ingress(self.sandboxes, self.app)

    def wrap(self, app: Callable) -> Callable:
        """An ASGI app: E2B requests (by path) to the E2B routes, the rest to ``app``."""
        async def dispatch(scope: dict, receive: Callable, send: Callable) -> None:
            if scope["type"] == "lifespan":
                await app(scope, self._closing_first(receive), send)
                return
            if scope["type"] in ("http", "websocket") and await self._ingress(scope, receive, send):
                return
            if scope["type"] != "http" or not is_e2b_path(scope["path"]):
                await app(scope, receive, send)
                return
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(host).lower() not in self.hosts:
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                await send({"type": "http.response.body", "body": b"Invalid host header"})
                return
            await self._refreshed(sandbox_named(scope))
            await self.app({**scope, TRANSPORT: connection_of(send)}, receive, send)

        return dispatch

    async def _ingress(self, scope: dict, receive: Callable, send: Callable) -> bool:
        """Whether the request names a sandbox's port (``ingress``); if so, it is answered."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            target = target_of(headers, self.hosts)
        except Refused as refused:
            await answer_refused(send, refused)
            return True
        if target is None:
            return False
        await self._refreshed(target.sandbox_id)
        await self.ingress({**scope, TRANSPORT: connection_of(send)}, receive, send, target)
        return True

    async def _refreshed(self, sandbox_id: str | None) -> None:
        """Shared: the named sandbox as the run record says, before its request (``shared``)."""
        if sandbox_id is None or self.sandboxes.shared is None:
            return
        try:
            await self.sandboxes.refresh(sandbox_id)
        except (GuildsError, OSError) as exc:  # the request then says what is wrong
            log.warning("e2b: sandbox %s not read from the run record: %s", sandbox_id, exc)

    def _closing_first(self, receive: Callable) -> Callable:
        """The lifespan's receive: at the server's start, the sandboxes' sampling begins
        (``sandbox_metrics``); at its shutdown, the E2B sandboxes are killed and their commands' ends
        recorded before the app's own shutdown (the record's last waits)."""
        async def receive_closing() -> dict:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.metrics.start()
            if message["type"] == "lifespan.shutdown":
                await self.close()
            return message

        return receive_closing

    def export_lines(self, base_url: str, domain: str | None = None) -> list[str]:
        """What ``guilds serve --e2b`` prints: the variables an E2B program needs, one key each:
        the two URLs, or with a domain ``E2B_DOMAIN`` alone (the SDKs then reach ``api.<domain>``
        and ``49983-<id>.<domain>`` over HTTPS)."""
        if domain is None:
            self.sandboxes.domain = domain_of(base_url)
            lines = [f"export E2B_API_URL={base_url}", f"export E2B_SANDBOX_URL={base_url}"]
            ports = f"http://<port>-<sandbox id>.{self.sandboxes.domain}/"
        else:
            self.sandboxes.domain = domain
            lines = [f"export E2B_DOMAIN={domain}"]
            ports = f"https://<port>-<sandbox id>.{domain}/"
        for name, key in self.keys.by_name.items():
            prefix = "" if name == "default" else f"# key {name}: "
            lines.append(f"{prefix}export E2B_API_KEY={key}")
        lines.append(f"# a sandbox's port (get_host): {ports}")
        return lines

    async def close(self) -> None:
        """Every E2B sandbox killed, and its commands' ends recorded."""
        await self.metrics.close()
        await self.templates.close()
        await self.sandboxes.close()
        await recorded(SERVE_CANCEL_WAIT_SECONDS)
