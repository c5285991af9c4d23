"""Long loops on the event loop give it a turn.

One asyncio loop carries every probe, watch, write and the Lease renewal; a loop over the
whole fleet that never suspends holds all of them up (a first power round over 10,000
new nodes is seconds of CPU, and a stall longer than the Lease margin ends leadership,
`fence.py`). `Turns.share()` is awaited once per item of such a loop: it suspends (one
`asyncio.sleep(0)`) once `budget` seconds have passed since the last turn, so a loop
costs at most one extra loop iteration per budget and others wait at most about a budget
for theirs. Code between two `share()` calls must leave shared state consistent: others
run there. A loop may stay whole while it is short (`after` items): its interleaving is
then exactly what it was, and only a big pass (a start-up, a fleet-wide change) is split.
"""

from __future__ import annotations

import asyncio
import time

BUDGET = 0.02
"""Seconds a loop may hold the event loop between turns (20 ms: at most 50 turns a
second of a fully busy loop)."""


class Turns:
    """A budget of loop time for one pass of a long loop."""

    __slots__ = ("_since", "_whole", "budget", "taken")

    def __init__(self, budget: float = BUDGET, after: int = 0) -> None:
        self.budget = budget
        self._since = time.monotonic()
        self._whole = after
        self.taken = 0

    async def share(self) -> None:
        """Suspend once the budget since the last turn is spent (never within the first
        `after` items of the pass)."""
        if self._whole > 0:
            self._whole -= 1
            return
        if time.monotonic() - self._since >= self.budget:
            await asyncio.sleep(0)
            self.taken += 1
            self._since = time.monotonic()
