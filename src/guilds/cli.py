"""`guilds`: the user's commands. Fronts only translate; the toolbox does the work.

    guilds call TOOL 'JSON ARGS' [--home DIR] [--run ID] [--config FILE] [--json]
    guilds tools [--format anthropic|openai|mcp]
    guilds serve ... / guilds mcp ...   (not available yet)

Exit codes: 0 when the call was made (its result printed, also an error
result: a failed command, a missing file, an exhausted budget); 2 for bad
input (usage, JSON arguments, a run id, the settings file); 1 for any other
failure of guilds itself.
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
from .settings import AgentSettings, data_dir, default_settings_file, load_settings
from .toolbox.tools import FORMATS, TOOL_NAMES, export, tool_specs

LATER = ("serve", "mcp")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
    tools = sub.add_parser("tools", help="print the tool definitions as JSON")
    tools.add_argument("--format", choices=sorted(FORMATS), default="anthropic")
    for name in LATER:  # the contract's options, so that they parse; the lead fills these in
        later = sub.add_parser(name, help="not available yet")
        later.add_argument("--home")
        later.add_argument("--sandbox")
        if name == "serve":
            later.add_argument("--port", type=int)
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


def _settings(opts: argparse.Namespace, data: Path, env: Mapping[str, str]) -> AgentSettings:
    path = Path(opts.config) if opts.config else default_settings_file(data)
    settings = load_settings(path, env)
    if opts.home:
        settings = dataclasses.replace(settings, home=Path(opts.home).expanduser().resolve())
    return settings


async def _call(opts: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    from .sandbox import get_sandbox
    from .store import Store, database_url
    from .toolbox import Toolbox

    args = parse_args_json(opts.args)
    data = data_dir(env)
    data.mkdir(parents=True, exist_ok=True)
    settings = _settings(opts, data, env)
    sandbox = get_sandbox(settings, data)
    async with Store(database_url(data, env)) as store:
        result = await Toolbox(settings, sandbox, store).call(opts.run or new_run_id(), opts.tool, args)
    return {"text": result.text, "is_error": result.is_error, "meta": result.meta}


def _run_call(opts: argparse.Namespace, env: Mapping[str, str]) -> int:
    result = asyncio.run(_call(opts, env))
    if opts.json:
        print(json.dumps(result, ensure_ascii=False, indent=2))
    else:
        print(result["text"])
    return EXIT_OK


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    opts = _parser().parse_args(argv)
    env = os.environ if env is None else env
    try:
        if opts.command == "tools":
            print(json.dumps(export(tool_specs(), opts.format), ensure_ascii=False, indent=2))
            return EXIT_OK
        if opts.command in LATER:
            print(f"guilds {opts.command}: not available yet in this build", file=sys.stderr)
            return EXIT_USAGE
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
