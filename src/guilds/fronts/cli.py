"""`guilds`: the user's commands. Fronts only translate; the toolbox does the work.

    guilds call TOOL 'JSON ARGS' [--home DIR] [--run ID] [--config FILE] [--sandbox NAME] [--json] [--context-reset]
                [--agent ID]
    guilds tools [--format anthropic|openai|openai-responses|mcp]
    guilds serve [--home DIR] [--port N] [--host H] [--allow-host NAME] [--no-token] [--sandbox NAME] [--config FILE]
                 [--tls-cert FILE --tls-key FILE]
                 [--e2b [--e2b-key NAME] [--e2b-sleep-idle SECONDS] [--e2b-shared] [--e2b-domain NAME[:PORT]]]
    guilds mcp [--home DIR] [--sandbox NAME] [--config FILE]
    guilds doctor [--config FILE] [--sandbox NAME]
    guilds serve image [--tag T] [--base B] [--rootfs TAR] [--no-install] [--extra NAME]
    guilds sandbox image [--tag T] [--base B] [--rootfs TAR] [--no-install]
    guilds sandbox list | stop [AGENT] | rm [AGENT] [--config FILE] [--sandbox NAME]
    guilds agent new [TEMPLATE] [--owner O] [--expires-in S] | list [--owner O] | rm ID [--config FILE]
    guilds --version

`guilds call` imports only what a call needs: not the MCP SDK, the app, nor
a sandbox backend other than the agent's. `guilds mcp` answers a client's
opening requests before it imports the SDK (guilds.fronts.mcp_stdio): nothing
heavy is imported before that.

Exit codes: 0 when the call was made (its result printed, also an error
result: a failed command, a missing file, an exhausted budget); 2 for bad
input (usage, JSON arguments, a run id, the settings file); 1 for any other
failure of guilds itself.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from guilds_code.limits import ENVD_SLEEP_IDLE_MAX_SECONDS, ENVD_SLEEP_IDLE_SECONDS

from ..errors import BadInput, ConfigError, GuildsError

if TYPE_CHECKING:
    from .serve_options import E2BServing, Tls
    from .wiring import Wired

SERVERS = ("serve", "mcp")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_SIGNAL = 128
"""Stopped by signal N: exit 128 + N, as a shell reports it."""


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. ``command``: the first argument, when known: the tool
    registry (the tool names, the export formats) is loaded only for a command that
    names them, so `guilds mcp` answers its client before the registry has loaded."""
    from .wiring import settings_options

    tool_names, formats = _registry_names() if command in (None, "call", "tools") else ((), ())
    parser = argparse.ArgumentParser(prog="guilds", description="Code tools for coding agents.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    call = sub.add_parser("call", help="make one tool call through the whole pipeline")
    call.add_argument("tool", help=f"one of {', '.join(tool_names)}")
    call.add_argument("args", nargs="?", default="{}", help="the arguments, a JSON object")
    call.add_argument("--home", help="the agent's home (overrides agent.home)")
    call.add_argument("--run", help="the run id (default: a new run)")
    call.add_argument("--agent", metavar="ID", help="an agent made on demand (guilds agent new) instead of "
                                                    "the settings' own")
    settings_options(call)
    call.add_argument("--json", action="store_true", help='print {"text", "is_error", "meta"}')
    call.add_argument("--context-reset", action="store_true",
                      help="the model's context was compacted or rewound: no file_read points before this call")
    tools = sub.add_parser("tools", help="print the tool definitions as JSON")
    tools.add_argument("--format", choices=sorted(formats), default="anthropic")
    helps = {"serve": "the app at http://127.0.0.1:PORT/ and the MCP endpoint at /mcp",
             "mcp": "the tools as an MCP server on stdio"}
    for name in SERVERS:
        server = sub.add_parser(name, help=helps[name])
        server.add_argument("--home", help="the agent's home (overrides agent.home)")
        settings_options(server)
        if name == "serve":
            server.add_argument("--port", type=int, default=8765, help="default 8765")
            server.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
            server.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                                help="also answer this Host name (a name this machine is reached by)")
            server.add_argument("--tls-cert", metavar="FILE",
                                help="serve HTTPS with this certificate chain (PEM), with --tls-key")
            server.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
            server.add_argument("--log-json", action="store_true",
                                help="log lines (one a call, one a sandbox start) as JSON objects")
            server.add_argument("--no-token", action="store_true",
                                help="serve without the token (a loopback --host only)")
            server.add_argument("--e2b", action="store_true",
                                help="serve the E2B API too, for the E2B SDKs (docs/e2b.md)")
            server.add_argument("--e2b-key", action="append", default=[], metavar="NAME",
                                help="with --e2b: one more API key, seeing only its own sandboxes")
            server.add_argument("--e2b-sleep-idle", type=_sleep_idle_seconds, default=None, metavar="SECONDS",
                                help="with --e2b: a sandbox's process service idle this long sleeps "
                                     f"(default {ENVD_SLEEP_IDLE_SECONDS}; 0: never)")
            server.add_argument("--e2b-shared", action="store_true",
                                help="with --e2b: the sandboxes are in the run record, served by every server on "
                                     "it (replicas: docs/deploy.md)")
            server.add_argument("--e2b-domain", metavar="NAME[:PORT]",
                                help="with --e2b: E2B programs reach the server as E2B_DOMAIN (api.NAME, "
                                     "<port>-<id>.NAME over HTTPS: --tls-cert or a TLS front)")
    doctor = sub.add_parser("doctor", help="what works on this machine and what does not, with the fix")
    settings_options(doctor)
    box = sub.add_parser("sandbox", help="the agents' sandboxes: image, list, stop, rm")
    box.add_argument("action", choices=["image", "list", "stop", "rm"],
                     help="image: build the docker sandbox image; list: the agents' sandboxes and their "
                          "state; stop: end one (its files stay); rm: remove one with its state")
    box.add_argument("rest", nargs=argparse.REMAINDER, help="the action's options (--help)")
    agent = sub.add_parser("agent", help="agents made on demand from the settings' templates: new, list, rm, fork")
    agent.add_argument("action", choices=["new", "list", "rm", "fork"],
                       help="new: make an agent of a template; list: the live agents; rm: remove one and "
                            "everything of it; fork: N agents whose homes start as one agent's")
    agent.add_argument("rest", nargs=argparse.REMAINDER, help="the action's options (--help)")
    from .checkpoint_commands import add_parsers as checkpoint_parsers

    checkpoint_parsers(sub, settings_options)
    return parser


def _registry_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from ..toolbox.tools import FORMATS, TOOL_NAMES

    return TOOL_NAMES, tuple(FORMATS)


class _Version(argparse.Action):
    """--version: guilds' version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from .mcp_quick import server_version

        print(f"guilds {server_version()}")
        parser.exit()


@contextlib.contextmanager
def _collections_paused() -> Iterator[None]:
    """No cyclic garbage collection while a command starts: a short process imports a great
    many objects that all live to its end, and collecting among them is wasted time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _sleep_idle_seconds(text: str) -> int:
    """--e2b-sleep-idle's value: whole seconds, 0 (never) up to a week."""
    if not text.isdigit() or int(text) > ENVD_SLEEP_IDLE_MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be whole seconds from 0 to {ENVD_SLEEP_IDLE_MAX_SECONDS}, got {text!r}")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_args_json(text: str) -> dict[str, Any]:
    """The tool's arguments: a JSON object (NaN and Infinity refused)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise BadInput(f"arguments: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadInput("arguments: must be a JSON object, like '{\"command\": \"ls\"}'")
    return value


def new_run_id() -> str:
    """A fresh run id for a call without --run: cli-<UTC time>-<random>."""
    import secrets
    import time

    return f"cli-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def _overrides(opts: argparse.Namespace) -> dict[str, Any]:
    """--home and --sandbox as settings overrides: checked like the file's keys."""
    overrides: dict[str, Any] = {}
    if getattr(opts, "home", None):
        overrides["home"] = str(Path(opts.home).expanduser().resolve())
    if getattr(opts, "sandbox", None):
        overrides["sandbox"] = opts.sandbox
    return overrides


def _wired(opts: argparse.Namespace, env: Mapping[str, str]) -> Wired:
    from .wiring import resolve

    return resolve(opts.config, env=env, overrides=_overrides(opts))


async def _call(opts: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    from .wiring import open_toolbox

    args = parse_args_json(opts.args)
    if opts.agent:
        return await _call_made_agent(opts, args, env)
    async with open_toolbox(_wired(opts, env)) as toolbox:
        result = await toolbox.call(opts.run or new_run_id(), opts.tool, args,
                                    context_reset=opts.context_reset)
    return {"text": result.text, "is_error": result.is_error, "meta": result.meta}


async def _call_made_agent(opts: argparse.Namespace, args: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The call made by an agent made on demand (``--agent ID``), on its own home and sandbox."""
    from .agent import Agent

    if opts.home or opts.sandbox:
        raise ConfigError("--agent: an agent made on demand has its own home and sandbox; drop --home and --sandbox")
    async with Agent(_wired(opts, env)) as server:
        made = await server.made_agent(opts.agent)
        result = await made.toolbox.call(opts.run or new_run_id(), opts.tool, args, context_reset=opts.context_reset)
    return {"text": result.text, "is_error": result.is_error, "meta": result.meta}


def _run_call(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    import asyncio

    from .signals import Stopped, until_stopped

    try:
        result = asyncio.run(until_stopped(_call(opts, env)))
    except Stopped as stop:
        print(f"guilds: stopped by {stop.name}; the call's command was stopped and the call recorded as cancelled",
              file=sys.stderr)
        return EXIT_SIGNAL + stop.signum
    if opts.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print(result["text"])
    if "not_recorded" in result["meta"]:  # the output is above; the record did not take it
        print(f"guilds: {result['meta']['not_recorded']}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def starting_line(wired: Wired, first_run: bool) -> str:
    """What `guilds serve` prints at once, before any slow step: what it is doing
    until the URL lines come (``guilds.fronts.serve.served_urls``)."""
    steps = f"the run record, the sandbox check (sandbox = \"{wired.settings.sandbox}\") and the app"
    if first_run:
        return (f"guilds serve: first run: the settings written to {wired.settings_file}; "
                f"now the token, {steps}")
    return f"guilds serve: starting: {steps}"


def _first_run(opts: argparse.Namespace, env: Mapping[str, str]) -> bool:
    """No settings file given and none yet in the data folder: this start writes it."""
    from ..config.settings import SETTINGS_FILE, data_dir

    return opts.config is None and not (data_dir(env) / SETTINGS_FILE).exists()


def _refuse_no_token_off_loopback(opts: argparse.Namespace) -> None:
    """Refused before anything starts, as ``guilds.fronts.serve.endpoint_lock`` would refuse it."""
    from ..web.endpoint_lock import is_loopback

    if opts.no_token and not is_loopback(opts.host):
        raise ConfigError(f"--no-token: serving on {opts.host} (not a loopback address) needs the token")
    if opts.no_token and opts.e2b:
        raise ConfigError("--e2b: the E2B keys are made from the endpoint's token; drop --no-token")
    if opts.e2b_key and not opts.e2b:
        raise ConfigError("--e2b-key: only with --e2b")
    if opts.e2b_sleep_idle is not None and not opts.e2b:
        raise ConfigError("--e2b-sleep-idle: only with --e2b")
    if opts.e2b_shared and not opts.e2b:
        raise ConfigError("--e2b-shared: only with --e2b")
    if opts.e2b_domain is not None and not opts.e2b:
        raise ConfigError("--e2b-domain: only with --e2b")
    if (opts.tls_cert is None) != (opts.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key: give both (the certificate and its private key) or neither")


def _serve_options(opts: argparse.Namespace) -> tuple[Tls | None, E2BServing | None]:
    """`guilds serve`'s HTTPS and E2B options, checked (ConfigError) before anything starts
    (nothing imported for a plain `guilds serve`: its first line waits for none of it)."""
    if opts.tls_cert is None and not opts.e2b:
        return None, None
    from .serve_options import E2BServing, Tls, checked_domain

    tls = None if opts.tls_cert is None else Tls.checked(opts.tls_cert, opts.tls_key)
    e2b = None if not opts.e2b else E2BServing(
        tuple(opts.e2b_key), opts.e2b_sleep_idle, opts.e2b_shared,
        None if opts.e2b_domain is None else checked_domain(opts.e2b_domain))
    return tls, e2b


def _run_server(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    import logging

    first_run = opts.command == "serve" and _first_run(opts, env)
    wired = _wired(opts, env)
    tls, e2b = None, None
    if opts.command == "serve":
        _refuse_no_token_off_loopback(opts)
        tls, e2b = _serve_options(opts)
        print(starting_line(wired, first_run), file=sys.stderr, flush=True)
    gc.enable()  # a server lives long: collections as usual
    # Plain lines on stderr, whatever is installed: the MCP SDK would otherwise
    # configure the root logger itself, with rich's handler where rich is importable.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if opts.command == "serve":
        _call_lines(opts.log_json)
    if opts.command == "mcp":
        from .mcp_stdio import serve as serve_stdio

        serve_stdio(wired)
        return EXIT_OK
    import asyncio

    from .serve import serve

    try:
        signum = asyncio.run(serve(wired, opts.host, opts.port, no_token=opts.no_token,
                                   allow_hosts=tuple(opts.allow_host), e2b=e2b, tls=tls))
    except KeyboardInterrupt:  # before the server held its stop signals: nothing opened yet
        return EXIT_OK
    if signum is not None:
        print(stopped_line(signum), file=sys.stderr, flush=True)
    return EXIT_OK


def stopped_line(signum: int) -> str:
    """What `guilds serve` prints last, once a stop signal's stop is done."""
    return (f"guilds serve: stopped by {signal.Signals(signum).name}: the running calls recorded as cancelled, "
            "the warm pools' agents removed, the run record closed")


def _call_lines(json_lines: bool) -> None:
    """The server's line a call and a sandbox start (``guilds.observe.log_lines``), as JSON on request."""
    import logging

    from ..observe.log_lines import CALLS_LOGGER, JsonLines

    logging.getLogger(CALLS_LOGGER).setLevel(logging.INFO)
    if json_lines:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLines())


def _sandbox_command(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    if opts.action == "image":
        from ..sandbox.image import main as image_main

        return image_main(opts.rest)
    from .sandbox_commands import main as sandbox_commands_main

    return sandbox_commands_main(opts.action, opts.rest, env)


def _run(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    if opts.command == "tools":
        from ..toolbox.tools import export, tool_specs

        print(json.dumps(export(tool_specs(), opts.format), ensure_ascii=False, indent=2))
        return EXIT_OK
    if opts.command in SERVERS:
        return _run_server(opts, env)
    if opts.command == "sandbox":
        return _sandbox_command(opts, env)
    if opts.command == "agent":
        from .agent_commands import main as agent_commands_main

        return agent_commands_main(opts.action, opts.rest, env)
    if opts.command in ("checkpoint", "rewind"):
        from .checkpoint_commands import main as checkpoint_main

        return checkpoint_main(opts, env, _overrides(opts))
    if opts.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(_wired(opts, env))
    return _run_call(opts, env)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    with _collections_paused():
        args = sys.argv[1:] if argv is None else list(argv)
        if args[:2] == ["serve", "image"]:  # not a server: the image that runs one
            from .serve_image import main as serve_image_main

            return serve_image_main(args[2:])
        opts = _parser(args[0] if args else None).parse_args(args)
        try:
            return _run(opts, env)
        except (ConfigError, BadInput) as exc:
            print(f"guilds: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except GuildsError as exc:
            print(f"guilds: {exc}", file=sys.stderr)
            return EXIT_FAILED
        except BrokenPipeError:  # `guilds tools | head`: the reader left; so do we, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK


def _flush() -> int | None:
    """Flush what the process has written; EXIT_OK's replacement when the reader left."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # `guilds tools | head`: the reader left
            return EXIT_OK
        except (OSError, ValueError):
            pass
    return None


def run() -> None:
    """The console script: ``main``, then the process ends at once (``os._exit``).

    By then the command has done all of its work: the record is closed, every
    call recorded, the sandbox left running or stopped as it should be. What
    the interpreter would still do is tear down every module and object one by
    one, which costs a short command like `guilds call` a third of its time;
    its output is flushed first, and nothing registered to run at exit is
    guilds'.
    """
    code = main()
    flushed = _flush()
    os._exit(code if flushed is None else flushed)


if __name__ == "__main__":
    run()
