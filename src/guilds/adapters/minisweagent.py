"""A mini-swe-agent environment whose commands run through guilds' ``shell``.

    from guilds.adapters.minisweagent import GuildsEnvironment
    env = GuildsEnvironment(settings="agent.toml")      # or environment_class:
    agent = DefaultAgent(model, env, **agent_config)     # "guilds.adapters.minisweagent.GuildsEnvironment"
    agent.run(task)
    env.close()

Every action is one ``shell`` call of one run (``env.run_id``): sandboxed,
shaped, redacted, counted against the budget, recorded and shown in the app.
The observation's ``output`` is the result text the model of any other front
reads (a long output keeps its start and end and names its log; it ends with
``remaining_tool_calls: N``); ``returncode`` is the command's exit code.
Unlike mini-swe-agent's own environments, a ``cd`` carries over to the next
action, as the working directory of the run does.

An action whose output starts with the line
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` and that exits 0 submits the rest of
the output (without the ``remaining_tool_calls`` trailer), as mini-swe-agent's
environments do. A call guilds refuses (bad arguments, an exhausted budget)
comes back with ``returncode`` -1 and the reason in ``exception_info``.

Config (keyword arguments, or the ``environment`` section of mini-swe-agent's
config): ``settings`` (a settings file; default the data folder's), ``data_dir``,
``overrides`` (checked settings keys), ``run_id`` (default a new one),
``timeout`` (seconds per command, 1-600, default 120).
"""

from __future__ import annotations

import asyncio
import platform
import re
import threading
from typing import Any

from minisweagent.exceptions import Submitted
from pydantic import BaseModel

from ..limits import MINISWEAGENT_TIMEOUT_SECONDS_DEFAULT

SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_TRAILER = re.compile(r"\nremaining_tool_calls: \d+\Z")
_EXIT_LINE = re.compile(r"\nexit_code: -?\d+\Z")


class GuildsEnvironmentConfig(BaseModel):
    settings: str | None = None
    data_dir: str | None = None
    overrides: dict[str, Any] = {}
    run_id: str = ""
    timeout: int = MINISWEAGENT_TIMEOUT_SECONDS_DEFAULT


def body(text: str) -> str:
    """The command's own output: the result text without the trailer and the exit_code line."""
    return _EXIT_LINE.sub("", _TRAILER.sub("", text))


class GuildsEnvironment:
    """mini-swe-agent's Environment protocol over a guilds agent, on an event loop of its own."""

    def __init__(self, *, config_class: type = GuildsEnvironmentConfig, **kwargs: Any):
        import guilds

        self.config = config_class(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="guilds-env", daemon=True)
        self._thread.start()
        agent = guilds.open(self.config.settings, data_dir=self.config.data_dir, overrides=self.config.overrides)
        self._agent = self._wait(agent.__aenter__())
        self._run = self._agent.run(self.config.run_id or None)

    @property
    def run_id(self) -> str:
        return self._run.id

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run action["command"] with guilds' shell; cwd, when given, is entered first."""
        command = action.get("command", "")
        if cwd:
            command = f"cd {_quote(cwd)} && {command}"
        args = {"command": command, "timeout_seconds": timeout or self.config.timeout}
        result = self._wait(self._run.call("shell", args))
        if result.is_error:
            output = {"output": "", "returncode": -1, "exception_info": result.text}
        else:
            output = {"output": result.text, "returncode": result.meta.get("exit_code", -1), "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = body(output["output"]).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **platform.uname()._asdict(), "run_id": self.run_id, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {
            "environment": {**self.config.model_dump(mode="json"), "run_id": self.run_id},
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
        }}}

    def close(self) -> None:
        """Close the run record and the loop (the sandbox is left to its idle stop)."""
        if self._loop.is_closed():
            return
        self._wait(self._agent.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"
