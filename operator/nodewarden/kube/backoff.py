"""Capped exponential back-off with random jitter, for loops that retry the API server.

    delay(n) = min(maximum, initial * multiplier**(n - 1)) * (1 - jitter * u),  u in [0, 1)

`n` counts consecutive failures since the last `reset()`. The random source is passed in
so tests can pin it. (Power requests use `nodewarden.policy.backoff`, whose jitter is
deterministic per transition; this one spreads replicas that retry the same server.)
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.5,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"back-off needs 0 < initial <= maximum, got {initial} and {maximum}")
        if multiplier < 1 or not 0 <= jitter < 1:
            raise ValueError(
                f"back-off needs multiplier >= 1 and 0 <= jitter < 1: {multiplier}, {jitter}"
            )
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._rand = rand
        self.failures = 0

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        exponent = min(self.failures - 1, 64)
        base = min(self.maximum, self.initial * self.multiplier**exponent)
        return base * (1.0 - self.jitter * self._rand())

    def reset(self) -> None:
        self.failures = 0
