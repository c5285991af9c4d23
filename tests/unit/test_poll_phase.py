"""The second BMC read of each node is spread over the poll interval by name."""

from __future__ import annotations

from nodewarden.power.runtime import poll_phase


def test_phases_stay_within_the_interval_and_spread_a_fleet() -> None:
    names = [f"side-{i:05d}" for i in range(1000)]
    phases = [poll_phase(n) for n in names]
    assert all(0.5 <= p < 1.0 for p in phases)
    assert poll_phase("side-00001") == poll_phase("side-00001")  # stable across calls
    # a fleet's reads land in every tenth of the spread, none with more than twice its share
    buckets = [0] * 10
    for p in phases:
        buckets[int((p - 0.5) * 20)] += 1
    assert min(buckets) > 50 and max(buckets) < 200
