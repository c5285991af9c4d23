"""The probe throttle: at most N probes per second across all nodes (Arvados MaxProbesPerSecond).

Probes are spaced evenly, 1/N seconds apart, in the order they ask; no bursts. N = 0
means unthrottled. The clock and sleep are injectable so the spacing is testable
without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

DEFAULT_MAX_PROBES_PER_SECOND = 10.0


class ProbeThrottle:
    """Hands out probe slots no closer together than 1 / ``max_per_second`` seconds."""

    def __init__(
        self,
        max_per_second: float = DEFAULT_MAX_PROBES_PER_SECOND,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_per_second < 0:
            raise ValueError("max probes per second must be >= 0 (0 = unthrottled)")
        self.max_per_second = max_per_second
        self._interval = 1.0 / max_per_second if max_per_second else 0.0
        self._clock = clock
        self._sleep = sleep
        self._next_slot = float("-inf")
        self.granted = 0
        self.waited_seconds = 0.0

    @property
    def unthrottled(self) -> bool:
        return self._interval == 0.0

    async def acquire(self) -> None:
        """Wait for this caller's slot. A cancelled waiter's slot is simply left unused."""
        self.granted += 1
        if self.unthrottled:
            return
        now = self._clock()
        slot = max(now, self._next_slot)
        self._next_slot = slot + self._interval
        delay = slot - now
        if delay > 0:
            self.waited_seconds += delay
            await self._sleep(delay)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        return None
