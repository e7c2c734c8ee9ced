"""How a shell command is started, for the foreground shell op and a background start alike.

The environment (the helper's own plus COMMAND_ENV, GUILD_RUN_ID,
GUILD_AGENT_ID, and GH_TOKEN set to the token of the repository whose folder
holds the working directory, unset elsewhere; behind the egress proxy, the proxy
variables naming the call), bash started in its own session
with stdin /dev/null and stderr with stdout, the log opened without following a
link, and a command too long for one argv string written to a file and sourced.
"""

from __future__ import annotations

import errno
import os

from . import limits, proc, protocol, reach, runstate
from .escaped import CALL_KEY_ENV

EXEC_ENV = "GUILDS_EXEC_ID"
"""The orchestrator's token on the exec that runs this helper (``guilds.sandbox._container.EXEC_ENV``):
when that exec ends, every process carrying it is stopped (the kubernetes backends' resident
helper, ``ending_argv``). A background command drops it (``background_env``): it is the sandbox's."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional

COMMAND_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "DEBIAN_FRONTEND": "noninteractive",
    # Nothing may stop to ask: stdin is closed and there is no terminal, so a
    # prompt would only sit until the timeout. Each names the non-asking answer.
    "GIT_EDITOR": "true",  # commit, merge, tag messages: keep git's default message
    "GIT_SEQUENCE_EDITOR": "true",  # rebase -i: run the todo list as written
    "EDITOR": "true",  # crontab -e, gh, anything else that opens $EDITOR
    "VISUAL": "true",  # the same, for programs that ask $VISUAL first
    "GIT_ASKPASS": "echo",  # a git credential prompt gets an empty answer and fails
    "SSH_ASKPASS": "echo",  # the same for ssh, when it would use askpass at all...
    "SSH_ASKPASS_REQUIRE": "never",  # ...which it never does: it fails instead of asking
    "PIP_NO_INPUT": "1",  # pip fails rather than asking (credentials, confirmations)
    "npm_config_yes": "true",  # npx and npm init install or proceed without asking
}
EGRESS_PROXY_ENV = "GUILDS_EGRESS_PROXY"
"""host:port of the egress relay inside the sandbox, set by the orchestrator when
agent.network is a list (docs/network.md)."""
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
PWD_FD = 87
"""The descriptor the shell writes its final directory to: high, so a command's own
`exec 3>...` (or flock's 9) does not take it."""
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_SHELL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-")


def repo_token(cwd: str, tokens: Dict[str, str]) -> Optional[str]:
    """The token of the deepest repository folder holding cwd (whole path
    components compared, each folder also as its links resolve), or None."""
    best, best_len = None, -1
    for folder, token in tokens.items():
        for candidate in {folder, os.path.realpath(folder)}:
            if _holds(candidate, cwd) and len(candidate) > best_len:
                best, best_len = token, len(candidate)
    return best


def _holds(folder: str, path: str) -> bool:
    try:
        return os.path.commonpath([folder, path]) == folder
    except ValueError:
        return False


def command_env(request: protocol.Request, cwd: str, tokens: Dict[str, str]) -> Dict[str, str]:
    """The environment a command runs with (see the module docstring)."""
    env = dict(os.environ)
    env.pop(CALL_KEY_ENV, None)  # only a foreground call's own processes carry one
    env.update(COMMAND_ENV)
    env["GUILD_RUN_ID"] = request.run_id
    env["GUILD_AGENT_ID"] = request.agent_id
    token = repo_token(cwd, tokens)
    if token is None:
        env.pop("GH_TOKEN", None)
    else:
        env["GH_TOKEN"] = token
    if env.get(EGRESS_PROXY_ENV):
        _egress_env(env, request, cwd)
    return env


def _egress_env(env: Dict[str, str], request: protocol.Request, cwd: str) -> None:
    """Behind the egress proxy: the proxy variables name the call (their user is
    ``<run id>/<call id>``, which the proxy records each decision under; git is told to
    send it at once), and a
    repository on a GitHub host other than github.com gets GH_HOST and
    GH_ENTERPRISE_TOKEN, which gh reads for such a host."""
    name_call_in_proxy(env, request.run_id, request.call_id)
    host = repo_token(cwd, runstate.load_repo_gh_hosts(request))
    if host is not None and "GH_TOKEN" in env:
        env["GH_HOST"] = host
        env["GH_ENTERPRISE_TOKEN"] = env["GH_TOKEN"]


def background_env(request: protocol.Request, cwd: str, tokens: Dict[str, str]) -> Dict[str, str]:
    """A background command's environment: command_env without the exec's token, so the end of
    the exec that started it (its orchestrator gone) does not stop it."""
    env = command_env(request, cwd, tokens)
    env.pop(EXEC_ENV, None)
    return env


def name_call_in_proxy(env: Dict[str, str], run_id: str, call_id: str) -> None:
    """The proxy variables' user: ``<run id>/<call id>`` (the proxy records each decision
    under it); git is told to send it at once. Both ids are safe names
    ([A-Za-z0-9._-]): only the slash is quoted."""
    url = f"http://{run_id}%2F{call_id}:@{env[EGRESS_PROXY_ENV]}"
    for name in PROXY_VARS:
        env[name] = url
    env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"  # else git waits for a 407 to send the proxy user


def start_bash(argv: List[str], cwd: str, env: Dict[str, str], stdout: int, pwd_fd: Optional[int] = None) -> proc.Child:
    """Start argv (bash) in cwd in its own session, stdin /dev/null, stderr with
    stdout, and pwd_fd (when given) as PWD_FD."""
    passed = None if pwd_fd is None else (pwd_fd, PWD_FD)
    try:
        return proc.spawn(argv, env, stdout=stdout, stderr=proc.STDOUT, cwd=cwd, session=True, pass_fd=passed)
    except OSError as exc:
        raise protocol.OpError(f"cannot start bash in {cwd}: {_why_not_started(exc, cwd, env)}") from None


def _why_not_started(exc: OSError, cwd: str, env: Dict[str, str]) -> str:
    if exc.errno == errno.EAGAIN:
        from .pidlimit import why_not_started  # only when a fork failed

        return why_not_started(exc)
    return reach.why(exc, cwd, env.get("HOME"))


def open_log(path: str) -> int:
    """Open (truncate) a log for writing, refusing a link in its place."""
    try:
        return os.open(path, _LOG_FLAGS, 0o600)
    except OSError as exc:
        raise protocol.OpError(f"cannot write the log {path}: {exc.strerror}") from None


def quote(word: str) -> str:
    """word as one bash word: shlex.quote, without importing shlex (and re)."""
    if not word:
        return "''"
    if _SHELL_SAFE.issuperset(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command_script(command: str, spill_path: str) -> str:
    """What to give `bash -c`: the command itself, or, when it would not fit in
    one argv string, `. FILE` after writing it to spill_path."""
    data = command.encode("utf-8", "surrogateescape")
    if len(data) <= limits.COMMAND_ARGV_MAX:
        return command
    try:
        runstate.atomic_write(spill_path, data)
    except OSError as exc:
        raise protocol.OpError(f"cannot write the command to {spill_path}: {exc.strerror}") from None
    return f". {quote(spill_path)}"
