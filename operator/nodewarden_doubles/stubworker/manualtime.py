"""`ManualTime`: a monotonic clock and a ``sleep`` that a test moves by hand.

Give it to a `StubWorker` as ``clock`` and ``sleep``: the worker's ``--watch`` heartbeats
and its containers' ends then happen when the test calls `advance`, so ten simulated
minutes of heartbeats take milliseconds and are counted, not timed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class ManualTime:
    """Seconds that pass only in `advance`; `sleep` returns once they have."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(0.0, seconds), next(self._order), future))
        await future

    @property
    def sleeping(self) -> int:
        """Sleeps still waiting (cancelled ones are not counted)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> int:
        """Move the time on by `seconds`, waking every sleep due by then (in due order);
        returns how many woke. The woken tasks run at the caller's next await."""
        target = self.now + seconds
        woken = 0
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, due)
            if not future.done():
                future.set_result(None)
                woken += 1
        self.now = target
        return woken
