"""``guilds serve``: one agent's tools, the app at ``/`` and the MCP endpoint at ``/mcp``.

    await serve(settings, data_dir, host="127.0.0.1", port=8765, sandbox=None)

runs until interrupted, on the embedded default: the run record in SQLite under
the data folder (or ``$GUILDS_DATABASE_URL``), the agent's sandbox by name
(``sandbox`` overrides ``agent.sandbox``; ``auto`` is bwrap where it works,
else local). ``build_app`` makes the same ASGI app without running a server.

The MCP endpoint is ``guilds.mcp_server.http_endpoint``: its route goes first,
and its lifespan (the SDK's session manager) runs inside this app's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path

from starlette.applications import Starlette

from guilds_code.redact import Redactor

from .sandbox import get_sandbox
from .settings import AgentSettings
from .store import Store, database_url
from .toolbox import Toolbox
from .toolbox.log_read import log_reading
from .web.app import create_app
from .web.logs import HelperLogReader

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
log = logging.getLogger(__name__)


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
    return create_app(store, redactor=Redactor(settings.secret_values()), logs=HelperLogReader(log_reading(toolbox)),
                      extra_routes=[mcp.route], allowed_hosts=allowed_hosts(host), lifespan=_lifespan(mcp.lifespan))


async def serve(settings: AgentSettings, data_dir: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                sandbox: str | None = None, *, coding: Callable[[], bool] | None = None,
                env: Mapping[str, str] | None = None) -> None:
    """Serve until interrupted. ``coding``: the live coding flag (``settings.coding_flag(file)``)."""
    import uvicorn

    if sandbox is not None:
        settings = replace(settings, sandbox=sandbox)
    data_dir = Path(data_dir)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    box = get_sandbox(settings, data_dir)
    async with Store(database_url(data_dir, os.environ if env is None else env)) as store:
        toolbox = Toolbox(settings, box, store, coding=coding)
        app = build_app(settings, store, toolbox, host=host)
        if allowed_hosts(host) is None:
            log.warning("serving on %s: the app has no login; whoever reaches it sees every run", host)
        config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="info")
        await uvicorn.Server(config).serve()
