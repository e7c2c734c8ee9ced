"""The processes that record calls, and the calls a process that died left behind.

    Owner.of_this_process()        who records a call: this process, on this machine
    is_gone(owner, now, here)      whether a recorded owner is known to have ended
    await is_gone_now(owner, now, here, asked)   the same, asking a server that said where it answers
    Lease(store).start()/stop()    the heartbeat and sweep task of an open Store

**Lost calls.** Every process that opens the run record registers itself as an
owner (a random id, the machine, its pid and the pid's start time) and refreshes
its ``heartbeat_at`` every OWNER_HEARTBEAT_SECONDS; every call it begins names it. An
owner is gone when, on this machine (same boot and pid namespace), its pid is no
longer the process that started at ``pid_start``; from elsewhere, when its
heartbeat is older than OWNER_LEASE_SECONDS (a crash, a power loss), or, for a
server that said where it answers (``address``: a replica's pod), when asking it
(``record.liveness``) finds another process there or none, or no answer comes and
its heartbeat is older than OWNER_SILENT_SECONDS (``is_gone_now``): a replica
killed is found gone within a beat by the sweep, at once by a call that names a
call of it again (``guilds.toolbox.keyed_calls``). At every open and
every heartbeat, the calls still ``running`` under a gone owner are recorded
``lost`` (an error, "· lost" on their row) and the owner is forgotten. Their
commands do not outlive the owner: its helpers get SIGTERM when it dies
(PR_SET_PDEATHSIG in the spawn path) and stop their commands' groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from ..limits import OWNER_HEARTBEAT_SECONDS, OWNER_LEASE_SECONDS, OWNER_PROBE_AFTER_SECONDS, OWNER_SILENT_SECONDS
from ..procfs import start_time
from .liveness import GONE, UNKNOWN, probe

LOST = "the process running this call ended before the call finished (it was killed or its machine stopped)"
"""The result text of a lost call."""
BOOT_ID = "/proc/sys/kernel/random/boot_id"
log = logging.getLogger(__name__)


def machine_id() -> str:
    """This machine's boot, host name and pid namespace: where a pid names the same process."""
    try:
        with open(BOOT_ID) as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "no-boot-id"
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = "no-pid-ns"
    return f"{socket.gethostname()}/{boot}/{pid_ns}"[:160]


@dataclass(frozen=True)
class Owner:
    """One process that records calls."""

    id: str
    machine: str
    pid: int
    pid_start: int
    heartbeat_at: datetime | None = None
    address: str | None = None
    """Where the process answers whether it still runs (``record.liveness``); None: not asked."""

    @classmethod
    def of_this_process(cls) -> "Owner":
        pid = os.getpid()
        return cls(uuid.uuid4().hex, machine_id(), pid, start_time(pid) or 0)


def is_gone(owner: Owner, now: datetime, here: str) -> bool:
    """Known to have ended: on this machine, its pid is another process or none; else, a stale heartbeat."""
    if owner.machine == here:
        return start_time(owner.pid) != owner.pid_start
    return owner.heartbeat_at is None or now - owner.heartbeat_at > timedelta(seconds=OWNER_LEASE_SECONDS)


async def is_gone_now(owner: Owner, now: datetime, here: str, asked: bool = False) -> bool:
    """is_gone, or an owner with an address that says it ended (asked always when ``asked``, else
    once its heartbeat is older than OWNER_PROBE_AFTER_SECONDS), or does not answer and beats no more."""
    if is_gone(owner, now, here):
        return True
    if owner.machine == here or not owner.address or owner.heartbeat_at is None:
        return False
    silent = now - owner.heartbeat_at
    if not asked and silent <= timedelta(seconds=OWNER_PROBE_AFTER_SECONDS):
        return False
    said = await probe(owner.address, owner.id)
    return said is GONE or (said is UNKNOWN and silent > timedelta(seconds=OWNER_SILENT_SECONDS))


class Beating(Protocol):
    """What a Lease keeps alive: an open Store."""

    async def heartbeat(self) -> None: ...

    async def sweep_lost(self) -> list[tuple[str, int]]: ...


class Lease:
    """The background task of an open Store: a heartbeat, then a sweep, every OWNER_HEARTBEAT_SECONDS.

    A failing write (a full disk, the database away) is logged once per kind of
    failure and tried again at the next beat; it never ends the process.
    """

    def __init__(self, store: Beating, every: float = OWNER_HEARTBEAT_SECONDS):
        self.store, self.every = store, every
        self._task: asyncio.Task | None = None
        self._reported: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._beat())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.store.heartbeat()
                await self.store.sweep_lost()
            except Exception as exc:  # any database failure: the next beat tries again
                self._report(exc)

    def _report(self, exc: Any) -> None:
        kind = type(exc).__name__
        if kind not in self._reported:
            self._reported.add(kind)
            log.warning("the run record's heartbeat could not be written: %s", exc)
