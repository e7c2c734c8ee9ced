"""The answer to every E2B request this server does not serve: 501 with E2B's error body
``{"code": 501, "message": ...}`` naming the feature, so that the SDKs raise an error that
says so (not a JSON decode error, nor the app's 401 for a path it does not know)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

FEATURES = {
    "templates": "this template request", "snapshots": "snapshots", "volumes": "volumes", "secrets": "secrets",
    "metrics": "metrics", "logs": "logs", "fork": "fork", "network": "network updates (update_network)",
    "refreshes": "refreshes",
}
"""A path's word (its first after a version, or its last under /sandboxes) to the feature it asks for."""
NOT_IMPLEMENTED = 501
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
PATHS = ("/templates", "/v2/templates", "/v3/templates", "/snapshots", "/volumes", "/secrets")
"""The E2B API's top paths that are not served (each also as a prefix)."""


def feature_of(path: str) -> str:
    words = [word for word in path.split("/") if word and word not in ("v2", "v3")]
    if not words:
        return "this request"
    word = words[-1] if words[0] == "sandboxes" else words[0]
    return FEATURES.get(word, "this request")


async def unserved(request: Request) -> Response:
    path = request.url.path
    message = f"{feature_of(path)} is not supported by this server (guilds serve --e2b): {request.method} {path}"
    return JSONResponse({"code": NOT_IMPLEMENTED, "message": message}, status_code=NOT_IMPLEMENTED)


def routes() -> list[Route]:
    """Last among the E2B routes: whatever the others do not serve (by path or by method)."""
    return [Route("/{rest:path}", unserved, methods=METHODS)]
