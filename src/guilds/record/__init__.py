"""The run record: its tables (schema), where it lives and how it is opened (engine),
its statements, the Store API, the processes that own calls (owners), the migration of
an older record, and the values read back (values, rows, redaction).

    async with Store(database_url(data_dir, os.environ)) as store: ...

``Store``, ``database_url`` and ``normalize_url`` are loaded on first use: the values
and row texts are imported without the database library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import database_url, normalize_url
    from .store import Store

__all__ = ["Store", "database_url", "normalize_url"]


def __getattr__(name: str) -> Any:
    if name == "Store":
        from .store import Store

        return Store
    if name in ("database_url", "normalize_url"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
