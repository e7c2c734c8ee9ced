"""A call sent again with its key: answered once, by whichever process is asked.

    await held_answer(store, agent_id, key) -> CallResult
    KeyOfAnotherRun(key, held_run, run)         BadInput: the key names a call of another run

``Toolbox.call(..., key=CallKey(principal, key))`` runs a call whose key the
record does not hold; one it holds (``record.call_keys``) runs nothing, and
``held_answer`` answers it:

- the call ended (done or cancelled): its recorded answer, the same text
  (the body and its trailer) and metadata as it was first answered;
- it still runs in a live process (this one, or another server on the record):
  its row is read every CALL_KEY_POLL_SECONDS until it ends, and the process
  running it asked every CALL_KEY_PROBE_SECONDS whether it still runs
  (``owners.is_gone_now``, at once the first time);
- that process ended (its server was killed): its running calls are recorded
  ``lost`` then and there, and the answer is the one-line error ``LOST_KEYED``,
  saying whether the call's request had been sent to the sandbox (its command
  may have run) or not (nothing ran);
- it was lost before: the same error.
"""

from __future__ import annotations

import asyncio
import time

from ..errors import BadInput, RecordError
from ..limits import CALL_KEY_POLL_SECONDS, CALL_KEY_PROBE_SECONDS
from ..record.call_keys import CallKey, Keyed
from ..record.owners import is_gone_now, machine_id
from ..record.statements import utc_now
from ..record.store import Store
from ..record.values import call_fields
from .results import CallResult

LOST_KEYED = ("call key {key!r}: lost: the process running this call ended before it finished (it was killed "
              "or its machine stopped); {sent}")
SENT = "its request had been sent to the sandbox, so its command may have run"
NOT_SENT = "its request had not been sent to the sandbox: nothing ran"


class KeyOfAnotherRun(BadInput):
    """The key names a call of another run than the one the call is of."""

    def __init__(self, key: str, held_run: str, run_id: str):
        super().__init__(f"call key {key!r} names a call of run {held_run!r}, not {run_id!r}; "
                         "a key names one call: send a new call with a new key")
        self.held_run = held_run


async def held_answer(store: Store, agent_id: str, key: CallKey) -> CallResult:
    """The answer of the call key names, once it has one (see the module docstring)."""
    asked_at = None
    while True:
        found = await store.keyed_call(agent_id, key)
        if found is None:
            raise RecordError(f"the run record no longer holds call key {key.key!r}")
        if found.call.status != "running":
            return _answer(key, found)
        owner = found.owner_id
        due = asked_at is None or time.monotonic() - asked_at >= CALL_KEY_PROBE_SECONDS
        if owner is not None and owner != store.owner.id and due:
            asked_at = time.monotonic()
            if found.owner is None or await is_gone_now(found.owner, utc_now(), machine_id(), asked=True):
                await _swept(store, owner)
                continue
        await asyncio.sleep(CALL_KEY_POLL_SECONDS)


_sweeping: dict[tuple[int, str], asyncio.Future] = {}
"""The sweeps under way in this process, by store and owner."""


async def _swept(store: Store, owner: str) -> None:
    """The owner's running calls recorded lost: one sweep at a time in this process, which every
    call of that owner sent again here awaits (a replica's death sends several at once, and
    their sweeps of the same rows would wait for one another's locks)."""
    at = (id(store), owner)
    sweep = _sweeping.get(at)
    if sweep is None:
        sweep = _sweeping[at] = asyncio.ensure_future(store.sweep_owners([owner]))
        sweep.add_done_callback(lambda _: _sweeping.pop(at, None))
    await asyncio.shield(sweep)


def _answer(key: CallKey, found: Keyed) -> CallResult:
    call = found.call
    if call.status == "lost":
        fields = call_fields(call.call_id, call.tool, call.run_id, call.seq, call.started_at,
                             call.duration_ms or 0, call.row or "")
        return CallResult(LOST_KEYED.format(key=key.key, sent=SENT if found.sent else NOT_SENT), True,
                          {**fields, "lost": True, "sent": found.sent})
    return CallResult(call.text or "", call.is_error, dict(call.meta or {}))
