"""The E2B sandboxes one ``guilds serve --e2b`` holds, mapped onto the agent it serves.

An E2B sandbox is one run of the agent (run id ``e2b-<sandbox id>``) on the agent's
own guilds sandbox, with one ``guilds-code envd`` of its own (its commands, its
environment variables). Its calls are recorded in that run like any other's
(``guilds.fronts.e2b.recording``). It belongs to the key that created it.

Lifetime: ``timeout`` seconds from its start, or from the last ``set_timeout`` or
connect; then it is killed as by ``DELETE /sandboxes/{id}``. Pause ends its
commands and keeps its files (the agent's home, which every backend keeps);
resume (connect) starts its process service again.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ...errors import GuildsError
from ...limits import E2B_ENVD_VERSION
from ...sandbox.base import Sandbox
from ...toolbox import Toolbox
from . import own_sandbox
from .connect import ConnectError
from .envd_channel import EnvdChannel
from .network_options import Entries
from .recording import Recorder

RUNNING, PAUSED = "running", "paused"


@dataclass
class E2BSandbox:
    id: str
    key_name: str
    template: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    access_token: str
    started_at: datetime
    end_at: datetime
    sandbox: Sandbox
    """The guilds sandbox its commands run in: the agent's own, or one of its own (``own_sandbox``)."""
    network: Entries = None
    """The network it asked for (``network_options.asked``): None, the agent's."""
    state: str = RUNNING
    envd: EnvdChannel | None = None
    timer: asyncio.TimerHandle | None = None
    recorder: Recorder | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return f"e2b-{self.id}"

    def created(self, client_id: str) -> dict[str, Any]:
        """The Sandbox body of a create or connect answer."""
        return {"sandboxID": self.id, "templateID": self.template, "clientID": client_id,
                "envdVersion": E2B_ENVD_VERSION, "envdAccessToken": self.access_token, "domain": None}

    def listed(self, client_id: str) -> dict[str, Any]:
        """The ListedSandbox / SandboxDetail body."""
        return {"sandboxID": self.id, "templateID": self.template, "alias": self.template, "clientID": client_id,
                "startedAt": _iso(self.started_at), "endAt": _iso(self.end_at), "cpuCount": 1, "memoryMB": 512,
                "diskSizeMB": 1024, "state": self.state, "envdVersion": E2B_ENVD_VERSION,
                "metadata": self.metadata, "envdAccessToken": self.access_token,
                **({} if self.network is None else
                   {"network": {"allowOut": list(self.network), "denyOut": ["0.0.0.0/0"]}})}


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class Sandboxes:
    """Every E2B sandbox of this server, by id; each request names its key."""

    def __init__(self, toolbox: Toolbox, client_id: str, data_dir: str | None = None):
        """data_dir: the data folder, where sandboxes of their own keep their files (none: not made)."""
        self.toolbox, self.client_id, self.data_dir = toolbox, client_id, data_dir
        self._all: dict[str, E2BSandbox] = {}

    def templates(self) -> tuple[str, ...]:
        """The template names served: E2B's default ``base`` and the agent's id, both the agent."""
        return ("base", self.toolbox.settings.id)

    async def create(self, key_name: str, template: str, timeout: int, metadata: dict[str, str],
                     env_vars: dict[str, str], network: Entries = None) -> E2BSandbox:
        if template not in self.templates():
            raise ConnectError("not_found", f"template '{template}' not found: this server serves "
                                            f"{' and '.join(repr(t) for t in self.templates())}")
        now, box_id = datetime.now(UTC), "i" + secrets.token_hex(10)
        sandbox = own_sandbox.sandbox_for(self.toolbox.sandbox, self.toolbox.settings, network, self.data_dir, box_id)
        box = E2BSandbox(id=box_id, key_name=key_name, template=template, metadata=metadata,
                         env_vars=env_vars, access_token=secrets.token_urlsafe(32), started_at=now,
                         end_at=now + timedelta(seconds=timeout), sandbox=sandbox, network=network)
        box.recorder = Recorder(self.toolbox, box.run_id)
        try:
            box.envd = await EnvdChannel.open(box.sandbox)
        except BaseException:
            with contextlib.suppress(GuildsError):  # the first failure is the one to tell
                await self._remove_own(box)
            raise
        self._all[box.id] = box
        self.set_timeout(box, timeout)
        return box

    def get(self, key_name: str | None, sandbox_id: str) -> E2BSandbox:
        """The sandbox of that id when that key made it; else not_found, as for no sandbox at all."""
        box = self._all.get(sandbox_id)
        if box is None or (key_name is not None and box.key_name != key_name):
            raise ConnectError("not_found", f"sandbox '{sandbox_id}' not found")
        return box

    def of_key(self, key_name: str) -> list[E2BSandbox]:
        return [box for box in self._all.values() if box.key_name == key_name]

    def set_timeout(self, box: E2BSandbox, seconds: int) -> None:
        if box.timer is not None:
            box.timer.cancel()
        box.end_at = datetime.now(UTC) + timedelta(seconds=seconds)
        loop = asyncio.get_running_loop()
        box.timer = loop.call_later(seconds, lambda: loop.create_task(self.kill(box)))

    async def kill(self, box: E2BSandbox) -> None:
        """End its commands (their groups: SIGTERM, then SIGKILL) and forget it."""
        if self._all.pop(box.id, None) is None:
            return
        if box.timer is not None:
            box.timer.cancel()
        await self._stop_envd(box)
        await self._remove_own(box)

    async def _remove_own(self, box: E2BSandbox) -> None:
        """A sandbox of its own stopped and its files removed (the agent's is left as it is)."""
        if box.sandbox is not self.toolbox.sandbox and self.data_dir is not None:
            await own_sandbox.remove(box.sandbox, self.data_dir)

    async def pause(self, box: E2BSandbox) -> None:
        if box.state == PAUSED:
            raise ConnectError("failed_precondition", f"sandbox '{box.id}' is already paused")
        if box.timer is not None:  # a paused sandbox waits to be resumed, as E2B's does
            box.timer.cancel()
        await self._stop_envd(box)
        box.state = PAUSED

    async def resume(self, box: E2BSandbox, timeout: int) -> bool:
        """Running again, for timeout seconds from now; True when it was paused."""
        was_paused = box.state == PAUSED
        if was_paused:
            box.envd = await EnvdChannel.open(box.sandbox)
            box.state = RUNNING
        self.set_timeout(box, timeout)
        return was_paused

    async def _stop_envd(self, box: E2BSandbox) -> None:
        envd, box.envd = box.envd, None
        if envd is None:
            return
        with contextlib.suppress(ConnectError):
            await envd.call("stop_all")
        await envd.close()

    async def close(self) -> None:
        """The server stops: every sandbox is killed."""
        for box in list(self._all.values()):
            await self.kill(box)
