"""The informer's retry back-off: exponential, capped, jittered downwards, reset on success."""

from __future__ import annotations

import pytest

from nodewarden.kube.backoff import Backoff


def test_delays_double_up_to_the_cap_and_reset() -> None:
    b = Backoff(0.5, 4.0, rand=lambda: 0.0)
    assert [b.next_delay() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.failures == 6
    b.reset()
    assert b.next_delay() == 0.5


def test_jitter_only_shortens_by_at_most_the_jitter_fraction() -> None:
    low = Backoff(1.0, 8.0, jitter=0.5, rand=lambda: 0.999999)
    assert [round(low.next_delay(), 3) for _ in range(3)] == [0.5, 1.0, 2.0]


def test_many_failures_do_not_overflow() -> None:
    b = Backoff(0.1, 30.0, rand=lambda: 0.0)
    for _ in range(5000):
        delay = b.next_delay()
    assert delay == 30.0


@pytest.mark.parametrize(
    ("initial", "maximum", "multiplier", "jitter"),
    [(0, 1, 2, 0.5), (2, 1, 2, 0.5), (1, 2, 0.5, 0.5), (1, 2, 2, 1.0)],
)
def test_nonsense_settings_are_refused(
    initial: float, maximum: float, multiplier: float, jitter: float
) -> None:
    with pytest.raises(ValueError, match="back-off"):
        Backoff(initial, maximum, multiplier=multiplier, jitter=jitter)
