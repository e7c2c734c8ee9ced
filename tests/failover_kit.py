"""Agents calling through the Service while a replica is killed every few seconds: the one
code of the failover test (tests/test_failover.py) and its bench (bench/failover_bench.py).

The MCP endpoint serves the servers' own agent (``agent.id``), so the agents here
are runs of it (``_meta["guilds/run"]``), sharing its one sandbox. Each makes its
calls one after another through the MCP SDK's client on the Service, every call
with a key of its own (``_meta["guilds/call-key"]``) and a token of its own that
its command appends to the run's file in the sandbox (``FILES``): a call whose
connection breaks is sent again, with the same key, on a new connection (the
Service hands it to the next replica). One call in ten is long (``sleep``
LONG_SECONDS first) and one in ten a background command (its token appended
after BACKGROUND_SECONDS). A ``Killer`` thread SIGKILLs the serve process of one
ready replica, in turn, every ``every`` seconds, from the host (the container's
pid 1 ignores a SIGKILL sent from inside), while at least two are ready.

``check`` then counts: tokens from the files (a token twice is a call run
twice), and each key's call as the run record holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import deploy_kit

CALL_KEY, RUN_KEY = "guilds/call-key", "guilds/run"
FILES = "/home/agent/failover"
LONG_SECONDS = 3
BACKGROUND_SECONDS = 2
LOST_MARK = ": lost: the process running this call ended before it finished"
RETRY_PAUSE_SECONDS = 0.05
TLS = ssl.create_default_context()
"""One TLS context for every client this process makes: httpx makes one per client unless given
(its trust store read again, 36 ms of CPU that blocks the loop), and a kill sends several clients
to connect again at once."""
READ_TIMEOUT_SECONDS = 60


@dataclass
class Call:
    run: str
    n: int
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempts: int = 0
    sent_at: float | None = None
    """time.time() of its first attempt."""
    tries: list[float] = field(default_factory=list)
    """time.time() of each attempt's start, and of each break."""
    broken_at: float | None = None
    """time.time() of its first broken attempt (the replicas' clock: the same node's)."""
    answered_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """The answer's ``_meta["guilds/meta"]``."""
    given: dict[str, Any] | None = None
    """Its arguments, when not a token's command (a reading call)."""
    text: str = ""
    is_error: bool = False

    @property
    def token(self) -> str:
        return f"{self.run}-{self.n}"

    @property
    def kind(self) -> str:
        return "background" if self.n % 10 == 4 else "long" if self.n % 10 == 8 else "quick"

    @property
    def lost(self) -> bool:
        return self.is_error and LOST_MARK in self.text

    @property
    def in_flight(self) -> bool:
        """Its connection broke while a replica ran it (the call began before the break), not
        before it reached one (a connection to a replica already dead)."""
        started = self.meta.get("started_at")
        return self.broken_at is not None and isinstance(started, str) and \
            datetime.fromisoformat(started).timestamp() < self.broken_at

    @property
    def failover(self) -> float | None:
        """Seconds from its first broken attempt to its answer, for a call in flight then."""
        return self.answered_at - self.broken_at if self.in_flight and self.answered_at and self.broken_at else None

    @property
    def rerouted(self) -> float | None:
        """Seconds from its first broken attempt to its start on a replica, for a call whose
        first attempts reached none."""
        if self.broken_at is None or self.in_flight or not self.answered_at:
            return None
        return self.answered_at - self.broken_at - self.meta.get("duration_ms", 0) / 1000

    @property
    def failover_parts(self) -> tuple[float, float] | None:
        """Its failover in two: its first break to the start of the attempt that was answered
        (the reconnection), and that attempt to its answer (the call repeated)."""
        if self.failover is None or not self.tries or self.answered_at is None or self.broken_at is None:
            return None
        last = self.tries[-1]
        return last - self.broken_at, self.answered_at - last

    def arguments(self) -> dict[str, Any]:
        if self.given is not None:
            return self.given
        if self.n < 0:  # the run's first call: its folder
            return {"command": f"mkdir -p {FILES}"}
        append = f"echo {self.token} >> {FILES}/{self.run}.tokens"
        if self.kind == "background":
            return {"command": f"sleep {BACKGROUND_SECONDS}; {append}", "background": True}
        if self.kind == "long":
            return {"command": f"sleep {LONG_SECONDS}; {append}; echo long"}
        return {"command": f"{append}; echo quick"}


@contextlib.asynccontextmanager
async def connected(url: str, token: str, mode: str = "auto",
                    read_timeout: float = READ_TIMEOUT_SECONDS) -> AsyncIterator[Client]:
    """An MCP SDK client on url's endpoint (a connection of its own: the Service's next replica).
    A broken connection cancels the block and is raised at its end, an ExceptionGroup.
    mode: the SDK's (a protocol version already negotiated: no discovery round trip)."""
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30, verify=TLS) as http, \
            Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode,
                   read_timeout_seconds=read_timeout) as client:
        yield client


async def make_calls(url: str, token: str, calls: list[Call], give_up_at: float) -> list[Call]:
    """The calls in order on one client, a new one after a break (pinned to the protocol
    version the first negotiated), a broken call sent again with its key until it is answered."""
    done, mode = 0, "auto"
    while done < len(calls):
        try:
            async with connected(url, token, mode) as client:
                mode = client.protocol_version or mode
                while done < len(calls):
                    await _answered(client, calls[done])
                    done += 1
        except Exception:  # a broken connection: the SDK's ExceptionGroup, httpx's errors
            if done == len(calls):
                break
            call = calls[done]
            call.broken_at = call.broken_at or time.time()
            call.tries.append(-time.time())
            if time.monotonic() > give_up_at:
                raise
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
    return calls


async def _answered(client: Client, call: Call) -> None:
    call.attempts += 1
    call.sent_at = call.sent_at or time.time()
    call.tries.append(time.time())
    result = await client.call_tool("shell", call.arguments(), meta={CALL_KEY: call.key, RUN_KEY: call.run})
    call.answered_at = time.time()
    call.meta = (result.meta or {}).get("guilds/meta", {})
    call.text = "".join(getattr(block, "text", "") for block in result.content)
    call.is_error = bool(result.is_error)


async def agent(url: str, token: str, run: str, calls: int, give_up_at: float) -> list[Call]:
    """One run's calls, one after another, after the one making its folder."""
    made = await make_calls(url, token, [Call(run, -1), *(Call(run, n) for n in range(calls))], give_up_at)
    return made[1:]


class Killer:
    """Every ``every`` seconds (the first after half of it), SIGKILL the serve process of the next
    ready replica (from the host), while at least ``keep`` replicas are ready; ``kills`` holds
    (time.monotonic(), pod)."""

    def __init__(self, deployment: deploy_kit.Deployment, every: float, keep: int = 2):
        self.deployment, self.every, self.keep = deployment, every, keep
        self.kills: list[tuple[float, str]] = []
        self.skipped = 0
        self._stop = threading.Event()
        self._turn = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        wait = self.every / 2  # the first half a period in: a short storm sees one too
        while not self._stop.wait(wait):
            wait = self.every
            with contextlib.suppress(Exception):  # a kubectl hiccup: the next turn tries again
                self._kill_one()

    def _kill_one(self) -> None:
        ready = self.deployment.ready_pods()
        if len(ready) < self.keep:
            self.skipped += 1
            return
        pod = ready[self._turn % len(ready)]
        self._turn += 1
        pid = deploy_kit.host_pid(pod)
        if pid is None:
            self.skipped += 1
            return
        os.kill(pid, signal.SIGKILL)
        self.kills.append((time.monotonic(), pod["metadata"]["name"]))


async def storm(deployment: deploy_kit.Deployment, agents: int, calls: int, every: float,
                give_up_seconds: float = 900) -> tuple[list[Call], Killer, float]:
    """agents runs of calls each through the Service while the Killer kills every ``every`` s:
    the calls, the killer, the seconds it took."""
    prefix = f"fo{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    give_up_at = started + give_up_seconds
    with Killer(deployment, every) as killer:
        done = await asyncio.gather(*(agent(deployment.route.url, deployment.token, f"mcp-{prefix}-{i:02d}",
                                            calls, give_up_at) for i in range(agents)))
    return [c for run in done for c in run], killer, time.monotonic() - started


# --- what happened ------------------------------------------------------------------------
async def tokens_in_files(deployment: deploy_kit.Deployment, runs: list[str]) -> tuple[Counter[str], list[str]]:
    """Every token the runs' files hold, counted (read through the Service, after the
    background commands had time to end), and the first lines of each reading's answer."""
    await asyncio.sleep(BACKGROUND_SECONDS + 1)
    readers = [Call(f"{run}-check", 0, given={"command": f"cat {FILES}/{run}.tokens"}) for run in runs]
    await make_calls(deployment.route.url, deployment.token, readers, time.monotonic() + 300)
    tokens = Counter(line for reader in readers for line in reader.text.splitlines()
                     if line.startswith(reader.run.removesuffix("-check") + "-"))
    return tokens, [f"{reader.run}: {reader.text[:160]!r}" for reader in readers]


async def recorded(database_url: str, keys: list[str]) -> dict[str, tuple[str, bool]]:
    """Each key's call as the run record holds it: (status, is_error)."""
    import asyncpg

    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT k.key, c.status, c.is_error FROM call_keys k JOIN calls c "
                                "ON c.run_id = k.run_id AND c.seq = k.seq WHERE k.key = ANY($1::text[])", keys)
    finally:
        await conn.close()
    return {row["key"]: (row["status"], row["is_error"]) for row in rows}


async def calls_per_run(database_url: str, runs: list[str]) -> dict[str, tuple[int, int]]:
    """Each run's (calls, keys) in the record: a call without its key's row would be one made twice."""
    import asyncpg

    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT c.run_id, count(*) AS calls, count(k.key) AS keys FROM calls c "
                                "LEFT JOIN call_keys k ON k.run_id = c.run_id AND k.seq = c.seq "
                                "WHERE c.run_id = ANY($1::text[]) GROUP BY c.run_id", runs)
    finally:
        await conn.close()
    return {row["run_id"]: (row["calls"], row["keys"]) for row in rows}


@dataclass
class Counts:
    made: int
    answered: int
    lost: int
    errors: list[str]
    """Answers that are neither a result nor the lost error."""
    ran_twice: list[str]
    not_run: list[str]
    """Answered (not lost) calls whose token is not in the files."""
    wrong_status: list[str]
    """Calls the record holds otherwise than their answer says."""
    broken: int
    failovers: list[float]
    """Of the calls in flight on a replica that died: their first broken attempt to their answer."""
    rerouted: list[float]
    """Of the calls whose first attempts reached no replica: their first broken attempt to their start."""
    quick: list[float]
    """Of the quick calls no break touched: their time, the replicas' load."""
    kills: int
    parts: list[tuple[float, float]] = field(default_factory=list)
    """Of the failovers: (the reconnection, the call repeated), ``Call.failover_parts``."""
    readings: list[str] = field(default_factory=list)
    """The start of each run's file as read at the end (shown when a token is missing)."""

    @staticmethod
    def percentile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0

    def lines(self) -> list[str]:
        made = (f"calls made {self.made}, answered {self.answered}, lost errors {self.lost}, other errors "
                f"{len(self.errors)}, run twice {len(self.ran_twice)}, answered but not run {len(self.not_run)}, "
                f"recorded otherwise {len(self.wrong_status)}")
        fail = (f"replicas killed {self.kills}; calls with a broken connection {self.broken}: "
                f"{len(self.failovers)} in flight on the replica that died, failover (broken connection to answer) "
                f"{_spread(self.failovers)}; {len(self.rerouted)} that reached no replica first, to their start "
                f"elsewhere {_spread(self.rerouted)}")
        shown = [made, fail, f"the {len(self.quick)} quick calls no break touched, each: {_spread(self.quick)}"]
        if self.parts:
            shown.append(f"of the failovers, the reconnection: {_spread([p[0] for p in self.parts])}; "
                         f"the call repeated: {_spread([p[1] for p in self.parts])}")
        for name, items in (("other errors", self.errors), ("run twice", self.ran_twice),
                            ("recorded otherwise", self.wrong_status)):
            shown += [f"{name}, the first: {item}" for item in items[:3]]
        if self.not_run:
            shown += [f"answered but not run, e.g. {', '.join(self.not_run[:3])}; the files read:",
                      *self.readings[:3]]
        return shown



async def check(deployment: deploy_kit.Deployment, calls: list[Call], killer: Killer) -> Counts:
    runs = sorted({c.run for c in calls})
    tokens, readings = await tokens_in_files(deployment, runs)
    held = await recorded(deployment.database_url, [c.key for c in calls])
    errors = [f"{c.token}: {c.text[:200]}" for c in calls if c.is_error and not c.lost]
    ran_twice = [token for token, n in tokens.items() if n > 1]
    not_run = [c.token for c in calls if not c.is_error and tokens[c.token] != 1]
    wrong = [f"{c.token}: {held.get(c.key)}" for c in calls if held.get(c.key) != _status_of(c)]
    return Counts(made=len(calls), answered=sum(not c.is_error for c in calls), lost=sum(c.lost for c in calls),
                  errors=errors, ran_twice=ran_twice, not_run=not_run, wrong_status=wrong,
                  broken=sum(c.broken_at is not None for c in calls),
                  failovers=[f for c in calls if (f := c.failover) is not None],
                  rerouted=[r for c in calls if (r := c.rerouted) is not None], kills=len(killer.kills),
                  readings=readings, parts=[p for c in calls if (p := c.failover_parts) is not None],
                  quick=[c.answered_at - c.sent_at for c in calls
                         if c.kind == "quick" and c.broken_at is None and c.answered_at and c.sent_at])


def _spread(values: list[float]) -> str:
    return (f"p50 {Counts.percentile(values, 0.5):.3f} s, p99 {Counts.percentile(values, 0.99):.3f} s, "
            f"max {max(values, default=0):.3f} s, mean {statistics.fmean(values or [0]):.3f} s")


def _status_of(call: Call) -> tuple[str, bool]:
    return ("lost", True) if call.lost else ("done", call.is_error)
