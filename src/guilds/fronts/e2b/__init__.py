"""The E2B API in front of one agent: ``guilds serve --e2b`` (``pip install 'guilds[e2b]'``).

    front = E2BFront(toolbox, lock, key_names=("ci",))
    app = front.wrap(app)            # the E2B routes before the locked app
    front.export_lines(base_url)     # the E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL lines
    await front.close()              # every E2B sandbox killed (the wrapped app's shutdown does it)

One server answers both APIs: the control plane (``control``: ``X-API-KEY``) and
every sandbox's in-sandbox API (``in_sandbox``: ``E2b-Sandbox-Id`` and
``X-Access-Token``). Their requests go to the E2B routes, which check their own
credentials (never the endpoint's token: the key is made from it, ``keys``) and
the Host header as the endpoint lock does; everything else goes to the app
behind its lock. docs/e2b.md says what is served and how it differs from E2B.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette

from ...errors import ConfigError
from ...limits import SERVE_CANCEL_WAIT_SECONDS
from ...toolbox import Toolbox
from ...web.endpoint_lock import Lock
from .control import ControlPlane
from .in_sandbox import InSandboxApi
from .keys import Keys
from .process_api import recorded
from .sandboxes import Sandboxes

CLIENT_ID = "guilds"
_PATHS = ("/sandboxes", "/v2/sandboxes", "/files", "/health")
_PREFIXES = ("/sandboxes/", "/v2/sandboxes/", "/process.Process/", "/filesystem.Filesystem/")


def is_e2b_path(path: str) -> bool:
    """A path of the E2B APIs (none of them is a path of the app or of /mcp)."""
    return path in _PATHS or path.startswith(_PREFIXES)


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class E2BFront:
    def __init__(self, toolbox: Toolbox, lock: Lock, key_names: tuple[str, ...] = (), data_dir: str | None = None):
        """data_dir: the data folder (an E2B sandbox asking for less network than the agent's gets a
        sandbox of its own there; without it, such a create is refused)."""
        if lock.token is None:
            raise ConfigError("--e2b: the E2B keys are made from the endpoint's token; serve with the token")
        self.keys = Keys(lock.token, key_names)
        self.hosts = lock.hosts
        self.sandboxes = Sandboxes(toolbox, CLIENT_ID, data_dir)
        routes = ControlPlane(self.sandboxes, self.keys).routes() + InSandboxApi(self.sandboxes).routes()
        self.app = Starlette(routes=routes)

    def wrap(self, app: Callable) -> Callable:
        """An ASGI app: E2B requests (by path) to the E2B routes, the rest to ``app``."""
        async def dispatch(scope: dict, receive: Callable, send: Callable) -> None:
            if scope["type"] == "lifespan":
                await app(scope, self._closing_first(receive), send)
                return
            if scope["type"] != "http" or not is_e2b_path(scope["path"]):
                await app(scope, receive, send)
                return
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if _host_name(host).lower() not in self.hosts:
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                await send({"type": "http.response.body", "body": b"Invalid host header"})
                return
            await self.app(scope, receive, send)

        return dispatch

    def _closing_first(self, receive: Callable) -> Callable:
        """The lifespan's receive: at the server's shutdown, the E2B sandboxes are killed and
        their commands' ends recorded before the app's own shutdown (the record's last waits)."""
        async def receive_closing() -> dict:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.close()
            return message

        return receive_closing

    def export_lines(self, base_url: str) -> list[str]:
        """What ``guilds serve --e2b`` prints: the variables an E2B program needs, one key each."""
        lines = [f"export E2B_API_URL={base_url}", f"export E2B_SANDBOX_URL={base_url}"]
        for name, key in self.keys.by_name.items():
            prefix = "" if name == "default" else f"# key {name}: "
            lines.append(f"{prefix}export E2B_API_KEY={key}")
        return lines

    async def close(self) -> None:
        """Every E2B sandbox killed, and its commands' ends recorded."""
        await self.sandboxes.close()
        await recorded(SERVE_CANCEL_WAIT_SECONDS)
