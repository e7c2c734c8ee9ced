"""``guilds serve``: one agent's tools, the app at ``/`` and the MCP endpoint at ``/mcp``.

    await serve(guilds.fronts.wiring.resolve(...), host="127.0.0.1", port=8765)

runs until interrupted, on the toolbox the one wiring opens (``guilds.fronts.wiring``):
the run record in SQLite under the data folder (or ``$GUILDS_DATABASE_URL``),
the agent's sandbox by name (``auto`` is bwrap where it works, else local).
``build_app`` makes the same ASGI app without running a server.

The MCP endpoint is ``guilds.fronts.mcp_server.http_endpoint``: its route goes first,
and its lifespan (the SDK's session manager) runs inside this app's.

Both sit behind ``guilds.web.endpoint_lock.EndpointLock``: the token (``<data>/serve.token``,
made on first run) is printed with the URLs once the server listens; the app's URL
starts a login session kept in this process's memory (``guilds.web.sessions``: a
restart ends them all); Host and Origin are checked on every bind. ``no_token`` serves without the token, on a
loopback address only. SIGTERM, SIGINT and SIGHUP stop the server: running
calls are cancelled after SERVE_SHUTDOWN_GRACE_SECONDS (guilds.limits), their commands stopped and
the calls recorded as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from starlette.applications import Starlette

from .. import limits
from ..config.private import private_dir
from ..config.settings import AgentSettings
from ..errors import ConfigError
from ..record.store import Store
from ..toolbox import Toolbox
from ..toolbox.log_reading import log_reading
from ..web.app import create_app
from ..web.endpoint_lock import Lock, host_names, is_loopback, server_token
from ..web.logs import HelperLogReader
from .wiring import Wired, open_toolbox

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
log = logging.getLogger(__name__)


def _lifespan(mcp_lifespan: Callable[[], contextlib.AbstractAsyncContextManager[None]], store: Store):
    """This app's lifespan: the MCP endpoint's session manager runs inside it; at its end,
    the calls cancelled by the shutdown are waited for until they are recorded."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with mcp_lifespan():
                yield
        finally:
            await store.settled(limits.SERVE_CANCEL_WAIT_SECONDS)

    return lifespan


def endpoint_lock(data_dir: Path, host: str, *, no_token: bool = False, allow_hosts: tuple[str, ...] = ()) -> Lock:
    """The lock of a server on ``host``: its token (made on first run) unless ``no_token``,
    which only a loopback address may have; the Host names it answers."""
    if no_token and not is_loopback(host):
        raise ConfigError(f"--no-token: serving on {host} (not a loopback address) needs the token")
    return Lock(None if no_token else server_token(data_dir), host_names(host, allow_hosts))


def build_app(settings: AgentSettings, store: Store, toolbox: Toolbox, *, host: str = DEFAULT_HOST,
              lock: Lock | None) -> Starlette:
    """The whole ASGI app: the MCP endpoint at /mcp, the app at /, behind ``lock``
    (``endpoint_lock``; None: no lock at all, for an app that is not served)."""
    from .mcp_server import http_endpoint  # the MCP SDK: imported only to serve

    mcp = http_endpoint(toolbox, path="/mcp", host=host)
    return create_app(store, redactor=toolbox.redactor, logs=HelperLogReader(log_reading(toolbox)),
                      extra_routes=[mcp.route], lock=lock, lifespan=_lifespan(mcp.lifespan, store))


def base_url(host: str, port: int) -> str:
    """http://HOST:PORT as a client reaches the server (this machine's name for a wildcard bind)."""
    name = socket.gethostname() if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + name + ']' if ':' in name else name}:{port}"


def served_urls(host: str, port: int, token: str | None) -> list[str]:
    """The lines printed once the server listens: the app's URL with its one-time token, /mcp's."""
    base = base_url(host, port)
    if token is None:
        return [f"guilds serve: the app at {base}/ and MCP at {base}/mcp (no token: loopback only)"]
    return [f"guilds serve: the app at {base}/?token={token}",
            f"guilds serve: MCP at {base}/mcp with the header \"Authorization: Bearer {token}\""]


async def _run_server(server, host: str, lock: Lock, more_lines: Callable[[str], list[str]] | None = None) -> None:
    """Run uvicorn; print the URLs once it listens (and ``more_lines(base URL)``); SIGHUP
    stops it as SIGTERM does."""
    previous = signal.signal(signal.SIGHUP, server.handle_exit)
    try:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(limits.SERVE_START_POLL_SECONDS)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            lines = served_urls(host, port, lock.token)
            if more_lines is not None:
                lines += more_lines(base_url(host, port))
            print("\n".join(lines), file=sys.stderr, flush=True)
        await task
    finally:
        signal.signal(signal.SIGHUP, previous)


async def serve(wired: Wired, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, no_token: bool = False,
                allow_hosts: tuple[str, ...] = (), e2b_keys: tuple[str, ...] | None = None) -> None:
    """Serve until a stop signal; ``wired`` from ``guilds.fronts.wiring.resolve``, as for every front.
    ``allow_hosts``: more Host names to answer (the names this machine is reached by);
    ``e2b_keys``: serve the E2B API too (``guilds.fronts.e2b``), with these key names besides the default."""
    import uvicorn

    lock = endpoint_lock(private_dir(wired.data_dir), host, no_token=no_token, allow_hosts=allow_hosts)
    async with open_toolbox(wired) as toolbox:
        app = build_app(wired.settings, toolbox.store, toolbox, host=host, lock=lock)
        e2b = None
        if e2b_keys is not None:
            from .e2b import E2BFront  # the E2B front: imported only when served

            e2b = E2BFront(toolbox, lock, e2b_keys, str(wired.data_dir))
            app = e2b.wrap(app)  # type: ignore[assignment]
        if not is_loopback(host):
            log.warning("serving on %s: whoever has the token runs commands as the agent and reads every "
                        "run; Host names answered: %s", host, ", ".join(lock.hosts))
        config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="info",
                                timeout_graceful_shutdown=limits.SERVE_SHUTDOWN_GRACE_SECONDS)
        await _run_server(uvicorn.Server(config), host, lock, None if e2b is None else e2b.export_lines)
