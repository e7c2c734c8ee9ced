"""`guilds`: the user's commands. Fronts only translate; the toolbox does the work.

    guilds call TOOL 'JSON ARGS' [--home DIR] [--run ID] [--config FILE] [--json] [--context-reset]
    guilds tools [--format anthropic|openai|mcp]
    guilds serve [--home DIR] [--port N] [--host H] [--allow-host NAME] [--no-token] [--sandbox NAME] [--config FILE]
    guilds mcp [--home DIR] [--sandbox NAME] [--config FILE]
    guilds sandbox image [--tag T] [--base B] [--rootfs TAR] [--no-install]

Exit codes: 0 when the call was made (its result printed, also an error
result: a failed command, a missing file, an exhausted budget); 2 for bad
input (usage, JSON arguments, a run id, the settings file); 1 for any other
failure of guilds itself (one line: a full disk names what it could not
write); 128 + N when signal N (SIGTERM, SIGINT, SIGHUP) stopped the call: its
command's group stopped, the call recorded as cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import BadInput, ConfigError, GuildsError
from .private import private_dir
from .settings import AgentSettings, coding_flag, data_dir, default_settings_file, load_settings
from .toolbox.tools import FORMATS, TOOL_NAMES, export, tool_specs

SERVERS = ("serve", "mcp")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_SIGNAL = 128
"""Stopped by signal N: exit 128 + N, as a shell reports it."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="guilds", description="Code tools for coding agents.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    call = sub.add_parser("call", help="make one tool call through the whole pipeline")
    call.add_argument("tool", help=f"one of {', '.join(TOOL_NAMES)}")
    call.add_argument("args", nargs="?", default="{}", help="the arguments, a JSON object")
    call.add_argument("--home", help="the agent's home (overrides agent.home)")
    call.add_argument("--run", help="the run id (default: a new run)")
    call.add_argument("--config", help="the settings file (default: <data folder>/settings.toml)")
    call.add_argument("--json", action="store_true", help='print {"text", "is_error", "meta"}')
    call.add_argument("--context-reset", action="store_true",
                      help="the model's context was compacted or rewound: no file_read points before this call")
    tools = sub.add_parser("tools", help="print the tool definitions as JSON")
    tools.add_argument("--format", choices=sorted(FORMATS), default="anthropic")
    helps = {"serve": "the app at http://127.0.0.1:PORT/ and the MCP endpoint at /mcp",
             "mcp": "the tools as an MCP server on stdio"}
    for name in SERVERS:
        server = sub.add_parser(name, help=helps[name])
        server.add_argument("--home", help="the agent's home (overrides agent.home)")
        server.add_argument("--sandbox", help="local | bwrap | docker | kubernetes | auto (overrides agent.sandbox)")
        server.add_argument("--config", help="the settings file (default: <data folder>/settings.toml)")
        if name == "serve":
            server.add_argument("--port", type=int, default=8765, help="default 8765")
            server.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
            server.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                                help="also answer this Host name (a name this machine is reached by)")
            server.add_argument("--no-token", action="store_true",
                                help="serve without the token (a loopback --host only)")
    box = sub.add_parser("sandbox", help="sandbox images")
    box.add_argument("action", choices=["image"], help="image: build the docker sandbox image")
    box.add_argument("rest", nargs=argparse.REMAINDER, help="the image builder's options (--help)")
    return parser


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
    return f"cli-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def _settings_path(opts: argparse.Namespace, data: Path) -> Path:
    return Path(opts.config) if opts.config else default_settings_file(data)


def _settings(opts: argparse.Namespace, data: Path, env: Mapping[str, str]) -> AgentSettings:
    settings = load_settings(_settings_path(opts, data), env)
    if opts.home:
        settings = dataclasses.replace(settings, home=Path(opts.home).expanduser().resolve())
    return settings


async def _call(opts: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    from .sandbox import get_sandbox
    from .store import Store, database_url
    from .toolbox import Toolbox

    args = parse_args_json(opts.args)
    data = private_dir(data_dir(env))
    settings = _settings(opts, data, env)
    sandbox = get_sandbox(settings, data)
    async with Store(database_url(data, env)) as store:
        result = await Toolbox(settings, sandbox, store).call(opts.run or new_run_id(), opts.tool, args,
                                                             context_reset=opts.context_reset)
    return {"text": result.text, "is_error": result.is_error, "meta": result.meta}


def _run_call(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    from .lifecycle import Stopped, until_stopped

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


def _run_server(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    data = private_dir(data_dir(env))
    settings = _settings(opts, data, env)
    coding = coding_flag(_settings_path(opts, data))
    if opts.command == "mcp":
        from .mcp_server import run_stdio

        run_stdio(settings, data, sandbox=opts.sandbox, coding=coding, env=env)
        return EXIT_OK
    from .serve import serve

    try:
        asyncio.run(serve(settings, data, opts.host, opts.port, opts.sandbox, coding=coding, env=env,
                          no_token=opts.no_token, allow_hosts=tuple(opts.allow_host)))
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    env = os.environ if env is None else env
    try:
        if opts.command == "tools":
            print(json.dumps(export(tool_specs(), opts.format), ensure_ascii=False, indent=2))
            return EXIT_OK
        if opts.command in SERVERS:
            return _run_server(opts, env)
        if opts.command == "sandbox":
            from .sandbox.image import main as image_main

            return image_main(opts.rest)
        return _run_call(opts, env)
    except (ConfigError, BadInput) as exc:
        print(f"guilds: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except GuildsError as exc:
        print(f"guilds: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # `guilds tools | head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
