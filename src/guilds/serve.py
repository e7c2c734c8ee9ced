"""``guilds serve``: one agent's tools, the app at ``/`` and the MCP endpoint at ``/mcp``.

    await serve(guilds.wiring.resolve(...), host="127.0.0.1", port=8765)

runs until interrupted, on the toolbox the one wiring opens (``guilds.wiring``):
the run record in SQLite under the data folder (or ``$GUILDS_DATABASE_URL``),
the agent's sandbox by name (``auto`` is bwrap where it works, else local). ``build_app`` makes the same ASGI app without running a server.

The MCP endpoint is ``guilds.mcp_server.http_endpoint``: its route goes first,
and its lifespan (the SDK's session manager) runs inside this app's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette

from guilds_code.redact import Redactor

from .sandbox import Sandbox
from .settings import AgentSettings
from .store import Store
from .toolbox import Toolbox
from .wiring import Wired, open_toolbox
from .web.app import create_app
from .web.logs import HostLogReader, LogExcerpt, LogReader, LogUnavailable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
HOST_FOLDER_SANDBOXES = ("local", "bwrap")
"""Backends whose home is a folder of this machine, seen inside at the same path."""
log = logging.getLogger(__name__)


class NoLogReader:
    """For a sandbox whose home is not a folder here: logs are not opened from the app yet."""

    def __init__(self, sandbox_name: str):
        self.sandbox_name = sandbox_name

    async def read(self, agent_id: str, path: str) -> LogExcerpt:
        raise LogUnavailable(f"Full output logs in a {self.sandbox_name} sandbox cannot be opened here yet; "
                             f"read {path} with file_read.")


def log_reader(settings: AgentSettings, sandbox: Sandbox) -> LogReader:
    if sandbox.name in HOST_FOLDER_SANDBOXES:
        return HostLogReader({settings.id: sandbox.home}, settings.secret_values())
    return NoLogReader(sandbox.name)


def _lifespan(mcp_lifespan: Callable[[], contextlib.AbstractAsyncContextManager[None]]):
    """This app's lifespan: the MCP endpoint's session manager runs inside it."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp_lifespan():
            yield

    return lifespan


def allowed_hosts(host: str) -> list[str] | None:
    """Served on a loopback address: only loopback Host headers (no DNS rebinding); else any."""
    return ["127.0.0.1", "localhost", "[::1]"] if host in LOCAL_HOSTS else None


def build_app(settings: AgentSettings, store: Store, toolbox: Toolbox, *, host: str = DEFAULT_HOST) -> Starlette:
    """The whole ASGI app: the MCP endpoint at /mcp, the app at /."""
    from .mcp_server import http_endpoint  # the MCP SDK: imported only to serve

    mcp = http_endpoint(toolbox, path="/mcp", host=host)
    return create_app(store, redactor=Redactor(settings.secret_values()), logs=log_reader(settings, toolbox.sandbox),
                      extra_routes=[mcp.route], allowed_hosts=allowed_hosts(host), lifespan=_lifespan(mcp.lifespan))


async def serve(wired: Wired, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve until interrupted; ``wired`` from ``guilds.wiring.resolve``, as for every front."""
    import uvicorn

    async with open_toolbox(wired) as toolbox:
        app = build_app(wired.settings, toolbox.store, toolbox, host=host)
        if allowed_hosts(host) is None:
            log.warning("serving on %s: the app has no login; whoever reaches it sees every run", host)
        config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="info")
        await uvicorn.Server(config).serve()
