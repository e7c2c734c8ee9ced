"""argv -> request -> op -> exactly one envelope line on stdout; exit 0.

This is the helper's only catch-all: whatever goes wrong becomes
``{"ok": false, "error": one line}``, never a traceback on stdout.
"""

import importlib
import os
import sys

from . import protocol

OP_MODULES = {
    "shell": "guilds_code.ops.shell",
    "shell_status": "guilds_code.ops.background",
    "file_read": "guilds_code.ops.file_read",
    "code_search": "guilds_code.ops.code_search",
}


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


def run(argv):
    """Decode, dispatch, and return the envelope bytes."""
    try:
        request = protocol.decode_request(argv)
        module = importlib.import_module(OP_MODULES[request.op])
        return protocol.ok_envelope(module.run(request))
    except (protocol.RequestError, protocol.OpError) as exc:
        return protocol.error_envelope(str(exc))
    except Exception as exc:  # the one place a surprise becomes a result
        return protocol.error_envelope(f"internal error: {type(exc).__name__}: {exc}")


def main(argv=None) -> int:
    envelope = run(sys.argv[1:] if argv is None else argv)
    _write_all(envelope)
    return 0


if __name__ == "__main__":
    sys.exit(main())
