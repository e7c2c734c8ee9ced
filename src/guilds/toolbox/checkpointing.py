"""Checkpoints and rewind for one agent, on the path of its calls.

    AgentCheckpoints(toolbox, data_dir)
    .around(run_id, seq, call_id, moments)  the call gate, and the call's checkpoints (the hook)
    .take(name)                             a checkpoint by name
    .rewind(run_id, seq)                    the run's files as they were before call seq
    .rewind_to(name)                        the files as the named checkpoint kept them

With ``agent.checkpoints`` on, a call of a tool that may change files is preceded
by a checkpoint of the home ("before"), and code_task's has one at its end too
("after"): each tool says which (``Tool.checkpoint_moments``). Each checkpoint is
recorded in the run record under its call. A checkpoint that cannot be taken (a
full disk) refuses the call in one line (CheckpointError), and the call runs
nothing; one that fails at code_task's end loses only itself.

A rewind waits for the sandbox's running calls to end and keeps new ones out
(``guilds.checkpoints.call_gate``), stops the agent's background commands (their
status says ``stopped (by a rewind to before call N)``), puts the files back, and
records in the run that the reads of calls N and later no longer stand, so the
next read of such a file returns content, never a pointer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, AsyncIterator

from ..checkpoints.call_gate import CallGate
from ..checkpoints.point_store import Checkpoint, CheckpointError, CheckpointStore
from ..limits import REWIND_STOP_WAIT_SECONDS
from .tools.shell_tools import SHELL_STATUS

if TYPE_CHECKING:
    from ..record.store import Store
    from .toolbox import Toolbox

_LISTED = re.compile(r"^(b\d+) (?:running|stopping) ", re.MULTILINE)
REWIND_REASON = "by a rewind to before call {seq}"
META_BEFORE, META_AFTER = "checkpoint", "checkpoint_after"
"""The call's metadata keys: the ids of the checkpoints taken before it and at its end."""


@dataclass(frozen=True)
class Rewound:
    """What a rewind did."""

    checkpoint: str
    changed: int
    """Paths written or removed."""
    stopped: tuple[str, ...]
    """The background commands stopped first."""

    def line(self, run_id: str, seq: int) -> str:
        stopped = f"; stopped {', '.join(self.stopped)}" if self.stopped else ""
        return f"rewound run {run_id} to before call {seq} ({self.checkpoint}): {self.changed} paths restored{stopped}"


class AgentCheckpoints:
    """One agent's checkpoints: its store in the data folder, its gate, its run record."""

    def __init__(self, toolbox: Toolbox, data_dir: str | os.PathLike):
        self.toolbox = toolbox
        self.settings = toolbox.settings
        self.record: Store = toolbox.store
        self.files = CheckpointStore.of_agent(data_dir, self.settings.id, self.settings.home)
        self.gate = CallGate(self.files.root)

    @contextlib.asynccontextmanager
    async def around(self, run_id: str, seq: int, call_id: str,
                     moments: tuple[str, ...]) -> AsyncIterator[dict[str, str]]:
        """Hold the gate while the call runs; its checkpoints (the tool's moments) when
        agent.checkpoints is on. Gives a dict that holds, once the block has ended, the
        ids taken: ``checkpoint`` (before), ``checkpoint_after``: the call's metadata."""
        moments = moments if self.settings.checkpoints else ()
        kept: dict[str, str] = {}
        async with self.gate.call():
            if "before" in moments:
                kept[META_BEFORE] = (await self._take(run_id=run_id, seq=seq, call_id=call_id, moment="before")).id
            yield kept
            if "after" in moments:
                with contextlib.suppress(CheckpointError):
                    point = await self._take(run_id=run_id, seq=seq, call_id=call_id, moment="after")
                    kept[META_AFTER] = point.id

    async def take(self, name: str) -> Checkpoint:
        """A checkpoint of the home now, by name, between calls."""
        async with self.gate.call():
            return await self._take(name=name, moment="named")

    async def _take(self, *, call_id: str | None = None, **about) -> Checkpoint:
        before = {p.id for p in self.files.points()}
        point = await asyncio.to_thread(self.files.take, max_count=self.settings.checkpoints_max_count,
                                        max_bytes=self.settings.checkpoints_max_size, **about)
        kept = {p.id for p in self.files.points()}
        row = {"id": point.id, "agent_id": self.settings.id, "run_id": point.run_id, "seq": point.seq,
               "call_id": call_id, "moment": point.moment, "name": point.name,
               "at": datetime.fromtimestamp(point.at, UTC), "files": point.files,
               "bytes": point.bytes, "status": "kept"}
        from ..errors import RecordError

        with contextlib.suppress(RecordError):  # the record full: the checkpoint itself is kept
            await self.record.add_checkpoint(row)
            await self.record.mark_checkpoints_pruned(before - kept)
        return point

    def point_before(self, run_id: str, seq: int) -> Checkpoint:
        point = self.files.find(run_id=run_id, seq=seq, moment="before")
        if point is None:
            held = sorted({p.seq for p in self.files.points() if p.run_id == run_id and p.seq is not None})
            shown = ", ".join(map(str, held)) or "none"
            raise CheckpointError(f"no checkpoint before call {seq} of run {run_id} is kept "
                                  f"(only shell and code_task calls take one; calls with one: {shown})")
        return point

    async def rewind(self, run_id: str, seq: int) -> Rewound:
        """The run's files as before call seq (its "before" checkpoint)."""
        point = self.point_before(run_id, seq)
        async with self.gate.alone():
            stopped = await self._stop_background(run_id, seq)
            changed = await asyncio.to_thread(self.files.rewind, point.id)
            await self.record.mark_rewind(run_id, seq, datetime.now(UTC))
        return Rewound(point.id, changed, stopped)

    async def rewind_to(self, name: str) -> Rewound:
        """The home as the named checkpoint kept it (no run's reads are forgotten)."""
        point = self.files.find(name=name)
        if point is None:
            raise CheckpointError(f"no checkpoint named {name!r} is kept for agent {self.settings.id}")
        async with self.gate.alone():
            stopped = await self._stop_background("rewind", 0)
            changed = await asyncio.to_thread(self.files.rewind, point.id)
        return Rewound(point.id, changed, stopped)

    async def _status(self, run_id: str, args: dict) -> str:
        from .toolbox import new_call_id

        request = self.toolbox.request(SHELL_STATUS.name, args, run_id=run_id, call_id=new_call_id())
        envelope = await self.toolbox.send(request, wait=REWIND_STOP_WAIT_SECONDS, rerunnable=not args.get("stop"))
        if not envelope["ok"]:
            raise CheckpointError(f"cannot stop the background commands: {envelope['error']}")
        return str(envelope["text"])

    async def _stop_background(self, run_id: str, seq: int) -> tuple[str, ...]:
        """Stop every background command still running; each one's status says why."""
        from ..errors import NoAnswer

        try:
            running = _LISTED.findall(await self._status(run_id, {}))
            for bid in running:
                await self._status(run_id, {"id": bid, "stop": True})
                stop_file = posixpath.join(self.toolbox.sandbox.state_dir, self.settings.id, "background",
                                           f"{bid}.stop")
                await self.toolbox.sandbox.write_file(stop_file, REWIND_REASON.format(seq=seq).encode())
        except NoAnswer as exc:
            raise CheckpointError(f"cannot stop the background commands: {exc}") from None
        return tuple(running)
