"""The app: a run's flow of calls as rows, and each call's views, live (docs/app.md).

    create_app(store, redactor=..., logs=...) -> Starlette     (app.py)
    guilds.fronts.serve.serve(settings, data_dir, host, port, sandbox) runs it with /mcp

``create_app`` is loaded on first use: the endpoint lock beside the app
(endpoint_lock.py) is imported without the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
