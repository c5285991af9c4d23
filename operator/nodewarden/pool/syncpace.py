"""When the pool lists the cloud next: fast while something is outstanding, slow at rest.

The Arvados dispatcher lists its cloud every `SyncInterval` (1 min) and sooner when it
has just created or destroyed something. Here, after a list at `last_listed`:

- nothing listed yet: at once;
- a create or destroy outstanding (asked for and not yet confirmed by a list) or a
  takeover pending: `sync_interval` (fast) after the last list;
- at rest: `sync_interval_at_rest` (slow, never shorter than the fast one) after it;
- an instance of another dispatcher whose takeover comes due before that: at that time
  (but not sooner than the fast interval after the last list).

A list asked for (`request_sync`: the power controller wants fresh evidence) is not a
pace: the caller lists at once. Pure: the caller reads the clock and the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class SyncPace:
    """The two intervals (`sync_interval`, `sync_interval_at_rest`)."""

    fast: timedelta
    at_rest: timedelta

    @classmethod
    def of_seconds(cls, fast: float, at_rest: float) -> SyncPace:
        return cls(timedelta(seconds=fast), timedelta(seconds=max(fast, at_rest)))


def next_sync_at(
    last_listed: datetime | None,
    *,
    outstanding: bool,
    takeover_due: datetime | None,
    pace: SyncPace,
) -> datetime | None:
    """When to list next (None: at once); see the module docstring."""
    if last_listed is None:
        return None
    at = last_listed + (pace.fast if outstanding else pace.at_rest)
    if takeover_due is not None:
        at = min(at, max(takeover_due, last_listed + pace.fast))
    return at


def sync_due(
    now: datetime,
    last_listed: datetime | None,
    *,
    outstanding: bool,
    takeover_due: datetime | None,
    pace: SyncPace,
) -> bool:
    """`next_sync_at` has come."""
    at = next_sync_at(last_listed, outstanding=outstanding, takeover_due=takeover_due, pace=pace)
    return at is None or now >= at
