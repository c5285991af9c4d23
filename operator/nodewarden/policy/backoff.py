"""Retry back-off with deterministic jitter.

    backoff_delay(attempt, policy, seed) -> timedelta

delay = min(maxBackoff, initialBackoff * multiplier^(attempt-1)), then scaled by a
jitter factor in [1 - jitter, 1 + jitter] and clamped to [0, maxBackoff]. The jitter
is not random: it is derived from sha256(seed, attempt), where the seed is the
transition id, so the same transition and attempt always wait the same time (the core
stays a pure function) while different transitions spread out.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from nodewarden.policy.view import PolicyView


def jitter_fraction(seed: str, attempt: int) -> float:
    """A deterministic number in [0, 1) from the seed and the attempt number."""
    digest = hashlib.sha256(f"{seed}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def backoff_delay(attempt: int, policy: PolicyView, seed: str) -> timedelta:
    """Delay before retry number `attempt` (1 = first retry)."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    initial = policy.initial_backoff.total_seconds()
    maximum = policy.max_backoff.total_seconds()
    exponent = min(attempt - 1, 1000)
    try:
        base = initial * policy.backoff_multiplier**exponent
    except OverflowError:
        base = maximum
    base = min(base, maximum)
    factor = 1.0 + policy.backoff_jitter * (2.0 * jitter_fraction(seed, attempt) - 1.0)
    seconds = min(max(base * factor, 0.0), maximum)
    return timedelta(seconds=seconds)
