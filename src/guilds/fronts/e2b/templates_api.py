"""The control plane's template requests (``template_service``), keyed as the others are
(``X-API-KEY``; another key's template or build is not found), as the E2B SDKs'
``Template.build`` and ``build_in_background`` send them:

    POST   /v3/templates {name, tags?, cpuCount?, memoryMB?}   202 {templateID, buildID, names, tags, ...}
    GET    /templates/{tid}/files/{hash}                        201 {present, url}: where COPY's files go
    PUT    /templates/{tid}/files/{hash}?signature=             200: the files (no key: the URL is signed)
    POST   /v2/templates/{tid}/builds/{bid} {fromImage, steps, ...}   202: the build runs
    GET    /templates/{tid}/builds/{bid}/status?logsOffset=&limit=    200 TemplateBuildInfo
    GET    /templates/aliases/{alias}                           200 {templateID, public}; 404
    POST   /templates/tags {target, tags}                       201 {tags, buildID}: tags given to a build
    DELETE /templates/tags {name, tags}                         204: tags taken away
    GET    /templates/{tid}/tags                                200 [{tag, buildID, createdAt}]
    DELETE /templates/{id}                                      204: a built template removed (else a snapshot's)

Every other template request (listing, logs, the older build API) is answered 501 by
``unserved``. A sandbox is made of a built template by ``POST /sandboxes`` with its name or id
(``control``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...limits import E2B_TEMPLATE_STATUS_LOGS
from .connect import ConnectError
from .control import BadBody, ControlPlane, _body, e2b_error
from .template_homes import template_id
from .template_service import Templates

Fallback = Callable[[Request], Awaitable[Response]]


class TemplatesApi:
    def __init__(self, control: ControlPlane, templates: Templates, delete_other: Fallback):
        """delete_other: ``DELETE /templates/{id}`` of what is no built template (a snapshot)."""
        self.control, self.templates, self.delete_other = control, templates, delete_other

    def routes(self) -> list[Route]:
        keyed = self.control._keyed
        return [
            Route("/v3/templates", keyed(self.request), methods=["POST"]),
            Route("/templates/aliases/{alias}", keyed(self.alias), methods=["GET"]),
            Route("/templates/{tid}/files/{hash}", keyed(self.link), methods=["GET"]),
            Route("/templates/{tid}/files/{hash}", self.upload, methods=["PUT"]),
            Route("/v2/templates/{tid}/builds/{bid}", keyed(self.start), methods=["POST"]),
            Route("/templates/{tid}/builds/{bid}/status", keyed(self.status), methods=["GET"]),
            Route("/templates/tags", keyed(self.assign), methods=["POST"]),
            Route("/templates/tags", keyed(self.untag), methods=["DELETE"]),
            Route("/templates/{tid}/tags", keyed(self.tags), methods=["GET"]),
            Route("/templates/{id:path}", self.delete, methods=["DELETE"]),
        ]

    async def request(self, request: Request, key_name: str) -> Response:
        return JSONResponse(self.templates.request(key_name, await _body(request)), status_code=202)

    async def link(self, request: Request, key_name: str) -> Response:
        found = self.templates.link(key_name, str(request.base_url), request.path_params["tid"],
                                    request.path_params["hash"])
        return JSONResponse(found, status_code=201)

    async def upload(self, request: Request) -> Response:
        try:
            await self.templates.uploads.receive(request, request.path_params["tid"], request.path_params["hash"])
        except ConnectError as exc:
            return e2b_error(exc.status, str(exc))
        return Response(status_code=200)

    async def start(self, request: Request, key_name: str) -> Response:
        self.templates.start(key_name, request.path_params["tid"], request.path_params["bid"], await _body(request))
        return Response(status_code=202)

    async def status(self, request: Request, key_name: str) -> Response:
        build = self.templates.build(key_name, request.path_params["tid"], request.path_params["bid"])
        offset = _whole(request.query_params.get("logsOffset"), "logsOffset", 0, 1 << 31)
        limit = _whole(request.query_params.get("limit"), "limit", E2B_TEMPLATE_STATUS_LOGS, E2B_TEMPLATE_STATUS_LOGS)
        return JSONResponse(build.info(offset, limit))

    async def assign(self, request: Request, key_name: str) -> Response:
        return JSONResponse(await self.templates.assign(key_name, await _body(request)), status_code=201)

    async def untag(self, request: Request, key_name: str) -> Response:
        await self.templates.untag(key_name, await _body(request))
        return Response(status_code=204)

    async def tags(self, request: Request, key_name: str) -> Response:
        return JSONResponse(self.templates.tags(key_name, request.path_params["tid"]))

    async def alias(self, request: Request, key_name: str) -> Response:
        alias = request.path_params["alias"]
        if alias in self.control.sandboxes.templates():
            return JSONResponse({"templateID": alias, "public": True})
        found = self.templates.homes.builds_of(key_name, alias)  # a name with any build, whatever its tags
        if not found or found[0].name is None:
            return e2b_error(404, f"template '{alias}' not found")
        return JSONResponse({"templateID": template_id(key_name, found[0].name), "public": False})

    async def delete(self, request: Request) -> Response:
        async def built_or_other(request: Request, key_name: str) -> Response:
            if await self.templates.delete(key_name, request.path_params["id"]):
                return Response(status_code=204)
            return await self.delete_other(request)

        return await self.control._keyed(built_or_other)(request)


def _whole(value: str | None, name: str, default: int, most: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or int(value) > most:
        raise BadBody(f"{name}: a whole number from 0 to {most}")
    return int(value)
