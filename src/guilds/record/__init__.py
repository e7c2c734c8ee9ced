"""The run record: its tables (schema), where it lives and how it is opened (engine),
its statements, the Store API, the processes that own calls (owners), the migration of
an older record, and the values read back (values, rows, redaction).

    async with Store(database_url(data_dir, os.environ)) as store: ...
"""

from .engine import database_url, normalize_url
from .store import Store

__all__ = ["Store", "database_url", "normalize_url"]
