"""argv -> request -> op -> exactly one envelope line on stdout; exit 0.

``guilds-code serve`` instead runs the helper resident (``resident.py``): the same
requests and envelopes, framed, over stdin and stdout.

``serve`` is the helper's only catch-all (guilds-harness runs its own op
through it too): whatever goes wrong becomes ``{"ok": false, "error": one
line}``, never a traceback on stdout. Each op's module is imported only when
asked for, so a call loads just what its op needs.
"""

import os
import sys

from . import protocol

OP_MODULES = {
    "shell": "guilds_code.ops.shell",
    "shell_status": "guilds_code.ops.shell_status",
    "file_read": "guilds_code.ops.file_read",
    "code_search": "guilds_code.ops.code_search",
    "log_read": "guilds_code.ops.log_read",
}


def dispatch(argv) -> protocol.Reply:
    """Decode the request and run its op."""
    return run_request(protocol.decode_request(argv))


def run_request(request: protocol.Request) -> protocol.Reply:
    return __import__(OP_MODULES[request.op], fromlist=("run",)).run(request)  # importlib costs an import


def dispatch_object(data) -> protocol.Reply:
    """A request object already decoded from JSON (a resident request): validate, run."""
    return run_request(protocol.parse_request(data))


def envelope(argv, handle) -> bytes:
    """handle(argv) -> Reply, as the envelope bytes; every error becomes an error envelope."""
    try:
        return protocol.ok_envelope(handle(argv))
    except (protocol.RequestError, protocol.OpError) as exc:
        return protocol.error_envelope(str(exc))
    except Exception as exc:  # noqa: BLE001 - the one place a surprise becomes a result
        return protocol.error_envelope(f"internal error: {type(exc).__name__}: {exc}")


def serve(argv, handle) -> int:
    """Write envelope(argv, handle) to stdout, all of it; the exit status (0)."""
    view = memoryview(envelope(argv, handle))
    while view:
        view = view[os.write(1, view) :]
    return 0


def main(argv=None) -> int:
    """One request from argv; or ``serve [options]``, the resident helper (``resident.py``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # "serve" is not base64 (5 characters): never a request
        from . import resident

        return resident.main(argv[1:], lambda data: envelope(data, dispatch_object))
    if argv[:1] == ["envd"]:  # the E2B front's in-sandbox service (envd.py); not base64 either
        from . import envd

        return envd.main(argv[1:])
    if argv[:1] == ["starter"]:  # helpers forked into bwrap sandboxes (starter.py), run on the host
        from . import starter

        return starter.main(argv[1:], main)
    return serve(argv, dispatch)


if __name__ == "__main__":
    sys.exit(main())
