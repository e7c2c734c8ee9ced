"""``guilds serve``: one agent's tools, the app at ``/`` and the MCP endpoint at ``/mcp``.

    await serve(guilds.fronts.wiring.resolve(...), host="127.0.0.1", port=8765)

runs until interrupted, on the toolbox the one wiring opens (``guilds.fronts.wiring``):
the run record in SQLite under the data folder (or ``$GUILDS_DATABASE_URL``),
the agent's sandbox by name (``auto`` is bwrap where it works, else local).
``build_app`` makes the same ASGI app without running a server.

The MCP endpoint is ``guilds.fronts.mcp_server.http_endpoint``: its route goes first,
and its lifespan (the SDK's session manager) runs inside this app's.

``/healthz`` and ``/readyz`` answer an orchestrator's probes before the lock
(``guilds.web.health``; ready: the run record answers); with ``$GUILDS_ADVERTISE_URL``
the server says in the record where it answers ``/healthz?owner=``, so the other
servers find a call of it lost as soon as it ended (``guilds.record.liveness``). ``/metrics`` holds the server's
Prometheus metrics (``guilds.observe.metrics``, one registry
per server); every call and sandbox start is a line on the ``guilds.calls`` logger.

All sit behind ``guilds.web.endpoint_lock.EndpointLock``: the token (``<data>/serve.token``,
made on first run) is printed with the URLs once the server listens; the app's URL
starts a login session kept in the run record (``guilds.web.sessions``: a restart or
another server on the record keeps it; a new token ends it); Host and Origin are checked
on every bind. ``no_token`` serves without the token, on a loopback address only.
SIGTERM, SIGINT and SIGHUP stop the server (``Stopping``): running
calls are cancelled after SERVE_SHUTDOWN_GRACE_SECONDS (guilds.limits), their commands stopped and
the calls recorded as cancelled; then the reaper stops, the warm pools' agents are removed,
the resident helpers end and the record is closed (this process's entry in it removed),
and ``serve`` returns the signal's number. The agents made on demand of the settings'
templates whose expiry has passed are removed at the start and every
AGENT_REAP_SECONDS while the server runs (``agents_reaped``); the templates' warm
pools (``guilds.agents.pool``) run from the start, once the fronts are made,
and their agents are removed as the app's lifespan ends. Serving E2B, every template's
agents are E2B's user inside (``settings.E2B_USER``: /home/user, ``user``, ``sudo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette

from guilds_code.redact import Redactor

from .. import limits
from ..config.private import private_dir
from ..config.settings import E2B_USER, AgentSettings, SandboxUser
from ..errors import ConfigError
from ..observe.metrics import Metrics, metrics_route
from ..observe.trace_context import http_carried
from ..observe.traces import traces_from_env
from ..record.store import Store
from ..toolbox import Toolbox
from ..toolbox.app_rewind import app_rewinder
from ..toolbox.log_reading import log_reading
from ..web.agents_view import ServingAgent
from ..web.app import create_app
from ..web.endpoint_lock import Lock, host_names, is_loopback, server_token
from ..web.health import with_health
from ..web.logs import HelperLogReader
from .serve_options import E2BServing, Tls
from .wiring import Wired, open_toolbox

if TYPE_CHECKING:
    from ..agents.registry import Agents

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
log = logging.getLogger(__name__)
ADVERTISE_ENV = "GUILDS_ADVERTISE_URL"
"""Where the other servers on the run record reach this one (a replica's ``http://POD_IP:port``):
they ask it whether it still runs (``guilds.record.liveness``) and find its calls lost at once
once it ended."""


def _lifespan(mcp_lifespan: Callable[[], contextlib.AbstractAsyncContextManager[None]], store: Store,
              agents: Agents | None = None):
    """This app's lifespan: the MCP endpoint's session manager runs inside it; at its end,
    the calls cancelled by the shutdown are waited for until they are recorded, then the warm
    pools' agents are removed (an app served by another server than ``serve`` ends so too)."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with mcp_lifespan():
                yield
        finally:
            await store.settled(limits.SERVE_CANCEL_WAIT_SECONDS)
            if agents is not None:
                await agents.pools.close()

    return lifespan


def endpoint_lock(data_dir: Path, host: str, *, no_token: bool = False, allow_hosts: tuple[str, ...] = ()) -> Lock:
    """The lock of a server on ``host``: its token (made on first run) unless ``no_token``,
    which only a loopback address may have; the Host names it answers."""
    if no_token and not is_loopback(host):
        raise ConfigError(f"--no-token: serving on {host} (not a loopback address) needs the token")
    return Lock(None if no_token else server_token(data_dir), host_names(host, allow_hosts))


def build_app(settings: AgentSettings, store: Store, toolbox: Toolbox, *, host: str = DEFAULT_HOST,
              lock: Lock | None, metrics: Metrics | None = None, agents: Agents | None = None) -> Starlette:
    """The whole ASGI app: the MCP endpoint at /mcp, ``metrics`` at /metrics (None: no such
    route), the app at /, behind ``lock`` (``endpoint_lock``; None: no lock at all, for an app
    that is not served). With ``agents`` (those made on demand), the app redacts with every
    served template's secrets and opens the logs of every live agent."""
    from .mcp_server import http_endpoint  # the MCP SDK: imported only to serve

    mcp = http_endpoint(toolbox, path="/mcp", host=host)
    routes = [mcp.route] if metrics is None else [mcp.route, metrics_route(metrics, store)]
    redactor, reading, rewind = toolbox.redactor, log_reading(toolbox), app_rewinder(toolbox)
    if agents is not None:
        redactor = Redactor([value for template in agents.served.templates.values()
                             for value in template.settings.secret_values()])
        reading, rewind = log_reading(toolbox, agents.toolbox), app_rewinder(toolbox, agents.toolbox)
    return create_app(store, redactor=redactor, logs=HelperLogReader(reading),
                      extra_routes=routes, lock=lock, serving=ServingAgent(settings.id, toolbox.sandbox.name),
                      rewind=rewind, lifespan=_lifespan(mcp.lifespan, store, agents))


def base_url(host: str, port: int, tls: bool = False) -> str:
    """http(s)://HOST:PORT as a client reaches the server (this machine's name for a wildcard bind)."""
    name = socket.gethostname() if host in ("0.0.0.0", "::") else host
    return f"{'https' if tls else 'http'}://{'[' + name + ']' if ':' in name else name}:{port}"


def served_urls(host: str, port: int, token: str | None, tls: bool = False) -> list[str]:
    """The lines printed once the server listens: the app's URL with its one-time token, /mcp's."""
    base = base_url(host, port, tls)
    if token is None:
        return [f"guilds serve: the app at {base}/ and MCP at {base}/mcp (no token: loopback only)"]
    return [f"guilds serve: the app at {base}/?token={token}",
            f"guilds serve: MCP at {base}/mcp with the header \"Authorization: Bearer {token}\""]


class Stopping:
    """SIGTERM, SIGINT and SIGHUP while ``serve`` runs (``held``): each noted, the first in
    ``signum``; the server (``server``, once it is made) told to stop; none ending the process.
    uvicorn handles SIGTERM and SIGINT itself while it serves, then raises the signal again
    once it returns, which would end the process (SIGTERM's default action) before ``serve``
    has closed what it opened; held by the loop here, that signal is only noted again."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.server: Any = None

    @property
    def signum(self) -> int | None:
        return self.signals[0] if self.signals else None

    def _stop(self, signum: int) -> None:
        self.signals.append(signum)
        if self.server is not None:
            self.server.should_exit = True  # uvicorn's own handler, while it serves, hears it too

    @contextlib.contextmanager
    def held(self) -> Iterator[Stopping]:
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self._stop, signum)
        try:
            yield self
        finally:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)


async def _run_server(server, host: str, lock: Lock, stopping: Stopping,
                      more_lines: Callable[[str, int], list[str]] | None = None, tls: bool = False) -> None:
    """Run uvicorn until a stop signal (none when one came already); print the URLs once it
    listens (and ``more_lines(base URL, port)``)."""
    stopping.server = server
    if stopping.signum is not None:
        return
    task = asyncio.ensure_future(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(limits.SERVE_START_POLL_SECONDS)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        lines = served_urls(host, port, lock.token, tls)
        if more_lines is not None:
            lines += more_lines(base_url(host, port, tls), port)
        print("\n".join(lines), file=sys.stderr, flush=True)
    await task


@contextlib.asynccontextmanager
async def helper_closed(toolbox: Toolbox) -> AsyncIterator[Toolbox]:
    """The toolbox, its resident helper ended at the end (one opening in the background is
    waited for first): not left to its parent-death signal as the process exits."""
    try:
        yield toolbox
    finally:
        await toolbox.transport.opened()
        await toolbox.close()


@contextlib.asynccontextmanager
async def agents_reaped(wired: Wired, store: Store, metrics: Metrics | None = None, *,
                        user: SandboxUser | None = None) -> AsyncIterator[Agents]:
    """The agents made on demand of the settings' templates (``guilds.agents.registry``): the
    expired ones removed at the start, then every ``limits.AGENT_REAP_SECONDS`` while the server runs.
    user: who every template's agents are inside (``templates.with_user``); None: as the templates say."""
    from ..agents.registry import Agents
    from ..config.templates import served_by, with_user

    served = served_by(wired.settings, wired.settings_file, wired.env)
    agents = await Agents.open(served if user is None else with_user(served, user), wired.data_dir, store, metrics)
    if metrics is not None:
        metrics.watch_pools(agents.pools)
    reaper = asyncio.create_task(agents.reap_every(limits.AGENT_REAP_SECONDS))
    try:
        yield agents
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        await agents.close()


async def serve(wired: Wired, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, no_token: bool = False,
                allow_hosts: tuple[str, ...] = (), e2b: E2BServing | None = None, tls: Tls | None = None) -> int | None:
    """Serve until a stop signal; ``wired`` from ``guilds.fronts.wiring.resolve``, as for every front.
    ``allow_hosts``: more Host names to answer (the names this machine is reached by);
    ``e2b``: serve the E2B API too (``guilds.fronts.e2b``) with these options (``serve_options``);
    ``tls``: serve HTTPS with this certificate and key.
    Returns the stop signal's number once everything it opened is closed (the reaper stopped,
    the resident helpers ended, the record closed and this process's entry in it removed)."""
    import uvicorn

    answered = allow_hosts if e2b is None else (*allow_hosts, *e2b.host_names())
    lock = endpoint_lock(private_dir(wired.data_dir), host, no_token=no_token, allow_hosts=answered)
    metrics = Metrics(traces_from_env(wired.env))
    with Stopping().held() as stopping:
        async with open_toolbox(wired, metrics) as opened, helper_closed(opened) as toolbox, \
                agents_reaped(wired, toolbox.store, metrics, user=None if e2b is None else E2B_USER) as agents:
            app = build_app(wired.settings, toolbox.store, toolbox, host=host, lock=lock, metrics=metrics,
                            agents=agents)
            e2b_lines = None
            if e2b is not None:
                from .e2b import E2BFront  # the E2B front: imported only when served

                front = E2BFront(agents, lock, e2b.keys, e2b.sleep_idle, shared=e2b.shared)
                await front.sandboxes.remove_left()
                app = front.wrap(app)  # type: ignore[assignment]
                e2b_lines = _e2b_lines(front, e2b, tls is not None)
            app = with_health(app, toolbox.store.answers, toolbox.store.owner.id)  # type: ignore[assignment]
            if address := wired.env.get(ADVERTISE_ENV):
                await toolbox.store.advertise(address)
            if metrics.traces is not None:  # each request's traceparent header, to the calls it makes
                app = http_carried(app)  # type: ignore[assignment]
            await agents.pools.start()  # after the fronts set their hooks (``Pools.prepare_with``)
            if not is_loopback(host):
                log.warning("serving on %s: whoever has the token runs commands as the agent and reads every "
                            "run; Host names answered: %s", host, ", ".join(lock.hosts))
            config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="info",
                                    timeout_graceful_shutdown=limits.SERVE_SHUTDOWN_GRACE_SECONDS,
                                    **({} if tls is None else tls.uvicorn_options()))
            await _run_server(uvicorn.Server(config), host, lock, stopping, e2b_lines, tls is not None)
    return stopping.signum


def _e2b_lines(front, e2b: E2BServing, tls: bool) -> Callable[[str, int], list[str]]:
    """The E2B front's printed lines once the server listens at (base URL, port)."""
    return lambda base, port: front.export_lines(base, e2b.domain_at(port, tls))
