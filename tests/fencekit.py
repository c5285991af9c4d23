"""Helpers for the fencing tests: a fake monotonic clock and a held `Leadership`."""

from __future__ import annotations

from nodewarden.fence import Leadership


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def run(self, seconds: float, lead: Leadership, step: float = 1.0) -> None:
        """Let `seconds` pass with the heartbeat beating every `step` (no stall)."""
        end = self.now + seconds
        while self.now < end:
            self.now = min(self.now + step, end)
            lead.beat()


def held(token: int, clock: Clock, lease: str = "nodewarden-alpha") -> Leadership:
    """A leadership of `lease` renewed just now (duration 15 s, margin 5 s)."""
    lead = Leadership(lease, 15.0, 5.0, clock=clock)
    lead.renewed(clock.now, token)
    return lead
