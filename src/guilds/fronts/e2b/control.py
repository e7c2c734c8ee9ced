"""The E2B control plane (``E2B_API_URL``): sandboxes created, listed, connected, paused, killed.

Every request carries ``X-API-KEY`` (``guilds.fronts.e2b.keys``); a wrong or
missing key is answered 401. Errors are E2B's body ``{"code": <HTTP status>,
"message": ...}`` with that status: 400 for a bad body, 404 for a sandbox
that does not exist or belongs to another key (and for a template not served),
409 for pausing a paused one, 422 for an ``Idempotency-Key`` used before with another
body (``create_keys``), 429 for a create past a cap, 503 when the
sandbox's agent cannot be made (the reason in the message). The list is ``listing``'s,
the metrics ``sandbox_metrics``'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...errors import GuildsError
from ...limits import E2B_DEFAULT_TIMEOUT_SECONDS, E2B_MAX_BODY_BYTES, E2B_MAX_METADATA_BYTES, E2B_MAX_TIMEOUT_SECONDS
from . import (
    create_keys,
    ingress_options,
    lifecycle,
    listing,
    network_options,
    network_rules,
    network_update,
    template_start,
    unserved,
)
from .connect import ConnectError, bounded_body, json_object
from .keys import Keys
from .sandbox_metrics import Metrics, NoCgroup
from .sandboxes import PAUSED, E2BSandbox, Made, Sandboxes

if TYPE_CHECKING:
    from .forks import Forks

Handler = Callable[[Request, str], Awaitable[Response]]


class BadBody(ConnectError):
    def __init__(self, message: str):
        super().__init__("invalid_argument", message)


def e2b_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object, its size and depth bounded (413, 400)."""
    return json_object(await bounded_body(request, E2B_MAX_BODY_BYTES, status=413))


def _keep_memory(value: Any) -> bool:
    """A pause's ``memory`` (default true; false: filesystem-only)."""
    if value is not None and not isinstance(value, bool):
        raise BadBody("memory: true or false")
    return value is not False


def _timeout(value: Any, default: int = E2B_DEFAULT_TIMEOUT_SECONDS) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= E2B_MAX_TIMEOUT_SECONDS:
        raise BadBody(f"timeout: a whole number of seconds from 0 to {E2B_MAX_TIMEOUT_SECONDS}")
    return value


def _strings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadBody(f"{name}: an object of strings")
    return value


def _metadata(value: Any) -> dict[str, str]:
    """metadata: strings, E2B_MAX_METADATA_BYTES at most (keys and values, UTF-8)."""
    found = _strings(value, "metadata")
    size = sum(len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
               for k, v in found.items())
    if size > E2B_MAX_METADATA_BYTES:
        raise BadBody(f"metadata: at most {E2B_MAX_METADATA_BYTES} bytes of keys and values, got {size}")
    return found


def _unix_time(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    if not value.lstrip("-").isdigit() or len(value) > 12:
        raise BadBody(f"{name}: a Unix time in seconds, not {value[:16]!r}")
    return int(value)


class ControlPlane:
    def __init__(self, sandboxes: Sandboxes, keys: Keys, forks: Forks | None = None, built: Forks | None = None):
        """forks: snapshots and fork, and sandboxes made from snapshots (none: not served);
        built: sandboxes made from built templates (``template_service``; none: not served)."""
        self.sandboxes, self.keys, self.forks, self.built = sandboxes, keys, forks, built
        self.metrics = Metrics(sandboxes)
        self.create_keys = create_keys.CreateKeys(sandboxes)

    def routes(self) -> list[Route]:
        return [
            Route("/sandboxes", self._keyed(self.create), methods=["POST"]),
            Route("/v2/sandboxes", self._keyed(self.create), methods=["POST"]),
            Route("/sandboxes", self._keyed(self.list_v1), methods=["GET"]),
            Route("/v2/sandboxes", self._keyed(self.list), methods=["GET"]),
            Route("/sandboxes/metrics", unserved.unserved, methods=["GET"]),  # many sandboxes' at once
            Route("/sandboxes/{id}", self._keyed(self.detail), methods=["GET"]),
            Route("/sandboxes/{id}", self._keyed(self.kill), methods=["DELETE"]),
            Route("/sandboxes/{id}/timeout", self._keyed(self.timeout), methods=["POST"]),
            Route("/sandboxes/{id}/pause", self._keyed(self.pause), methods=["POST"]),
            Route("/sandboxes/{id}/network", self._keyed(self.update_network), methods=["PUT"]),
            Route("/sandboxes/{id}/resume", self._keyed(self.resume), methods=["POST"]),
            Route("/sandboxes/{id}/metrics", self._keyed(self.metrics_of), methods=["GET"]),
            Route("/sandboxes/{id}/connect", self._keyed(self.connect), methods=["POST"]),
            Route("/v2/sandboxes/{id}/connect", self._keyed(self.connect), methods=["POST"]),
        ]

    def _keyed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            key_name = self.keys.name_of(request.headers.get("x-api-key"))
            if key_name is None:
                return e2b_error(401, "Invalid API key: X-API-KEY must be a key this server printed")
            try:
                return await handler(request, key_name)
            except ConnectError as exc:
                return e2b_error(exc.status, str(exc))
            except GuildsError as exc:  # the sandbox's agent could not be made: one line, no traceback
                return e2b_error(503, f"the sandbox could not be started: {exc}")

        return endpoint

    def _created(self, box: E2BSandbox) -> dict[str, Any]:
        return box.created(self.sandboxes.client_id, self.sandboxes.domain)

    async def create(self, request: Request, key_name: str) -> Response:
        """A new sandbox; with an ``Idempotency-Key``, the one that key made (``create_keys``)."""
        body = await _body(request)
        box, repeated = await self.create_keys.once(key_name, request.headers.get(create_keys.HEADER), body,
                                                    lambda: self._create(key_name, body))
        headers = {create_keys.REPLAYED_HEADER: "true"} if repeated else None
        return JSONResponse(self._created(box), status_code=201, headers=headers)

    async def _create(self, key_name: str, body: dict[str, Any]) -> E2BSandbox:
        template = body.get("templateID", "base")
        if not isinstance(template, str):
            raise BadBody("templateID: a template name")
        for forks in (self.forks, self.built):  # a sandbox made from a snapshot, or from a built template
            snapshot = None if forks is None else forks.named(key_name, template)
            if forks is None or snapshot is None:
                continue
            named = snapshot.id if forks is self.forks else template
            timeout = _timeout(body.get("timeout"))
            settings = forks.settings_of(snapshot)
            asked = Made(key_name, named, timeout, _metadata(body.get("metadata")),
                         _strings(body.get("envVars"), "envVars"),
                         network_options.asked(body, settings), datetime.now(UTC),
                         lifecycle=lifecycle.asked(body, timeout),
                         ingress=ingress_options.asked(body, shared=self.sandboxes.shared is not None),
                         rules=network_rules.asked(body.get("network") or {}, settings))
            made = await forks.create_from(snapshot, asked)
            if forks is self.built:
                try:
                    await template_start.started(made, snapshot.built)
                except BaseException:
                    await self.sandboxes.kill(made)
                    raise
            return made
        timeout = _timeout(body.get("timeout"))
        settings = self.sandboxes.settings_for(template)
        return await self.sandboxes.create(key_name, template, timeout, _metadata(body.get("metadata")),
                                           _strings(body.get("envVars"), "envVars"),
                                           network_options.asked(body, settings),
                                           lifecycle.asked(body, timeout),
                                           ingress_options.asked(body, shared=self.sandboxes.shared is not None),
                                           network_rules.asked(body.get("network") or {}, settings))

    async def list(self, request: Request, key_name: str) -> Response:
        await self.sandboxes.refresh_key(key_name)
        found, headers = listing.page(self.sandboxes.of_key(key_name), listing.Query.of_v2(request.query_params),
                                      self.sandboxes.template_of, self.sandboxes.client_id)
        return JSONResponse(found, headers=headers)

    async def list_v1(self, request: Request, key_name: str) -> Response:
        await self.sandboxes.refresh_key(key_name)
        return JSONResponse(listing.running_v1(self.sandboxes.of_key(key_name), request.query_params,
                                               self.sandboxes.client_id))

    async def detail(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        return JSONResponse(box.listed(self.sandboxes.client_id))

    async def metrics_of(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        start, end = (_unix_time(request.query_params.get(name), name) for name in ("start", "end"))
        if start is not None and end is not None and start > end:
            raise BadBody("Invalid time range for metrics: start time cannot be after end time")
        try:
            return JSONResponse(await self.metrics.of(box, start, end))
        except NoCgroup as exc:
            return e2b_error(501, f"metrics are not served for sandbox '{box.id}': {exc} (they are read from "
                                  "the cgroup of a sandbox of the bwrap backend, as the server runs it as root)")
        except OSError as exc:
            return e2b_error(500, f"the sandbox's cgroup could not be read: {exc.strerror or exc}")
        except TimeoutError:
            return e2b_error(503, f"sandbox '{box.id}': its process service did not answer in time")

    async def kill(self, request: Request, key_name: str) -> Response:
        await self.sandboxes.kill(self.sandboxes.get(key_name, request.path_params["id"]))
        return Response(status_code=204)

    async def timeout(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        seconds = _timeout((await _body(request)).get("timeout", -1))
        await self.sandboxes.set_timeout(box, seconds)
        return Response(status_code=204)

    async def update_network(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        await network_update.update(box, await _body(request), self.sandboxes.settings_for(box.template),
                                    self.sandboxes.backend_for(self.sandboxes.template_of(box.template)))
        return Response(status_code=204)

    async def pause(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        if box.state == PAUSED:
            return e2b_error(409, f"sandbox '{box.id}' is already paused")
        await self.sandboxes.pause(box, keep_memory=_keep_memory((await _body(request)).get("memory")))
        return Response(status_code=204)

    async def resume(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        if box.state != PAUSED:
            return e2b_error(409, f"sandbox '{box.id}' is already running")
        await self.sandboxes.resume(box, _timeout((await _body(request)).get("timeout")))
        return JSONResponse(self._created(box), status_code=201)

    async def connect(self, request: Request, key_name: str) -> Response:
        box = self.sandboxes.get(key_name, request.path_params["id"])
        resumed = await self.sandboxes.resume(box, _timeout((await _body(request)).get("timeout")))
        return JSONResponse(self._created(box), status_code=201 if resumed else 200)
