"""Fencing: may this replica act now, and with which token (pure; a monotonic clock in).

One `Leadership` per Lease (one Lease per dispatcher today; one per shard once
WorkerNodes are sharded: each shard's actions ask their own shard's `Leadership`).
The reasoning is client-go's leader election, made explicit:

- **Valid by our own monotonic clock.** A renewal that succeeds makes leadership valid
  until `sent_at + duration - margin`, where `sent_at` is this replica's monotonic time
  taken *before* the renewal request was sent. The API server wrote the record after
  that moment, and a standby counts the Lease's duration from when *it* saw the record
  change (`LeaseWatch`), later still: so leadership ends here at least `margin` before
  any standby may take over, whatever the wall clocks of the two machines say. The
  margin absorbs clock-rate drift and the time between a check and its action's bytes
  leaving the process.
- **A standby never reads the holder's `renewTime`.** `LeaseWatch` keeps when this
  replica last saw the Lease record change (its resourceVersion); the Lease is free
  only once it has not changed for the record's own `leaseDurationSeconds` by the
  standby's monotonic clock (or when the holder released it).
- **A stall is a step-down.** `beat()` is called by a heartbeat task several times per
  margin; if the gap between two beats -- or between the last beat and a check --
  exceeds the margin, the event loop stalled long enough that an action checked before
  the stall could leave after leadership ended: the replica steps down (for good: the
  process restarts as a standby) before acting further.
- **Tokens.** While valid, `check()` returns the `FenceToken`: the Lease name and its
  `leaseTransitions` as this replica wrote them. Targets that can compare tokens refuse
  a lower one (the runner contract; `status.fence` of the objects nodewarden writes,
  with a CEL transition rule). BMCs and clouds cannot: there this local check and
  persist-before-send are the fence (docs/security.md).

`Unfenced` is the fence of a process without leader election (one replica by
configuration): always valid, no token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

Monotonic = Callable[[], float]


class NotLeader(Exception):
    """This replica may not act now; the message says why (never retried by the caller:
    the replica is stepping down)."""


@dataclass(frozen=True, slots=True)
class FenceToken:
    """The token an action carries: `value` is the Lease's `leaseTransitions` as the
    writer holds it, comparable only with tokens of the same `lease`."""

    lease: str
    value: int


class Fence(Protocol):
    """What an action port asks before it acts (`Leadership` or `Unfenced`)."""

    def check(self, action: str) -> FenceToken | None:
        """The token to act with now (None: no token to carry); raises NotLeader."""

    def rejected(self, by: str) -> None:
        """A target refused our token: it has seen a newer one (a newer leader acted)."""


class Unfenced:
    """No leader election: always allowed, no token."""

    def check(self, action: str) -> FenceToken | None:
        return None

    def rejected(self, by: str) -> None:
        log.error("%s refused a write as fenced although leader election is disabled", by)


class Leadership:
    """Whether this replica holds one Lease now, by its own monotonic clock (see module)."""

    def __init__(
        self,
        lease: str,
        duration: float,
        margin: float,
        clock: Monotonic = time.monotonic,
    ) -> None:
        if not 0 < margin < duration:
            raise ValueError(f"margin {margin} must be within (0, lease duration {duration})")
        self.lease = lease
        self.duration = duration
        self.margin = margin
        self.clock = clock
        self.valid_until: float | None = None
        self.transitions: int | None = None
        self.lost_reason: str | None = None
        self._last_beat: float | None = None
        self._on_lost: list[Callable[[str], None]] = []

    # -- the elector's side -------------------------------------------------------------

    def renewed(self, sent_at: float, transitions: int) -> None:
        """A write of the Lease, sent at monotonic time `sent_at`, succeeded."""
        if self.lost_reason is not None:
            return  # a step-down is final for this process
        until = sent_at + self.duration - self.margin
        if self.valid_until is None or until > self.valid_until:
            self.valid_until = until
        self.transitions = transitions
        if self._last_beat is None:
            self._last_beat = self.clock()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` once when leadership ends (expiry seen, stall, token)."""
        self._on_lost.append(callback)

    def step_down(self, reason: str, clean: bool = False) -> None:
        """End leadership now (idempotent); tells every `on_lost` callback once. `clean`:
        given up on purpose (a release), logged as information rather than an error."""
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        self.valid_until = None
        log.log(
            logging.INFO if clean else logging.ERROR,
            "leadership of lease %s ends: %s",
            self.lease,
            reason,
        )
        for callback in self._on_lost:
            callback(reason)

    def rejected(self, by: str) -> None:
        self.step_down(f"{by} has seen a newer fencing token than ours ({self.transitions})")

    def beat(self) -> None:
        """The heartbeat: the event loop is running. A gap above the margin is a stall."""
        now = self.clock()
        self._stalled(now)
        if self.lost_reason is None:
            self._last_beat = now

    def _stalled(self, now: float) -> bool:
        if self._last_beat is None or self.lost_reason is not None:
            return False
        gap = now - self._last_beat
        if gap > self.margin:
            self.step_down(
                f"the event loop stalled for {gap:.1f}s (more than the {self.margin:.1f}s "
                "margin): an action checked before the stall could leave after the Lease "
                "expired"
            )
            return True
        return False

    # -- the actions' side --------------------------------------------------------------

    def remaining(self) -> float:
        """Seconds of validity left now (0 when not valid)."""
        if self.valid_until is None or self.lost_reason is not None:
            return 0.0
        return max(0.0, self.valid_until - self.clock())

    @property
    def valid(self) -> bool:
        return self.remaining() > 0

    def check(self, action: str) -> FenceToken:
        """The token for `action` now; NotLeader when leadership is not valid (an expiry
        seen here also steps down: nothing of this process acts again)."""
        now = self.clock()
        self._stalled(now)
        if self.lost_reason is not None:
            raise NotLeader(f"{action} not sent: {self.lost_reason}")
        if self.valid_until is None or self.transitions is None:
            raise NotLeader(f"{action} not sent: lease {self.lease} is not held")
        if now >= self.valid_until:
            self.step_down(
                f"lease {self.lease} not renewed in time (valid until {self.valid_until:.1f}, "
                f"now {now:.1f} on this replica's monotonic clock)"
            )
            raise NotLeader(f"{action} not sent: {self.lost_reason}")
        return FenceToken(self.lease, self.transitions)


class LeaseWatch:
    """A standby's view of someone else's Lease: when the record last changed, by the
    standby's own monotonic clock (client-go's `observedTime`)."""

    def __init__(self, clock: Monotonic = time.monotonic) -> None:
        self.clock = clock
        self._version: str | None = None
        self._changed_at: float | None = None

    def seen(self, version: str | None) -> None:
        """The record as just read (its resourceVersion); a new version restarts the count."""
        if version != self._version or self._changed_at is None:
            self._version = version
            self._changed_at = self.clock()

    def expired(self, duration: float) -> bool:
        """True once the record has not changed for `duration` seconds since we saw it
        change. A record never seen is not expired: it has to be watched first."""
        if self._changed_at is None:
            return False
        return self.clock() - self._changed_at >= duration

    @property
    def changed_at(self) -> float | None:
        """When the record was last seen change (this replica's monotonic clock); None:
        never seen."""
        return self._changed_at

    def forget(self) -> None:
        self._version = None
        self._changed_at = None
