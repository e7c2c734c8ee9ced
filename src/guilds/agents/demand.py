"""How many agents a template's warm pool holds: its target, from the demand.

    target(made_at, now, pool) -> int      pure: the make times of the template, now, its settings

A fixed-size pool is empty whenever creates come faster than it refills, so the
target follows the demand, as the field sizes its warm pools (an autoscaler
over the claim rate, with a floor, a ceiling and a stabilization window before
scaling down):

- **the demand** at a moment is the number of agents of the template made
  (taken from the pool or made without it) in the ``window_seconds`` before it;
- **the raw target** is ``spare`` plus the demand, at most ``max``;
- **the target** is the highest raw target of the last ``cool_down_seconds``:
  it rises with the first make and falls only once the raw target has been
  lower for the whole cool-down.

The raw target only rises at a make, so its highest value over the cool-down
is found by looking at the cool-down's start, at each make within it, and at
``now``. After a burst the target so holds for the window, then the cool-down.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..config.templates import PoolSettings


def made_within(made_at: Sequence[float], start: float, end: float) -> int:
    """How many of made_at (sorted) lie in (start, end]."""
    return bisect.bisect_right(made_at, end) - bisect.bisect_right(made_at, start)


def target(made_at: Sequence[float], now: float, pool: PoolSettings) -> int:
    """The pool's target at now (made_at: the template's make times, sorted; older ones may be there)."""
    if not pool.on:
        return 0
    window, since = pool.window_seconds, now - pool.cool_down_seconds
    demand = max(made_within(made_at, at - window, at) for at in (since, now))
    first = 0
    for last, at in enumerate(made_at):  # the demand just after each make of the cool-down
        if at > now:
            break
        while made_at[first] <= at - window:
            first += 1
        if at >= since:
            demand = max(demand, last - first + 1)
    return min(pool.max, pool.spare + demand)


def kept_since(now: float, pool: PoolSettings) -> float:
    """The oldest make time the target can still need: older ones may be forgotten."""
    return now - pool.cool_down_seconds - pool.window_seconds
