"""argv -> code_task request -> run -> exactly one envelope line on stdout; exit 0.

guilds_code's ``serve`` is the catch-all: whatever goes wrong becomes
``{"ok": false, "error": one line}``, never a traceback on stdout.
"""

from __future__ import annotations

import sys

from guilds_code.__main__ import serve
from guilds_code.protocol import Reply

from . import process
from . import request as request_mod
from . import run as run_mod


def dispatch(argv) -> Reply:
    """Decode the code_task request and run it; the Reply."""
    return run_mod.run(request_mod.decode_request(argv))


def main(argv=None) -> int:
    process.become_subreaper()
    return serve(sys.argv[1:] if argv is None else argv, dispatch)


if __name__ == "__main__":
    sys.exit(main())
