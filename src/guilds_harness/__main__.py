"""argv -> code_task request -> run -> exactly one envelope line on stdout; exit 0.

The helper's only catch-all: whatever goes wrong becomes
``{"ok": false, "error": one line}``, never a traceback on stdout.
"""

from __future__ import annotations

import sys

from guilds_code import protocol
from guilds_code.__main__ import _write_all

from . import process
from . import request as request_mod
from . import run as run_mod


def run(argv) -> bytes:
    """Decode, run, and return the envelope bytes."""
    try:
        req = request_mod.decode_request(argv)
        return protocol.ok_envelope(run_mod.run(req))
    except (protocol.RequestError, protocol.OpError) as exc:
        return protocol.error_envelope(str(exc))
    except Exception as exc:  # the one place a surprise becomes a result
        return protocol.error_envelope(f"internal error: {type(exc).__name__}: {exc}")


def main(argv=None) -> int:
    process.become_subreaper()
    _write_all(run(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
