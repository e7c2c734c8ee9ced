"""The app: a run's flow of calls as rows, and each call's views, live (docs/app.md).

    create_app(store, redactor=..., logs=...) -> Starlette     (app.py)
    guilds.fronts.serve.serve(settings, data_dir, host, port, sandbox) runs it with /mcp
"""

from .app import create_app

__all__ = ["create_app"]
